"""Every method's hyper-parameters: one frozen dataclass per config section.

A bad value in any method's section is a `ConfigError` naming the key,
raised by `experiment.from_config`, and so by `experiment.run` before it
loads data or writes anything under its root_dir. The contract every
registered method gets (`test_every_field_refuses_a_wrong_typed_value`):
each field of its hparams class, given a value of the wrong type, is refused
so, from the method's `smoke` config; the hand-written `BAD` cases add the
range and combination checks.
"""

import dataclasses
import os
import re

import numpy as np
import pytest

from configs import base
from tests import helpers
from tests.helpers import digits_config as _config
from tff_kd import errors
from tff_kd import hparams as hp
from tff_kd.methods import registry
from tff_kd.methods.dafkd import hparams as dafkd_hparams
from tff_kd.methods.fedgen import hparams as fedgen_hparams
from tff_kd.program import experiment

_POOL = {'server_data.proxy': 'split', 'server_data.proxy_size': 50}

BAD = [
    ('fedprox', {'fedprox.mu': -1.0}, r'fedprox\.mu must be .* got -1\.0'),
    ('fedprox', {'fedprox.mu': float('nan')}, r'fedprox\.mu must be .* nan'),
    ('feddf', {'feddf.client_models': 'cnn,vgg', **_POOL},
     r"feddf\.client_models entry 'vgg' is not"),
    ('feddf', {'feddf.drop_worst': True, **_POOL},
     r'feddf\.drop_worst needs server_data\.val_size >= 1'),
    ('fedd3a', {'fedd3a.alpha': 0.0, **_POOL},
     r'fedd3a\.alpha must be a finite number > 0, got 0\.0'),
    ('fedd3a', {'fedd3a.weighting': 'max', **_POOL},
     r"fedd3a\.weighting 'max' is unknown"),
    ('fedd3a', {'fedd3a.client_models': 'cnn:layer', **_POOL},
     r"fedd3a\.client_models entry 'cnn:layer'"),
    ('fedgen', {'fedgen.noise': 'laplace'},
     r"fedgen\.noise 'laplace' is unknown; choose one of gaussian, uniform"),
    ('fedgen', {'fedgen.output_activation': 'nosuch'},
     r"fedgen\.output_activation must be .* got 'nosuch'"),
    ('fedgen', {'fedgen.coefficient_decay': 1.5},
     r'fedgen\.coefficient_decay must be in \(0, 1\], got 1\.5'),
    ('fedftg', {'fedftg.iterations': -1},
     r'fedftg\.iterations must be an integer >= 1, got -1'),
    ('fedftg', {'distill.kl_reduction': 'sum'},
     r"distill\.kl_reduction 'sum' is unknown"),
    ('fedftg', {'fedftg.kl_reduction': 'sum'},  # Its old name.
     r"distill\.kl_reduction 'sum' is unknown"),
    ('feddf', {'distill.lr_decay': 0.9, **_POOL},
     r'distill\.lr_decay=0\.9: feddf keeps its server learning rate'),
    ('fedftg', {'fedftg.temperature': 2.0, 'distill.temperature': 3.0},
     r'fedftg\.temperature=2\.0 \(moved to distill\.temperature\) '
     r'contradicts distill\.temperature=3\.0'),
    ('dafkd', {'dafkd.pool_size': 0},
     r'dafkd\.pool_size must be an integer >= 1, got 0'),
    ('dafkd', {'dafkd.generator_hidden': '32,0'},
     r"dafkd\.generator_hidden must be .* got '32,0'"),
    ('dafkd', {'dafkd.generator_beta_1': 1.0},
     r'dafkd\.generator_beta_1 must be in \[0, 1\), got 1\.0'),
    ('dafkd', {'dafkd.weight_decay': 1e-3},
     r'client_optimizer\.weight_decay needs client_optimizer\.name=adam '
     r'.*=0\.001'),
    ('dafkd', {'dafkd.variant': 'real_pool'},
     r"dafkd\.pool='real' .* needs the server's proxy pool.*"
     r"\(dafkd\.variant='real_pool' set dafkd\.pool='real'; "),
    ('dafkd', {'dafkd.variant': 'appendix'},
     r"dafkd\.variant='appendix' is not a preset of dafkd; it has paper, "
     r'paper_dcgan, features, real_pool'),
    ('dafkd', {'dafkd.pool': 'real'},
     r"dafkd\.discriminator='projection' .*dafkd\.variant unset, so the "
     r"default preset 'features', set dafkd\.generator='feature'"),
]

ALL_HPARAMS = tuple(m.hparams for m in registry.METHODS.values()
                    if m.hparams is not None)


def _refused_before_compute(config, match: str, tmp_path) -> None:
  """`from_config` and `run` both raise a `ConfigError` matching `match`,
  and `run` writes nothing (it writes client data under root_dir first thing
  after validation)."""
  with pytest.raises(errors.ConfigError, match=match):
    experiment.from_config(config)
  root_dir = tmp_path / 'run'
  with pytest.raises(errors.ConfigError, match=match):
    experiment.run(config, str(root_dir), progress=False)
  assert not os.path.exists(root_dir)


@pytest.mark.parametrize('method,overrides,match', BAD,
                         ids=[next(iter(o)) for _, o, _ in BAD])
def test_bad_setting_fails_before_data_is_touched(tmp_path, method, overrides,
                                                  match):
  _refused_before_compute(_config(method=method, **overrides), match,
                          tmp_path)


@pytest.mark.parametrize('method', sorted(registry.METHODS))
def test_every_method_declares_its_section(method):
  m = registry.get_method(method)
  if m.hparams is None:
    assert method == 'fedavg'
    assert experiment.from_config(_config(method=method)).hparams is None
    return
  assert m.hparams.SECTION == method
  assert isinstance(experiment.from_config(_config(method=method, **_POOL)).hparams,
                    m.hparams)


@pytest.mark.parametrize('cls', ALL_HPARAMS, ids=lambda c: c.__name__)
def test_from_config_round_trips_the_base_section(cls):
  section = base.get_config()[cls.SECTION]
  got = cls.from_config(section)
  assert got == cls()
  # Old names and the keys a preset sets are unset (None).
  presets = [key.split('.', 1)[1] for key in cls.preset_keys()
             if key.startswith(f'{cls.SECTION}.')]
  assert {**dataclasses.asdict(got), **dict.fromkeys(cls.ALIASES),
          **dict.fromkeys(presets)} == section.to_dict()
  # Missing keys take their defaults (e.g. a config from before a key).
  assert cls.from_config({}) == cls()


@pytest.mark.parametrize('cls', ALL_HPARAMS, ids=lambda c: c.__name__)
def test_from_config_refuses_unknown_keys(cls):
  section = base.get_config()[cls.SECTION]
  with section.unlocked():
    section.nosuch = 1
  with pytest.raises(errors.ConfigError,
                     match=f"config key '{cls.SECTION}.nosuch' does not "
                     'exist'):
    cls.from_config(section)


def test_hparams_are_frozen():
  with pytest.raises(dataclasses.FrozenInstanceError):
    fedgen_hparams.FedGenHparams().noise = 'uniform'  # pytype: disable=not-writable


def test_every_field_has_a_checker_and_a_docstring_entry():
  for cls in ALL_HPARAMS:
    for f in dataclasses.fields(cls):
      assert callable(f.metadata.get('check')), (cls.__name__, f.name)
      assert f'    {f.name}: ' in cls.__doc__, (cls.__name__, f.name)


@pytest.mark.parametrize('check,good,bad', [
    (hp.positive_int, [1, np.int64(3)], [0, -1, 1.0, True, '2']),
    (hp.non_negative_int, [0, np.int32(2)], [-1, 0.5, False]),
    (hp.positive_number,
     [1e-3, 2, np.float32(0.5)], [0, -1.0, float('nan'), float('inf'),
                                  True, '1']),
    (hp.non_negative_number, [0, 0.0, np.float64(2.0)],
     [-1e-9, float('-inf'), None]),
    (hp.unit_interval, [1.0, 0.5, np.float32(1)], [0.0, 1.01]),
    (hp.unit_fraction, [0.0, 0.99], [1.0, -0.1]),
    (hp.boolean, [True, False, np.bool_(True)], [0, 1, 'True']),
    (hp.one_of('a', 'b'), ['a', 'b'], ['c', '', None]),
    (hp.widths, ['8', '256,512'], ['', '8,x', '0', '-4', 8]),
])
def test_checkers(check, good, bad):
  for value in good:
    check('s.k', value)
  for value in bad:
    with pytest.raises(errors.ConfigError, match=r's\.k '):
      check('s.k', value)


def test_dafkd_pool_generator_default_follows_private_mode():
  assert dafkd_hparams.DaFKDHparams().resolved_pool_generator == 'aggregated'
  private = dafkd_hparams.DaFKDHparams(private=True)
  private.validate()
  assert private.resolved_pool_generator == 'broadcast'
  with pytest.raises(errors.ConfigError, match="must be 'broadcast'"):
    dafkd_hparams.DaFKDHparams(private=True,
                               pool_generator='aggregated').validate()
  widths = dafkd_hparams.DaFKDHparams(generator_hidden='16,8').hidden_widths
  assert widths == (16, 8)


def _wrong_typed(value):
  """A value of another type than `value`: a number where a bool or a string
  is due, a numeric string where a number is due."""
  if isinstance(value, (bool, str)):
    return 1
  return str(value)


WRONG_TYPED = [(m.name, f.name) for m in registry.METHODS.values()
               if m.hparams is not None
               for f in dataclasses.fields(m.hparams)]


@pytest.mark.parametrize('method,name', WRONG_TYPED,
                         ids=[f'{m}.{n}' for m, n in WRONG_TYPED])
def test_every_field_refuses_a_wrong_typed_value(tmp_path, method, name):
  config = helpers.smoke_config(method)
  key = f'{registry.get_method(method).hparams.SECTION}.{name}'
  section = config[key.split('.')[0]]
  with section.ignore_type():
    section[name] = _wrong_typed(section[name])
  _refused_before_compute(config, re.escape(key) + r'\b', tmp_path)
