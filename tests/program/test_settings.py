"""The typed settings tree: generated defaults, one validation, old names."""

import dataclasses
import importlib
import json
import pathlib
from unittest import mock

from absl import logging
import pytest

from configs import base
from tests.helpers import digits_config as _config
from tff_kd import errors
from tff_kd import hparams as hp
from tff_kd.core import distill_hparams
from tff_kd.methods import registry
from tff_kd.program import checkpoints
from tff_kd.program import settings


def test_base_config_is_the_tree():
  config = base.get_config()
  assert config.to_dict() == settings.default_config().to_dict()
  # Every section of the tree, and nothing else, is in the config.
  sections = {cls.SECTION for cls in settings.all_sections()}
  top = {f.name for f in hp.config_fields(settings.RunSettings)}
  assert set(config.keys()) == sections | top
  for cls in settings.all_sections():
    fields = {f.name for f in hp.config_fields(cls)}
    assert set(config[cls.SECTION].keys()) == fields | set(cls.ALIASES), cls


def test_a_section_is_valid_by_construction():
  # Checked once, when made: a builder never receives a bad section.
  with pytest.raises(errors.ConfigError, match='distill.steps must be'):
    distill_hparams.DistillConfig.plain(steps=0)
  with pytest.raises(errors.ConfigError, match='distill.steps must be'):
    distill_hparams.DistillConfig().replace(steps=0)
  with pytest.raises(errors.ConfigError, match='fedftg.iterations must be'):
    registry.get_method('fedftg').hparams(iterations=0)


def test_distill_defaults_have_one_home():
  # The record the TF code receives has the config's defaults; a key some
  # method has its own default for is unset (None) in the config.
  section = settings.default_config().distill.to_dict()
  record = distill_hparams.DistillConfig()
  recipes = {k for m in registry.METHODS.values() for k in m.distill_defaults}
  # FedFTG's, FedDF's and DaFKD's recipes.
  assert recipes == {'batch_size', 'temperature', 'student_training',
                     'kl_reduction', 'lr_decay', 'learning_rate',
                     'validation', 'eval_every'}
  # DaFKD's reference preset sets four keys no recipe has a default for.
  presets = {k.split('.', 1)[1] for cls in settings.method_sections()
             for k in cls.preset_keys() if k.startswith('distill.')}
  assert presets - recipes == {'steps', 'val_fraction', 'cosine_decay',
                               'clip_norm'}
  assert {k for k, v in section.items() if v is None} == recipes | presets
  unset = recipes | presets
  assert {k: getattr(record, k) for k in section if k not in unset} == {
      k: v for k, v in section.items() if k not in unset}
  assert record.seed == 0 and 'seed' not in section


@pytest.mark.parametrize('method,overrides,expected', [
    # Unset: the method's own default, else the section's.
    ('fedftg', {}, dict(batch_size=64, temperature=1.0, kl_reduction='mean',
                        lr_decay=0.998)),
    ('feddf', {}, dict(batch_size=128, temperature=1.0,
                       kl_reduction='batchmean', lr_decay=1.0,
                       learning_rate=1e-3, validation='auto',
                       student_training=True)),
    ('dafkd', {}, dict(learning_rate=0.01, temperature=20.0,
                       student_training=False, validation='pool')),
    # Set: the value, whichever method runs.
    ('fedftg', {'distill.batch_size': 128}, dict(batch_size=128)),
    ('feddf', {'distill.batch_size': 64}, dict(batch_size=64)),
    # FedFTG's old names move to `distill`.
    ('fedftg', {'fedftg.batch_size': 16, 'fedftg.lr_decay': 0.5},
     dict(batch_size=16, lr_decay=0.5, temperature=1.0)),
])
def test_a_method_runs_with_its_own_distill_defaults(method, overrides,
                                                      expected):
  tree = settings.from_config(_config(
      method=method, **{'server_data.proxy': 'split',
                        'server_data.proxy_size': 50}, **overrides))
  assert {k: getattr(tree.distill, k) for k in expected} == expected
  # The run folder records the values in force.
  recorded = tree.to_config().distill
  assert {k: recorded[k] for k in expected} == expected


@pytest.mark.parametrize('method', ['feddf', 'fedftg', 'dafkd', 'fedd3a'])
def test_the_drift_regime_leaves_every_method_its_own_recipe(method):
  # configs/dafkd_paper_cpu.py describes the regime: no distill key of any
  # method's recipe is set there (it once gave FedFTG DaFKD's T = 20, and
  # its student's SGD diverged).
  from configs import dafkd_paper_cpu  # pylint: disable=g-import-not-at-top
  config = dafkd_paper_cpu.get_config()
  recipes = {k for m in registry.METHODS.values() for k in m.distill_defaults}
  assert {k: config.distill[k] for k in recipes} == dict.fromkeys(recipes)
  config.method = method
  tree = settings.from_config(config)
  own = registry.get_method(method).distill_defaults
  assert {k: getattr(tree.distill, k) for k in own} == dict(own)


def test_a_moved_key_becomes_the_shared_one_for_its_method_only():
  # dafkd.weight_decay moved to client_optimizer.weight_decay.
  moved = settings.from_config(_config(
      method='dafkd', **{'dafkd.weight_decay': 1e-3,
                         'client_optimizer.name': 'adam'}))
  assert moved.client_optimizer.weight_decay == 1e-3
  other = settings.from_config(_config(
      method='fedavg', **{'dafkd.weight_decay': 1e-3}))
  assert other.client_optimizer.weight_decay == 0.0


@pytest.mark.parametrize('old,new', [
    ({'dafkd.no_correlation': True}, {'weighting': 'uniform'}),
    ({'dafkd.no_correlation': False}, {'weighting': 'discriminator'}),
    ({'dafkd.weights_on': 'logits'}, {'ensemble': 'logits'}),
    ({'fedgen.teacher_ensemble': 'logits'}, {'ensemble': 'logits'}),
    ({'runtime.fuse_clients': True}, {'client_execution': 'fused'}),
])
def test_old_key_names_are_read_under_the_new_ones(old, new):
  method = next(iter(old)).split('.')[0]
  method = {'runtime': 'fedavg'}.get(method, method)
  tree = settings.from_config(_config(method=method, **old))
  section = tree.runtime if method == 'fedavg' else tree.hparams
  assert {k: getattr(section, k) for k in new} == new


@pytest.mark.parametrize('method', sorted(registry.METHODS))
def test_every_method_validates_once_into_typed_sections(method):
  config = _config(method=method, **{'server_data.proxy': 'split',
                                     'server_data.proxy_size': 50})
  tree = settings.from_config(config)
  assert tree.method.name == method
  assert tree.run.rounds == config.rounds
  assert tree.distill.seed == config.seed
  assert tree.local.local_work().batch_size == config.local.batch_size
  if tree.method.hparams is None:
    assert tree.hparams is None
  else:
    assert isinstance(tree.hparams, tree.method.hparams)
    assert dataclasses.is_dataclass(tree.hparams)


@pytest.mark.parametrize('key,value,match', [
    ('seed', -1, r'^seed must be an integer >= 0, got -1$'),
    ('client_optimizer.learning_rate', -0.1,
     r'client_optimizer\.learning_rate must be a finite number > 0, got -0\.1'),
    ('client_optimizer.learning_rate', float('inf'),
     r'client_optimizer\.learning_rate must be a finite number > 0, got inf'),
    ('client_optimizer.lr_decay', 1.5,
     r'client_optimizer\.lr_decay must be in \(0, 1\], got 1\.5'),
    ('client_optimizer.name', 'rmsprop',
     r"client_optimizer\.name 'rmsprop' is unknown; choose one of sgd, adam"),
    ('server_optimizer.momentum', 1.0,
     r'server_optimizer\.momentum must be in \[0, 1\), got 1\.0'),
    ('keep_checkpoints', 0, r'keep_checkpoints must be an integer >= 1'),
    ('local.batch_size', 0, r'local\.batch_size must be an integer >= 1'),
    ('dataset.train_limit', -5,
     r'dataset\.train_limit must be an integer >= 0, got -5'),
    ('distill.steps', 0, r'distill\.steps must be an integer >= 1, got 0'),
    ('runtime.worker_timeout_s', 0.0,
     r'runtime\.worker_timeout_s must be a finite number > 0, got 0\.0'),
    ('runtime.workers', 'nohost', r"runtime\.workers: 'nohost' is not"),
])
def test_bad_values_are_named(key, value, match):
  config = _config(method='feddf', **{'server_data.proxy': 'split',
                                      'server_data.proxy_size': 50})
  with pytest.raises(errors.ConfigError, match=match):
    settings.from_config(settings.with_overrides(config, {key: value}))


def test_unknown_keys_are_refused_in_every_section():
  for key in ('nokey', 'dataset.nokey', 'fedgen.nokey'):
    config = _config()  # FedAvg: fedgen's section is not active.
    node = config
    *path, leaf = key.split('.')
    for part in path:
      node = node[part]
    with node.unlocked():
      node[leaf] = 1
    with pytest.raises(errors.ConfigError, match=f"'{key}' does not exist"):
      settings.from_config(config)


def test_old_names_are_read_with_a_warning(caplog):
  config = _config(method='dafkd', **{'dafkd.variant': 'paper',
                                      'dafkd.no_sharing': True})
  with caplog.at_level(logging.WARNING):
    tree = settings.from_config(config)
  assert tree.hparams.shared_extractor is False
  assert 'dafkd.no_sharing is renamed dafkd.shared_extractor' in caplog.text
  config = _config(method='feddf', **{
      'feddf.prototypes': 'cnn,cnn:group', 'server_data.proxy': 'split',
      'server_data.proxy_size': 50})
  assert settings.from_config(config).hparams.client_models == 'cnn,cnn:group'
  # An old name unset (None) is the new key's value.
  assert settings.from_config(_config(method='dafkd')).hparams.shared_extractor


def test_an_old_name_against_its_new_key_is_refused():
  config = _config(method='dafkd', **{'dafkd.variant': 'paper',
                                      'dafkd.no_sharing': True,
                                      'dafkd.shared_extractor': True})
  # shared_extractor=True is its default: the old name wins, no conflict.
  assert settings.from_config(config).hparams.shared_extractor is False
  config = _config(method='feddf', **{
      'feddf.prototypes': 'cnn', 'feddf.client_models': 'cnn,resnet11',
      'server_data.proxy': 'split', 'server_data.proxy_size': 50})
  with pytest.raises(errors.ConfigError,
                     match=r'feddf\.prototypes=.* contradicts feddf\.client'):
    settings.from_config(config)


def test_canonical_dict_reads_an_old_run_folders_config():
  # A config.json written before the renames: old keys, no new ones.
  saved = json.loads(json.dumps(_config(method='dafkd').to_dict()))
  del saved['dafkd']['shared_extractor']
  saved['dafkd']['no_sharing'] = True
  del saved['feddf']['client_models']
  saved['feddf']['prototypes'] = 'cnn,resnet11'
  canonical = settings.canonical_dict(saved)
  assert canonical['dafkd']['shared_extractor'] is False
  assert 'no_sharing' not in canonical['dafkd']
  assert canonical['feddf']['client_models'] == 'cnn,resnet11'
  now = settings.canonical_dict(
      _config(method='dafkd', **{'dafkd.shared_extractor': False}).to_dict())
  assert now['dafkd'] == canonical['dafkd']


@pytest.mark.parametrize(
    'cls', (settings.RunSettings,) + settings.all_sections(),
    ids=lambda c: c.__name__)
def test_every_key_is_documented(cls):
  # Each field appears as `name:` in its class's Attributes section.
  doc = cls.__doc__ or ''
  assert 'Attributes:' in doc, cls
  attributes = doc.split('Attributes:', 1)[1]
  missing = [f.name for f in dataclasses.fields(cls)
             if f'\n    {f.name}:' not in attributes]
  assert not missing, (cls.__name__, missing)


def test_a_run_folder_written_with_the_old_names_resumes(tmp_path):
  # config.json as the library wrote it before the renames (and before
  # `<method>.variant`).
  old = settings.from_config(_config(
      method='dafkd', **{'dafkd.variant': 'paper'})).to_config().to_dict()
  del old['dafkd']['variant']
  del old['dafkd']['shared_extractor']
  old['dafkd']['no_sharing'] = True
  del old['feddf']['client_models']
  old['feddf']['prototypes'] = ''
  with open(tmp_path / 'config.json', 'w') as f:
    json.dump(old, f)
  checkpoints.check_resumable(settings.from_config(
      _config(method='dafkd', **{'dafkd.variant': 'paper',
                                 'dafkd.shared_extractor': False})),
      str(tmp_path))
  # A FedFTG folder written before its distillation keys moved resumes.
  old = settings.from_config(_config(method='fedftg')).to_config().to_dict()
  del old['fedftg']['variant']
  old['distill'] = dict(steps=200, batch_size=128, learning_rate=1e-3,
                        temperature=1.0, clip_norm=5.0, val_fraction=0.1,
                        eval_every=50, patience=4, cosine_decay=True,
                        student_training=False, validation='pool',
                        accept='always')
  old['fedftg'].update(batch_size=64, lr_decay=0.998, temperature=1.0,
                       student_training=False, kl_reduction='mean')
  (tmp_path / 'ftg').mkdir()
  with open(tmp_path / 'ftg' / 'config.json', 'w') as f:
    json.dump(old, f)
  checkpoints.check_resumable(settings.from_config(_config(method='fedftg')),
                              str(tmp_path / 'ftg'))
  with pytest.raises(errors.CheckpointError,
                     match="different 'distill.batch_size'"):
    checkpoints.check_resumable(settings.from_config(_config(
        method='fedftg', **{'distill.batch_size': 32})), str(tmp_path / 'ftg'))
  # Written back under the new names; the same setting still resumes and a
  # different one is refused.
  with open(tmp_path / 'config.json') as f:
    assert json.load(f)['dafkd']['shared_extractor'] is False
  checkpoints.check_resumable(settings.from_config(
      _config(method='dafkd', **{'dafkd.variant': 'paper',
                                 'dafkd.no_sharing': True})), str(tmp_path))
  with pytest.raises(errors.CheckpointError,
                     match="different 'dafkd.shared_extractor'"):
    checkpoints.check_resumable(settings.from_config(_config(
        method='dafkd', **{'dafkd.variant': 'paper'})), str(tmp_path))
  # Another preset (the default without a server pool) is another run.
  with pytest.raises(errors.CheckpointError, match="different 'dafkd.aux"):
    checkpoints.check_resumable(settings.from_config(_config(
        method='dafkd', **{'dafkd.detach_extractor': False,
                           'dafkd.shared_extractor': False,
                           'dafkd.generator': 'mlp'})), str(tmp_path))


def test_with_overrides_sets_dotted_keys_and_names_unknown_ones():
  config = settings.with_overrides(settings.default_config(), {
      'rounds': 5, 'dafkd.pool_size': 32, 'dafkd.no_sharing': True})
  assert config.rounds == 5 and config.dafkd.pool_size == 32
  for key in ('nokey', 'dafkd.nokey', 'nosection.key', 'rounds.deeper'):
    with pytest.raises(errors.ConfigError,
                       match=f"config key '{key}' does not exist"):
      settings.with_overrides(settings.default_config(), {key: 1})


def test_parse_value_reads_numbers_bools_and_strings():
  assert settings.parse_value('3') == 3
  assert settings.parse_value('1e-3') == 1e-3
  assert settings.parse_value('False') is False
  assert settings.parse_value('true') is True
  assert settings.parse_value('fedd3a') == 'fedd3a'


_CONFIGS = sorted(p.stem for p in (
    pathlib.Path(__file__).parents[2] / 'configs').glob('*.py')
                  if p.stem != '__init__')


@pytest.mark.parametrize('name', _CONFIGS)
def test_every_shipped_config_validates(name, tmp_path, monkeypatch):
  """On a fresh machine: an empty home, no tfds or Keras cache; a config
  that needs a generated artefact names how it is made, not a file that an
  earlier process left behind."""
  home = tmp_path / 'empty_home'
  monkeypatch.setenv('HOME', str(home))
  for name_ in ('TFDS_DATA_DIR', 'KERAS_HOME', 'XDG_CACHE_HOME'):
    monkeypatch.setenv(name_, str(home / name_.lower()))
  config = importlib.import_module(f'configs.{name}').get_config()
  settings.from_config(config)
  assert not home.exists()


def test_a_distill_key_the_method_does_not_read_is_named_in_one_warning():
  # FedFTG's server step reads five distill keys; early stopping
  # (distill.validation) was once set for it and silently changed nothing.
  with mock.patch.object(distill_hparams.logging, 'warning') as warning:
    settings.from_config(_config(method='fedftg', **{
        'distill.validation': 'auto', 'distill.eval_every': 20}))
  assert warning.call_count == 1
  line = warning.call_args[0][0] % warning.call_args[0][1:]
  assert line.startswith("fedftg ignores distill.eval_every=20, "
                         "distill.validation='auto': its server step reads "
                         'only distill.')
  with mock.patch.object(distill_hparams.logging, 'warning') as warning:
    settings.from_config(_config(method='fedftg', **{
        'distill.temperature': 2.0}))
    settings.from_config(_config(method='fedftg'))
  warning.assert_not_called()
