"""TFF's own program logic drives every tff_kd method.

`tff.learning.programs.train_model`, with a program-state manager (TFF's
`FileProgramStateManager` in FedAvg's case, the library's drop-in
`checkpoints.CheckpointManager` in the others': its own file format, the
data iterator's `Serializable` state included), a
train-metrics release manager, an evaluation manager (TFF's `build_fed_eval`
on the test set; FedAvg's case, as it reads only the global model, which
every method's `get_model_weights` gives) and `ClientDataSource`, trains
each registered method's (`registry.METHODS`, from its `smoke` config, and
the heterogeneous variants) dataset-taking process
(`experiment.build_dataset_process`) for 2 rounds, then resumes for a third
from its own program state. The rounds it runs equal `experiment.run`'s
keyed rounds (the fast path): the same clients, shuffles, per-client seeds
and model. One exception, homogeneous FedD3A: its keyed clients read their
dataset twice (projection, then training) and TF reshuffles the second pass,
while a `ClientDataSource` dataset gives the same batches on every pass; its
2 + 1 rounds are checked against 3 straight `train_model` rounds instead.
"""

import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import helpers
from tff_kd.runtime import aio
from tff_kd.program import checkpoints
from tff_kd.program import experiment
from tff_kd.program import sampling
from tff_kd.program import state_files
from tff_kd.program import tff_programs


class _Recorder(tff.program.ReleaseManager):
  """Keeps every released (key, value)."""

  def __init__(self):
    self.released = {}

  async def release(self, value, key):
    self.released[key] = value


def _manager(root: str, method: str) -> tff.program.FileProgramStateManager:
  """TFF's own state manager for FedAvg, the library's for the others."""
  cls = (tff.program.FileProgramStateManager if method == 'fedavg' else
         checkpoints.CheckpointManager)
  return cls(os.path.join(root, 'checkpoints'))


def _train(exp, process, root: str, rounds: int, recorder,
           eval_recorder=None) -> None:
  source = tff_programs.ClientDataSource.for_process(
      process, exp.client_data, exp.settings.local_work,
      seed=exp.settings.run.seed)
  manager = _manager(root, exp.settings.run.method)
  initial = process.set_model_weights(
      process.initialize(), checkpoints.seeded_initial_weights(exp.model_fn))
  with tff.framework.get_context_stack().install(
      tff_programs.native_context()):
    evaluation = None if eval_recorder is None else (
        tff_programs.build_evaluation_manager(
            exp, root, num_clients=4, cohort_size=2,
            metrics_manager=eval_recorder))
    aio.run_sync(tff.learning.programs.train_model(
        train_process=process, initial_train_state=initial,
        train_data_source=source,
        train_per_round_clients=exp.settings.run.clients_per_round,
        train_total_rounds=rounds, program_state_manager=manager,
        model_output_manager=tff.program.LoggingReleaseManager(),
        train_metrics_manager=recorder, evaluation_manager=evaluation,
        evaluation_periodicity=1))


def _keyed_rounds(exp):
  """The state after `experiment.run`'s rounds: the same seeded start,
  client samples and keys (the keyed fast path)."""
  rs = exp.settings.run
  state = exp.process.set_model_weights(
      exp.process.initialize(),
      checkpoints.seeded_initial_weights(exp.model_fn))
  for round_num in range(rs.rounds):
    clients = sampling.sample_clients(
        exp.settings.partition.num_clients, rs.clients_per_round,
        seed=rs.seed, round_num=round_num)
    state = exp.process.next(state, exp.client_data.keys(
        clients, seed=rs.seed, round_num=round_num)).state
  return state


def _saved_state(exp, process, root: str):
  """`train_model`'s newest program state in `root`."""
  manager = _manager(root, exp.settings.run.method)
  version = aio.run_sync(manager.get_versions())[-1]
  return aio.run_sync(manager.load(
      version, tff.learning.programs.ProgramState(
          process.initialize(), 0, 0,
          tff_programs.ClientDataSource.for_process(
              process, exp.client_data, exp.settings.local_work,
              seed=exp.settings.run.seed).iterator())))


@pytest.fixture
def one_fed_eval_build(monkeypatch):
  """`tff.learning.algorithms.build_fed_eval`, built once per test.

  `build_evaluation_manager` builds its evaluation process once per manager
  (the manager asks for one at every evaluation); a test here makes two
  managers of the same model, one per `train_model` run, and this shares
  the build between them. Each manager still creates, initialises and runs
  an evaluation every round.
  """
  real = tff.learning.algorithms.build_fed_eval
  built = []

  def build_once(*args, **kwargs):
    if not built:
      built.append(real(*args, **kwargs))
    return built[0]

  monkeypatch.setattr(tff.learning.algorithms, 'build_fed_eval', build_once)
  return built


# Every method and client-data form (heterogeneous models).
CASES = helpers.smoke_cases()


@pytest.mark.parametrize('method', [
    m if m == 'fedavg' else pytest.param(m, marks=pytest.mark.slow)
    for m in CASES])
def test_train_model_trains_and_resumes_like_experiment_run(
    tmp_path, method, one_fed_eval_build):
  config = helpers.smoke_config(method, rounds=3)
  exp = experiment.prepare(config, str(tmp_path / 'keyed'))
  process = experiment.build_dataset_process(exp)
  recorder = _Recorder()
  # TFF's federated evaluation reads only the global model
  # (`get_model_weights`), the same for every method: FedAvg's case runs it.
  eval_recorder = _Recorder() if method == 'fedavg' else None
  program_root = str(tmp_path / 'program')
  _train(exp, process, program_root, 2, recorder, eval_recorder)
  # Resumes after round 2, from train_model's own program state.
  _train(exp, process, program_root, 3, recorder, eval_recorder)
  assert sorted(recorder.released) == [1, 2, 3]
  if eval_recorder is not None:
    # TFF's federated evaluation (build_fed_eval) of every round's model.
    assert sorted(eval_recorder.released) == [1, 2, 3]
    assert len(one_fed_eval_build) == 1
    for value in eval_recorder.released.values():
      accuracy = float(value['model_metrics']['sparse_categorical_accuracy'])
      assert 0.0 <= accuracy <= 1.0
  # TFF re-homes `client_work/train` as `model_metrics`.
  train = recorder.released[3]['model_metrics']
  assert float(train['num_clients']) == config.clients_per_round
  assert float(train['num_excluded']) == 0.0
  saved = _saved_state(exp, process, program_root)
  assert saved.round_number == 3
  assert state_files.exists(os.path.join(
      program_root, 'checkpoints', 'program_state_3')) == (method != 'fedavg')
  assert saved.data_iterator.round_num == 3
  if method == 'fedd3a':
    straight_root = str(tmp_path / 'straight')
    _train(exp, process, straight_root, 3, _Recorder())
    want = tf.nest.flatten(process.get_model_weights(
        _saved_state(exp, process, straight_root).state))
  else:
    want = tf.nest.flatten(exp.process.get_model_weights(_keyed_rounds(exp)))
  got = tf.nest.flatten(process.get_model_weights(saved.state))
  for a, b in zip(want, got):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0,
                               atol=1e-5)


def test_evaluation_manager_builds_its_process_once(tmp_path, monkeypatch):
  # The manager asks for an evaluation process at every evaluation; the
  # build (about a training round's cost) happens once per manager.
  real = tff.learning.algorithms.build_fed_eval
  calls = []

  def counted(*args, **kwargs):
    calls.append(1)
    return real(*args, **kwargs)

  monkeypatch.setattr(tff.learning.algorithms, 'build_fed_eval', counted)
  exp = experiment.prepare(helpers.smoke_config('fedavg', rounds=3),
                           str(tmp_path / 'keyed'))
  process = experiment.build_dataset_process(exp)
  recorder, eval_recorder = _Recorder(), _Recorder()
  _train(exp, process, str(tmp_path / 'program'), 3, recorder, eval_recorder)
  assert sorted(eval_recorder.released) == [1, 2, 3]
  assert len(calls) == 1
