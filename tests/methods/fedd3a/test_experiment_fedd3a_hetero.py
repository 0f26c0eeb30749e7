"""`train --method=fedd3a` with heterogeneous client models, end to end.

Heterogeneous FedD3A (Su, Li, Xue, AAAI 2023, Sec. 3 "Application to
Heterogeneous Models") through `experiment.run` on scikit-learn's digits
(8x8, bundled): two rounds, two client architectures, an unlabeled server
pool split off the training set.
"""

import os

import numpy as np
import pytest

from configs import fedd3a_digits_hetero
from tests.helpers import digits_config as _config
from tff_kd import errors
from tff_kd.program import experiment


def _hetero_config(**overrides):
  base = {
      'method': 'fedd3a', 'clients_per_round': 3,
      'server_data.proxy': 'split', 'server_data.proxy_size': 200,
      'distill.steps': 6, 'distill.batch_size': 32, 'distill.eval_every': 3,
      'fedd3a.client_models': 'cnn:group,cnn:none', 'fedd3a.alpha': 10.0,
      'fedd3a.kd_temperature': 2.0, 'export': False,
  }
  base.update(overrides)
  return _config(**base)


@pytest.mark.parametrize('overrides,match', [
    ({'fedd3a.client_models': 'cnn,vgg'},
     "fedd3a.client_models entry 'vgg' is not model"),
    ({'fedd3a.client_models': 'cnn:layer'},
     "fedd3a.client_models entry 'cnn:layer' is not model"),
    ({'fedd3a.kd_weight': -0.5}, 'fedd3a.kd_weight must be'),
    ({'fedd3a.kd_temperature': 0.0}, 'fedd3a.kd_temperature must be'),
])
def test_bad_hetero_settings_fail_before_compute(tmp_path, overrides, match):
  with pytest.raises(errors.ConfigError, match=match):
    experiment.run(_hetero_config(**overrides), str(tmp_path),
                   progress=False)
  assert not os.listdir(tmp_path)


def test_shipped_hetero_config_validates():
  c = fedd3a_digits_hetero.get_config()
  experiment.from_config(c)
  assert c.fedd3a.client_models == 'cnn,resnet11'
  assert c.model.name == 'cnn'


def test_two_round_hetero_run(tmp_path):
  result = experiment.run(_hetero_config(), str(tmp_path), progress=False)
  assert len(result.history) == 2
  row = result.history[-1]
  assert row['distill/num_teachers'] == 3.0
  # Clients 0-5, architecture i % 2: every round samples both kinds.
  assert row['distill/num_teachers_a0'] + row['distill/num_teachers_a1'] == 3
  assert 0.0 < row['distill/weight_entropy'] <= np.log(3) + 1e-6
  assert row['distill/steps'] >= 1
  assert 0.0 <= result.final['test/accuracy'] <= 1.0
  # Each client uploads its own model and a 32 x 32 projection.
  assert row['comm/bytes_up'] > 3 * 32 * 32 * 4
  assert np.isfinite(row['train/loss'])
