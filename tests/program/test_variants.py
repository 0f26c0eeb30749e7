"""Named presets (`<method>.variant`): one key names a documented variant.

A preset fills in the keys it sets where the config leaves them unset; a
value the config sets wins (with a warning where it differs); the default
preset is each method's `Hparams.default_variant`; the run folder records
the preset by name and resumes on the values, not the name.
"""

import json

from absl import logging
import pytest

from tests import helpers
from tests.methods import link_checks
from tff_kd import errors
from tff_kd.methods import registry
from tff_kd.methods.dafkd import hparams as dafkd_hparams
from tff_kd.models import classifiers
from tff_kd.models import generators
from tff_kd.program import checkpoints
from tff_kd.program import experiment
from tff_kd.program import settings

_PROXY = {'server_data.proxy': 'split', 'server_data.proxy_size': 100}


def _settings(**overrides) -> settings.Settings:
  return settings.from_config(helpers.digits_config(**overrides))


def _presets():
  return [(m.name, name) for m in registry.METHODS.values()
          if m.hparams is not None for name in m.hparams.VARIANTS]


@pytest.mark.parametrize('method,name', _presets())
def test_each_preset_sets_its_keys_and_is_recorded_by_name(method, name):
  cls = registry.get_method(method).hparams
  run = _settings(method=method, **{cls.key('variant'): name}, **_PROXY)
  assert run.hparams.variant == name
  for key, value in cls.VARIANTS[name].keys.items():
    section, leaf = key.split('.')
    got = getattr(run.distill if section == 'distill' else run.hparams, leaf)
    assert got == value, key
  # Every other key a preset of the method sets takes the class default.
  own = {k.split('.', 1)[1] for k in cls.preset_keys()
         if k.startswith(f'{cls.SECTION}.')}
  for leaf in own - {k.split('.', 1)[1] for k in cls.VARIANTS[name].keys}:
    assert getattr(run.hparams, leaf) == getattr(cls(), leaf), leaf
  assert run.flat_config()[cls.key('variant')] == name
  assert run.to_config()[cls.SECTION].variant == name


def test_the_paper_preset_is_the_class_defaults():
  # DaFKD's default before presets existed; `tools/identity`'s DaFKD cases
  # pin it, so their outputs stay those of the earlier default.
  run = _settings(method='dafkd', **{'dafkd.variant': 'paper'})
  assert run.hparams == dafkd_hparams.DaFKDHparams(variant='paper')
  assert run.distill.temperature == 20.0  # DaFKD's own distill default.


def test_the_defaults_are_the_presets_chosen_in_the_drift_regime():
  assert _settings(method='dafkd', **_PROXY).hparams.variant == 'real_pool'
  assert _settings(method='dafkd', **_PROXY).hparams.pool == 'real'
  data_free = _settings(method='dafkd')
  assert data_free.hparams.variant == 'features'
  assert data_free.hparams.generator == 'feature'
  assert data_free.distill.temperature == 1.0
  assert _settings(method='fedftg').hparams.student_learning_rate == 1e-3
  assert _settings(method='fedd3a', **_PROXY).hparams.ensemble == 'logits'
  assert _settings(method='fedftg', **{
      'fedftg.variant': 'reference'}).hparams.student_learning_rate == 0.1


def test_a_key_the_config_sets_wins_over_the_preset(caplog):
  with caplog.at_level(logging.WARNING):
    run = _settings(method='dafkd', **{'dafkd.variant': 'features',
                                       'dafkd.generator': 'dcgan',
                                       'distill.temperature': 4.0})
  assert run.hparams.generator == 'dcgan'
  assert run.hparams.aux_weight == 1.0  # The rest of the preset holds.
  assert run.distill.temperature == 4.0
  assert ("dafkd.generator='dcgan', set by the config, replaces the "
          "'feature' of dafkd.variant='features'") in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    _settings(method='dafkd', **{'dafkd.aux_weight': 2.0})
  assert ("dafkd.variant is unset: the default preset 'features' runs "
          "(docs/variants.md), with this config's dafkd.aux_weight"
          in caplog.text)


def test_an_error_names_the_preset_only_where_it_set_the_key():
  with pytest.raises(errors.ConfigError) as raised:
    _settings(method='dafkd', **{'dafkd.shared_extractor': False})
  assert str(raised.value).endswith(
      "(dafkd.variant unset, so the default preset 'features', set "
      "dafkd.generator='feature', dafkd.generator_labels='local', "
      "dafkd.aux_weight=1.0, dafkd.discriminator='projection', "
      "dafkd.detach_extractor=True, distill.temperature=1.0; another preset "
      'or your own values: docs/variants.md)')
  with pytest.raises(errors.ConfigError) as raised:
    _settings(method='dafkd', **{'dafkd.pool_size': 0})
  assert 'variant' not in str(raised.value)


def test_a_bad_preset_is_one_line_before_any_compute():
  with pytest.raises(errors.ConfigError, match=(
      r"^fedd3a\.variant='soft' is not a preset of fedd3a; it has logits, "
      r'paper \(docs/variants\.md\)$')):
    _settings(method='fedd3a', **{'fedd3a.variant': 'soft'}, **_PROXY)


def test_a_run_resumes_on_the_values_a_preset_set_not_its_name(tmp_path):
  named = _settings(method='dafkd', **{'dafkd.variant': 'real_pool'},
                    **_PROXY)
  checkpoints.check_resumable(named, str(tmp_path))
  with open(tmp_path / 'config.json') as f:
    assert json.load(f)['dafkd']['variant'] == 'real_pool'
  # The same values by default, or by hand under the paper's name.
  checkpoints.check_resumable(_settings(method='dafkd', **_PROXY),
                              str(tmp_path))
  checkpoints.check_resumable(_settings(
      method='dafkd', **{'dafkd.variant': 'paper', 'dafkd.pool': 'real'},
      **_PROXY), str(tmp_path))
  with pytest.raises(errors.CheckpointError, match="different 'dafkd.pool'"):
    checkpoints.check_resumable(_settings(
        method='dafkd', **{'dafkd.variant': 'paper'}, **_PROXY),
        str(tmp_path))


def test_compare_names_a_preset_as_method_dot_preset():
  entries = experiment.study_entries(['fedavg', 'dafkd.features'])
  assert entries[1].label == 'dafkd.features'
  assert entries[1].method == 'dafkd'
  assert dict(entries[1].overrides) == {'dafkd.variant': 'features'}
  with pytest.raises(errors.ConfigError, match=(
      r"'dafkd\.appendix': dafkd has the presets paper, paper_dcgan, "
      'features, real_pool')):
    experiment.study_entries(['dafkd.appendix'])
  with pytest.raises(errors.ConfigError, match='fedavg has no presets'):
    experiment.study_entries(['fedavg.paper'])


def test_the_default_dafkd_trains_and_resumes(tmp_path):
  # A real two-round run of the default preset on the digits (the server's
  # real pool), then its resume: nothing to redo.
  config = helpers.digits_config(
      method='dafkd', export=False, **_PROXY,
      **{'server_data.val_size': 60, 'distill.steps': 4,
         'dafkd.gan_steps': 1, 'local.unit': 'steps'})
  first = experiment.run(config, str(tmp_path), progress=False)
  assert [h['round'] for h in first.history] == [1, 2]
  with open(tmp_path / 'config.json') as f:
    saved = json.load(f)
  assert saved['dafkd']['variant'] == 'real_pool'
  assert saved['dafkd']['pool'] == 'real'
  # Its row of `compare`'s link table, from its 60 labeled server images.
  link_checks.assert_fills_the_link_table(first.history, 'dafkd')
  # Traffic per client: the classifier and the client's discriminator row
  # both ways, the pool down; not the generator, which no client trains.
  clf = classifiers.build_classifier('cnn', input_shape=(8, 8, 1),
                                     num_classes=10)
  head = generators.build_discriminator_head(clf).head
  clf_bytes = 4 * sum(int(w.shape.num_elements()) for w in clf.model.weights)
  row_bytes = 4 * sum(int(w.shape.num_elements()) for w in head.weights)
  pool_bytes = 4 * 100 * 8 * 8
  row = first.history[0]
  clients = config.clients_per_round
  assert row['comm/bytes_down'] == clients * (clf_bytes + row_bytes +
                                              pool_bytes)
  assert row['comm/bytes_up'] == clients * (clf_bytes + row_bytes + 8)
  again = experiment.run(config, str(tmp_path), progress=False)
  assert again.history == []  # Both rounds are on record already.
