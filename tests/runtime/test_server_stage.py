"""A KD method's server step run in the driver gives the in-runtime round.

`runtime.server_device='driver'` (or a device string) runs the method's own
server function in the driver's TensorFlow (`tff_kd.runtime.server_stage`).
On CPU it must give the same student as the TFF runtime, from the same
state and clients. FedDF's distillation agrees to float round-off; FedFTG's
generator-driven fine-tuning, whose Adam steps on near-zero gradients
amplify round-off, to 1e-4 on the classifier (both modes are exactly
reproducible on their own; measured in BUILD_NOTES.md). Every registered
method is checked from its `smoke` config; one without a server step
(`Method.server_step=False`) must be refused instead.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from tests.helpers import digits_config as _config
from tff_kd import errors
from tff_kd.methods import registry
from tff_kd.program import checkpoints
from tff_kd.program import experiment
from tff_kd.program import sampling
from tff_kd.runtime import server_stage


def _leaves(structure) -> list[np.ndarray]:
  return [np.asarray(v) for v in tf.nest.flatten(structure)]


# The driver's student agrees with the runtime's to 1e-5 unless said here.
ATOL = {'fedftg': 1e-4}
# DaFKD's recipe (lr 0.01 at T = 20, a T^2 = 400 gradient scale) carries
# the two paths' round-off into the 1e-4s; the comparison is of the paths,
# so DaFKD distils here at the section's lr 1e-3 and T = 1.
OVERRIDES = {'dafkd': {'distill.learning_rate': 1e-3,
                       'distill.temperature': 1.0}}


@pytest.mark.parametrize('method', [
    pytest.param(m, marks=pytest.mark.slow)
    if m != 'feddf' and registry.get_method(m).server_step else m
    for m in registry.METHODS])
def test_driver_server_step_gives_the_runtime_student(tmp_path, method):
  config = helpers.smoke_config(method, rounds=1)
  experiment.with_overrides(config, OVERRIDES.get(method, {}))
  if not registry.get_method(method).server_step:
    config.runtime.server_device = 'driver'
    with pytest.raises(errors.ConfigError,
                       match=f'{method} has no server step'):
      experiment.run(config, str(tmp_path / 'run'))
    assert not list(tmp_path.iterdir())
    return
  atol = ATOL.get(method, 1e-5)
  exp = experiment.prepare(config, str(tmp_path))
  driver = server_stage.DriverServerProcess(exp.process, '/CPU:0')
  start = exp.process.set_model_weights(
      exp.process.initialize(),
      checkpoints.seeded_initial_weights(exp.model_fn))
  clients = sampling.sample_clients(config.partition.num_clients,
                                    config.clients_per_round,
                                    seed=config.seed, round_num=0)
  keys = exp.client_data.keys(clients, seed=config.seed, round_num=0)
  in_runtime = exp.process.next(start, keys)
  in_driver = driver.next(start, keys)
  driver.close()
  students = [exp.process.get_model_weights(o.state)
              for o in (in_runtime, in_driver)]
  for a, b in zip(*map(_leaves, students)):
    np.testing.assert_allclose(a, b, rtol=0, atol=atol)
  # Same state type and containers: the driver's state feeds the runtime.
  assert (tf.nest.map_structure(np.shape, in_runtime.state) ==
          tf.nest.map_structure(np.shape, in_driver.state))
  exp.process.next(in_driver.state, keys)
  runtime_metrics = in_runtime.metrics['finalizer']
  driver_metrics = in_driver.metrics['finalizer']
  assert list(driver_metrics) == list(runtime_metrics)
  if 'num_teachers' in runtime_metrics:  # KD methods that stack teachers.
    assert float(driver_metrics['num_teachers']) == 3.0


def test_run_resumes_a_runtime_run_with_the_server_in_the_driver(tmp_path):
  """`runtime.server_device` may change on resume: the state type is the
  same, so a runtime-mode checkpoint continues in driver mode."""
  root = str(tmp_path)
  first = _config(rounds=1, export=False, **helpers.method_overrides('feddf'))
  experiment.run(first, root)
  second = _config(rounds=2, export=False, **helpers.method_overrides('feddf'))
  second.runtime.server_device = '/CPU:0'
  result = experiment.run(second, root)
  assert result.resumed_after == 1
  (metrics,) = result.history
  assert metrics['distill/num_teachers'] == 3.0
  assert 0.0 <= result.final['test/accuracy'] <= 1.0


@pytest.mark.parametrize('method,device,match', [
    ('fedavg', 'driver', 'fedavg has no server step'),
    ('fedprox', '/CPU:0', 'fedprox has no server step'),
    ('feddf', 'GPU0', "must be 'runtime', 'driver' or a TensorFlow"),
    ('feddf', '/job:a', "must be 'runtime', 'driver' or a TensorFlow"),
])
def test_bad_server_device_fails_before_any_compute(tmp_path, method, device,
                                                    match):
  config = _config(**helpers.method_overrides(method))
  config.runtime.server_device = device
  with pytest.raises(errors.ConfigError, match=match):
    experiment.run(config, str(tmp_path))
  assert not list(tmp_path.iterdir())
