"""Bad client data is a client fault: excluded and counted; the run goes on.

A client is poisoned by rewriting its data file with NaN images (what a
corrupt local dataset does): its local training produces a NaN loss and a
NaN update. `tff_kd.federated.client_works.screen_client` must give it weight 0
and a zero update, the stacking aggregator must leave it out of the teachers,
and the round must report `client/num_excluded`. A file that is truncated,
unreadable or of the wrong shape takes the same path
(`FileClientData.read_arrays` gives it one NaN image), with a warning naming
the file. When every client of a round is bad, the run stops with one line
before the state is overwritten.
"""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from tests.helpers import digits_config as _config
from tff_kd import errors
from tff_kd.federated import client_data
from tff_kd.program import experiment
from tff_kd.program import sampling


def _poison(exp: experiment.Experiment, client: int) -> None:
  """Replaces one client's images with NaNs, keeping their shape."""
  _poison_files(exp.client_data, client)


def _poison_files(data: client_data.FileClientData, client: int) -> None:
  path = os.path.join(data.directory, f'{data.client_ids[client]}.x')
  x = tf.io.parse_tensor(tf.io.read_file(path), tf.float32)
  tf.io.write_file(path, tf.io.serialize_tensor(
      tf.fill(tf.shape(x), float('nan'))))


def _break(exp: experiment.Experiment, client: int, how: str) -> str:
  """Damages one client's files as `how` says; returns the damaged path."""
  prefix = os.path.join(exp.client_data.directory,
                        exp.client_data.client_ids[client])
  if how == 'truncated':
    with open(prefix + '.x', 'rb') as f:
      data = f.read()
    with open(prefix + '.x', 'wb') as f:
      f.write(data[:len(data) // 2])
    return prefix + '.x'
  if how == 'missing':
    os.remove(prefix + '.y')
    return prefix + '.y'
  if how == 'mis-shaped':  # The images of another dataset.
    tf.io.write_file(prefix + '.x', tf.io.serialize_tensor(
        tf.zeros([5, 28, 28, 1], tf.float32)))
    return prefix + '.x'
  if how == 'labels mismatch':  # One label too few.
    y = tf.io.parse_tensor(tf.io.read_file(prefix + '.y'), tf.int32)
    tf.io.write_file(prefix + '.y', tf.io.serialize_tensor(y[1:]))
    return prefix + '.y'
  raise ValueError(how)


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


def _assert_excluded_when_sampled(config, history, bad: int) -> None:
  """Each round excluded one client if `bad` was sampled, else none."""
  for row in history:
    sampled = bad in sampling.sample_clients(
        config.partition.num_clients, config.clients_per_round,
        seed=config.seed, round_num=row['round'] - 1)
    assert row['client/num_excluded'] == float(sampled), row['round']


@pytest.mark.slow
@pytest.mark.parametrize('case', SCREENING_CASES)
def test_every_method_runs_on_past_a_nan_client(tmp_path, monkeypatch, case):
  config = helpers.smoke_config(case, rounds=1)
  root = str(tmp_path)
  bad = _round0_clients(config)[0]
  # The run's client files are poisoned as soon as they are written, before
  # anything reads them (as `experiment.prepare` then `_poison` would, but
  # without building the method's process twice).
  create = client_data.FileClientData.create

  def create_poisoned(*args, **kwargs):
    data = create(*args, **kwargs)
    _poison_files(data, bad)
    return data

  monkeypatch.setattr(client_data.FileClientData, 'create',
                      staticmethod(create_poisoned))
  result = experiment.run(config, root, progress=False)
  monkeypatch.undo()
  _assert_excluded_when_sampled(config, result.history, bad)
  for row in result.history:
    assert np.isfinite(row['train/loss'])
  assert np.isfinite(result.final['test/accuracy'])
  _, leaves = helpers.saved_leaves(root)  # No third build of the process.
  assert all(np.all(np.isfinite(v)) for v in leaves if v.dtype.kind == 'f')


def test_unreadable_client_files_equal_their_absence(tmp_path):
  """As NaN clients: the round's model is the one without them; the
  driver's check names each bad file."""
  config = _config(rounds=1)
  exp = experiment.prepare(config, str(tmp_path))
  clients = list(_round0_clients(config))
  others = [c for c in range(config.partition.num_clients)
            if c not in clients]
  # Two of the round's clients, and the other kinds of damage elsewhere.
  damage = {clients[0]: 'truncated', clients[1]: 'mis-shaped',
            others[0]: 'missing', others[1]: 'labels mismatch'}
  for client, how in damage.items():
    path = _break(exp, client, how)
    assert exp.client_data.problem(client).startswith(f'{path}: '), how
  assert exp.client_data.problem(clients[2]) is None
  keys = exp.client_data.keys(clients, seed=config.seed, round_num=0)
  state = exp.process.initialize()
  with_bad = exp.process.next(state, keys)
  without = exp.process.next(state, keys[2:])
  assert float(with_bad.metrics['client_work']['train']['num_excluded']) == 2
  for a, b in zip(_global_leaves(exp, with_bad.state),
                  _global_leaves(exp, without.state)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
  # The other two kinds, through the process too.
  keys = exp.client_data.keys(others[:2] + clients[2:], seed=config.seed,
                              round_num=0)
  output = exp.process.next(state, keys)
  assert float(output.metrics['client_work']['train']['num_excluded']) == 2


@pytest.mark.parametrize('grouping', [
    {}, {'runtime.clients_per_call': 2, 'runtime.client_execution': 'fused'}])
def test_a_run_goes_on_past_a_truncated_client_file(tmp_path, caplog,
                                                    grouping):
  config = _config(rounds=2, export=False, **grouping)
  root = str(tmp_path)
  exp = experiment.prepare(config, root)
  bad = _round0_clients(config)[0]
  path = _break(exp, bad, 'truncated')
  result = experiment.run(config, root, progress=False)
  _assert_excluded_when_sampled(config, result.history, bad)
  warnings = [r.getMessage() for r in caplog.records
              if r.levelname == 'WARNING' and 'excluded' in r.getMessage()]
  assert (f'round 1: a client is excluded for its data: {path}: Could not '
          'parse `serialized` as TensorProto') in warnings, warnings


def test_a_round_of_only_unreadable_clients_is_one_line(tmp_path):
  config = _config(rounds=2, export=False)
  root = str(tmp_path)
  exp = experiment.prepare(config, root)
  paths = [_break(exp, client, 'truncated')
           for client in range(config.partition.num_clients)]
  with pytest.raises(errors.TrainingError) as raised:
    experiment.run(config, root, progress=False)
  message = str(raised.value)
  assert '\n' not in message
  assert message.startswith(
      'round 1: every client (3 of 3) was excluded; unreadable client data: ')
  assert any(f'{p}: Could not parse' in message for p in paths), message
  assert ('and 2 more (in the log); the last good state (round 0) stays in '
          f'{root}; check the client data') in message, message


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
