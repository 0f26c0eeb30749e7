"""No `worker_binary` survives a Python process, even one that is SIGKILLed."""

import os
import signal
import subprocess
import sys
import textwrap
import uuid

import psutil
import pytest

from tests.conftest import live_workers
from tests.conftest import tagged_workers
from tests.conftest import wait_for_no_tagged_workers
from tests.conftest import WORKER_TAG_ENV

_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from tff_kd.runtime import context
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


# Scripts that import tff_kd and use TFF without `context.install()`.
_MEAN = textwrap.dedent("""
    import numpy as np
    import tff_kd
    from tff_kd.runtime import context
    from tff_kd.program import experiment  # Imports TFF.
    import tensorflow_federated as tff

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def mean(x):
      return tff.federated_mean(x)
""")
_WITHOUT_INSTALL = {
    'import': _MEAN,  # TFF's default context is set, never used.
    'default_context': _MEAN + 'assert mean([1.0, 3.0]) == 2.0\n',
    'local_context': _MEAN + ('context.set_local_context()\n'
                              'assert mean([1.0, 3.0]) == 2.0\n'),
}


@pytest.mark.parametrize('case,background', [
    ('import', False), ('default_context', False), ('default_context', True),
    ('local_context', False)])
def test_exit_without_install_is_quiet_and_leaves_no_worker(
    case, background, tmp_path):
  tag = uuid.uuid4().hex  # Marks the script's workers (conftest.py).
  # Files, not pipes: a surviving worker would hold a pipe open.
  with open(tmp_path / 'out', 'w+') as out, open(tmp_path / 'err',
                                                'w+') as err:
    proc = subprocess.run(
        [sys.executable, '-c', _WITHOUT_INSTALL[case]], stdout=out,
        stderr=err, timeout=240,
        env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3',
             WORKER_TAG_ENV: tag},
        preexec_fn=_ignore_sigint if background else None)
    err.seek(0)
    stderr = err.read()
  try:
    assert proc.returncode == 0, stderr[-2000:]
    assert 'Exception ignored' not in stderr, stderr[-2000:]
    assert 'Traceback' not in stderr, stderr[-2000:]
    wait_for_no_tagged_workers(tag)
  finally:
    for worker in tagged_workers(tag):  # Only when the test failed.
      worker.kill()
