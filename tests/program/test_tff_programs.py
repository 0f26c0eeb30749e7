"""TFF's own program logic drives every tff_kd method.

`tff.learning.programs.train_model`, with TFF's `FileProgramStateManager`, a
train-metrics release manager and `ClientDataSource`, trains each method's
dataset-taking process (`experiment.build_dataset_process`) for 2 rounds,
then resumes for a third from its own program state. The rounds it runs
equal `experiment.run`'s keyed rounds (the fast path): the same clients,
shuffles, per-client seeds and model.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.program.test_experiment import _config
from tests.program.test_faults import METHOD_CASES
from tff_kd.program import experiment
from tff_kd.program import tff_programs


class _Recorder(tff.program.ReleaseManager):
  """Keeps every released (key, value)."""

  def __init__(self):
    self.released = {}

  async def release(self, value, key):
    self.released[key] = value


def _train(exp, process, root: str, rounds: int, recorder) -> None:
  config = exp.config
  source = tff_programs.ClientDataSource.for_process(
      process, exp.client_data, experiment.local_work(config),
      seed=config.seed)
  manager = tff.program.FileProgramStateManager(root)
  initial = process.set_model_weights(
      process.initialize(), experiment._seeded_initial_weights(exp.model_fn))  # pylint: disable=protected-access
  with tff.framework.get_context_stack().install(
      tff_programs.native_context()):
    experiment._sync(tff.learning.programs.train_model(  # pylint: disable=protected-access
        train_process=process, initial_train_state=initial,
        train_data_source=source,
        train_per_round_clients=config.clients_per_round,
        train_total_rounds=rounds, program_state_manager=manager,
        model_output_manager=tff.program.LoggingReleaseManager(),
        train_metrics_manager=recorder, evaluation_manager=None,
        evaluation_periodicity=1))


CASES = {**METHOD_CASES, 'feddf_hetero': {
    **METHOD_CASES['feddf'], 'feddf.prototypes': 'cnn,cnn:group'}}


@pytest.mark.parametrize('method', [
    m if m == 'fedavg' else pytest.param(m, marks=pytest.mark.slow)
    for m in sorted(CASES)])
def test_train_model_trains_and_resumes_like_experiment_run(tmp_path,
                                                            method):
  config = _config(rounds=3, export=False, **CASES[method])
  keyed_root = str(tmp_path / 'keyed')
  experiment.run(config, keyed_root, progress=False)
  exp = experiment.prepare(config, keyed_root)
  process = experiment.build_dataset_process(exp)
  recorder = _Recorder()
  program_root = str(tmp_path / 'program')
  _train(exp, process, program_root, 2, recorder)
  _train(exp, process, program_root, 3, recorder)  # Resumes after round 2.
  assert sorted(recorder.released) == [1, 2, 3]
  # TFF re-homes `client_work/train` as `model_metrics`.
  train = recorder.released[3]['model_metrics']
  assert float(train['num_clients']) == config.clients_per_round
  assert float(train['num_excluded']) == 0.0
  state, _ = experiment.load_state(config, keyed_root)
  manager = tff.program.FileProgramStateManager(program_root)
  versions = experiment._sync(manager.get_versions())  # pylint: disable=protected-access
  assert versions[-1] == 3
  saved = experiment._sync(manager.load(  # pylint: disable=protected-access
      3, tff.learning.programs.ProgramState(
          process.initialize(), 0, 0,
          tff_programs.ClientDataSource.for_process(
              process, exp.client_data, experiment.local_work(config),
              seed=config.seed).iterator())))
  assert saved.round_number == 3
  assert saved.data_iterator.round_num == 3
  want = tf.nest.flatten(exp.process.get_model_weights(state))
  got = tf.nest.flatten(process.get_model_weights(saved.state))
  for a, b in zip(want, got):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0,
                               atol=1e-5)
