"""Clients with non-finite updates are excluded and counted; the run goes on.

A client is poisoned by rewriting its data file with NaN images (what a
corrupt local dataset does): its local training produces a NaN loss and a
NaN update. `tff_kd.federated.learning.screen_client` must give it weight 0
and a zero update, the stacking aggregator must leave it out of the teachers,
and the round must report `client/num_excluded`. When every client of a round
is bad, the run stops with a clear error before the state is overwritten.
"""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from tests.helpers import digits_config as _config
from tff_kd import errors
from tff_kd.program import experiment
from tff_kd.program import sampling


def _poison(exp: experiment.Experiment, client: int) -> None:
  """Replaces one client's images with NaNs, keeping their shape."""
  path = os.path.join(exp.client_data.directory,
                      f'{exp.client_data.client_ids[client]}.x')
  x = tf.io.parse_tensor(tf.io.read_file(path), tf.float32)
  tf.io.write_file(path, tf.io.serialize_tensor(
      tf.fill(tf.shape(x), float('nan'))))


def _round0_clients(config) -> np.ndarray:
  return sampling.sample_clients(config.partition.num_clients,
                                 config.clients_per_round, seed=config.seed,
                                 round_num=0)


def _global_leaves(exp, state) -> list[np.ndarray]:
  return [np.asarray(v) for v in
          tf.nest.flatten(exp.process.get_model_weights(state))]


@pytest.mark.parametrize('method', ['fedavg', 'feddf'])
def test_excluded_client_equals_its_absence(tmp_path, method):
  """One round with a NaN client gives the model of the round without it."""
  config = helpers.smoke_config(method, rounds=1)
  exp = experiment.prepare(config, str(tmp_path))
  clients = _round0_clients(config)
  _poison(exp, clients[0])
  keys = exp.client_data.keys(clients, seed=config.seed, round_num=0)
  state = exp.process.initialize()
  with_bad = exp.process.next(state, keys)
  without = exp.process.next(state, keys[1:])
  cw = with_bad.metrics['client_work']['train']
  assert float(cw['num_excluded']) == 1.0
  assert float(cw['num_clients']) == 3.0
  assert float(without.metrics['client_work']['train']['num_excluded']) == 0.0
  assert np.isfinite(float(cw['train_loss_sum']))
  assert float(cw['num_examples']) == float(
      without.metrics['client_work']['train']['num_examples'])
  if method == 'feddf':
    assert float(with_bad.metrics['finalizer']['num_teachers']) == 2.0
  for a, b in zip(_global_leaves(exp, with_bad.state),
                  _global_leaves(exp, without.state)):
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


# Every method, and the variant whose clients keep a model store.
SCREENING_CASES = helpers.smoke_cases(variants=('fedd3a_hetero',))


@pytest.mark.slow
@pytest.mark.parametrize('case', SCREENING_CASES)
def test_every_method_runs_on_past_a_nan_client(tmp_path, case):
  config = helpers.smoke_config(case, rounds=1)
  root = str(tmp_path)
  exp = experiment.prepare(config, root)
  bad = _round0_clients(config)[0]
  _poison(exp, bad)
  result = experiment.run(config, root, progress=False)
  for row in result.history:
    sampled = bad in sampling.sample_clients(
        config.partition.num_clients, config.clients_per_round,
        seed=config.seed, round_num=row['round'] - 1)
    assert row['client/num_excluded'] == float(sampled), row['round']
    assert np.isfinite(row['train/loss'])
  assert np.isfinite(result.final['test/accuracy'])
  state, _ = experiment.load_state(config, root)
  assert all(np.all(np.isfinite(np.asarray(v))) for v in
             tf.nest.flatten(state) if np.asarray(v).dtype.kind == 'f')


def test_a_round_of_only_bad_clients_stops_with_a_clear_error(tmp_path):
  config = _config(rounds=2, export=False)
  root = str(tmp_path)
  exp = experiment.prepare(config, root)
  for client in range(config.partition.num_clients):
    _poison(exp, client)
  with pytest.raises(errors.TrainingError,
                     match=r"round 1: every client's update \(3 of 3\) was "
                     r'non-finite; the last good state \(round 0\)'):
    experiment.run(config, root, progress=False)
  assert [os.path.basename(p) for p in glob.glob(
      os.path.join(root, 'checkpoints', '*'))] == ['program_state_0']
  # The CSV release manager writes its header at once; no round is logged.
  with open(os.path.join(root, 'metrics.csv')) as f:
    assert f.read().split() == ['round']
