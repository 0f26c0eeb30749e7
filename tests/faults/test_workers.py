"""Worker faults are bounded by `runtime.worker_timeout_s`.

Real `worker_binary` services on loopback ports, driven in this process
through `tff_kd.runtime.workers.remote_context` with a short timeout. A
worker killed between rounds ends the next round with `WorkerError` within
the timeout plus a few seconds (it used to take 2-3 timeouts: every failing
call waited the full timeout); a worker that comes back within the timeout
has its sub-round retried, and the round is the one it would have been.
(The `train` binary's one line and the resume after a dead worker:
tests/runtime/test_workers.py.)
"""

import subprocess
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.helpers import digits_config
from tff_kd.program import experiment
from tff_kd.runtime import workers
from tff_kd.program import sampling

_TIMEOUT_S = 3.0


@pytest.fixture
def two_workers():
  started = workers.start_local_workers(2)
  yield started
  workers.stop_workers(started)


def _first_round(started, timeout_s: float, root: str):
  """(experiment, context, round 1's output, round 2's keys)."""
  config = digits_config(rounds=2, export=False)
  ctx = workers.remote_context([a for a, _ in started], timeout_s=timeout_s)
  with tff.framework.get_context_stack().install(ctx):
    exp = experiment.prepare(config, root)
    keys = [exp.client_data.keys(
        sampling.sample_clients(6, 3, seed=config.seed, round_num=r),
        seed=config.seed, round_num=r) for r in (0, 1)]
    output = exp.process.next(exp.process.initialize(), keys[0])
  return exp, ctx, output, keys[1]


def test_a_dead_worker_ends_the_round_within_the_timeout(tmp_path,
                                                          two_workers):
  exp, ctx, output, keys = _first_round(two_workers, _TIMEOUT_S,
                                        str(tmp_path))
  (_, proc), address = two_workers[1], two_workers[1][0]
  proc.kill()
  proc.wait()
  start = time.monotonic()
  with tff.framework.get_context_stack().install(ctx):
    with pytest.raises(workers.WorkerError,
                       match=f'worker {address} is unreachable'):
      exp.process.next(output.state, keys)
  seconds = time.monotonic() - start
  print(f'dead worker, timeout {_TIMEOUT_S:g} s: WorkerError after '
        f'{seconds:.1f} s')
  assert _TIMEOUT_S <= seconds < _TIMEOUT_S + 5, seconds


def test_a_worker_back_within_the_timeout_has_its_round_retried(
    tmp_path, two_workers):
  exp, ctx, output, keys = _first_round(two_workers, 60.0, str(tmp_path))
  with tff.framework.get_context_stack().install(ctx):
    expected = exp.process.next(output.state, keys)
  address, proc = two_workers[1]
  proc.kill()
  proc.wait()
  back = []
  # Restarted from a thread, a worker reaped with its parent thread would
  # die with it (PR_SET_PDEATHSIG is per thread): a plain child, killed
  # below.
  timer = threading.Timer(1.0, lambda: back.append(subprocess.Popen(
      workers.worker_command(int(address.rsplit(':', 1)[1])),
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
  timer.start()
  try:
    with tff.framework.get_context_stack().install(ctx):
      again = exp.process.next(output.state, keys)
  finally:
    timer.join()
    for p in back:
      p.kill()
      p.wait()
  assert back, 'the worker was not restarted'
  for a, b in zip(tf.nest.flatten(exp.process.get_model_weights(again.state)),
                  tf.nest.flatten(
                      exp.process.get_model_weights(expected.state))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0,
                               atol=1e-6)
