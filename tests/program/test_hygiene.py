"""No `worker_binary` survives a Python process, even one that is SIGKILLed."""

import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from tests.conftest import live_workers

_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from tff_kd.program import context
    context.install()
    import tensorflow_federated as tff

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def mean(x):
      return tff.federated_mean(x)

    assert mean([1.0, 3.0]) == 2.0
    print('WORKERS', [p.pid for p in __import__('psutil').Process()
                      .children() if 'worker_binary' in p.name()], flush=True)
    if sys.argv[1] == 'kill':
      os.kill(os.getpid(), signal.SIGKILL)
""")


def _ignore_sigint() -> None:
  # What a shell does to a background job (`nohup train ... &`).
  signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize('ending', ['exit', 'kill', 'background-exit'])
def test_worker_dies_with_python(ending):
  proc = subprocess.run(
      [sys.executable, '-c', _SCRIPT, ending.split('-')[-1]],
      capture_output=True, text=True, timeout=240,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
      preexec_fn=_ignore_sigint if ending.startswith('background') else None)
  if ending == 'kill':
    assert proc.returncode == -signal.SIGKILL
  else:
    assert proc.returncode == 0, proc.stderr[-2000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith('WORKERS')][0]
  pids = eval(line.split(' ', 1)[1])  # pylint: disable=eval-used
  assert pids, 'the computation should have started a worker_binary'
  for pid in pids:
    try:
      p = psutil.Process(pid)
      p.wait(timeout=10)
    except (psutil.NoSuchProcess, psutil.TimeoutExpired):
      pass
  alive = [p.pid for p in live_workers() if p.pid in pids]
  assert not alive, f'worker_binary {alive} outlived its parent'
  # TFF's own __del__ must not spray a traceback at interpreter exit.
  assert 'Exception ignored' not in proc.stderr
