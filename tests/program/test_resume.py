"""Exact resume: 2 + 2 rounds equal 4 straight rounds, bit for bit.

For FedAvg and for every method with state beyond the global model (DaFKD's
generator and per-client discriminator store, FedGen's generator and its
Adam state, FedFTG's generator, its Adam state and round counter,
heterogeneous FedD3A's per-client model store), a run stopped after 2 rounds
and resumed to 4 must hold exactly the state of an uninterrupted 4-round run:
every leaf of the process state (global weights, client-work, aggregator and
finalizer state) and every logged per-round training loss.
"""

import csv
import os

import numpy as np
import pytest
import tensorflow as tf

from tests.program.test_experiment import _config
from tff_kd.program import experiment

pytestmark = pytest.mark.slow

_SERVER = {'server_data.proxy': 'split', 'server_data.proxy_size': 100,
           'distill.steps': 5, 'distill.batch_size': 32,
           'distill.val_fraction': 0.0}
CASES = {
    'fedavg': {},
    'dafkd': {'method': 'dafkd', 'dafkd.pool_size': 32, 'dafkd.noise_dim': 8,
              'dafkd.generator_hidden': '16', 'dafkd.gan_steps': 0,
              **_SERVER},
    'fedgen': {'method': 'fedgen', 'fedgen.generator_steps': 3,
               'fedgen.hidden': 16},
    'fedftg': {'method': 'fedftg', 'fedftg.iterations': 2,
               'fedftg.batch_size': 16, 'fedftg.noise_dim': 8},
    'fedd3a_hetero': {'method': 'fedd3a',
                      'fedd3a.client_models': 'cnn,cnn:group', **_SERVER},
}


def logged_losses(root: str) -> dict[int, list[float]]:
  """Every logged train loss per round (a re-logged round appears twice)."""
  out = {}
  with open(os.path.join(root, 'metrics.csv')) as f:
    for row in csv.DictReader(f):
      out.setdefault(int(row['round']), []).append(float(row['train/loss']))
  return out


@pytest.mark.parametrize('case', sorted(CASES))
def test_two_plus_two_rounds_equal_four(tmp_path, case):
  def config(rounds):
    return _config(rounds=rounds, export=False, **CASES[case])

  straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
  experiment.run(config(4), straight, progress=False)
  experiment.run(config(2), resumed, progress=False)
  experiment.run(config(4), resumed, progress=False)
  state_a, round_a = experiment.load_state(config(4), straight)
  state_b, round_b = experiment.load_state(config(4), resumed)
  assert round_a == round_b == 4
  leaves_a, leaves_b = tf.nest.flatten(state_a), tf.nest.flatten(state_b)
  assert len(leaves_a) == len(leaves_b)
  for i, (a, b) in enumerate(zip(leaves_a, leaves_b)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=i)
  losses_a, losses_b = logged_losses(straight), logged_losses(resumed)
  assert sorted(losses_b) == [1, 2, 3, 4]
  for r, values in losses_b.items():
    assert values == [losses_a[r][0]] * len(values), r
