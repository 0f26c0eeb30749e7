"""TFF execution contexts whose `worker_binary` child cannot outlive Python.

TFF 0.87's local C++ context launches a `worker_binary` subprocess and only
stops it from a `__del__`. When Python exits abruptly (or is SIGKILLed) the
child survives, keeps the parent's stdout/stderr open, and pipelines such as
`pytest | tee log` never finish. `install_worker_reaper` closes both holes:

* every `worker_binary` is started with `PR_SET_PDEATHSIG=SIGKILL`, so the
  kernel kills it as soon as its parent dies, even on SIGKILL;
* an `atexit` hook kills and waits for every worker, then drops TFF's
  default context while modules are still alive (so TFF's own `__del__`
  finds its worker gone instead of printing a traceback during interpreter
  teardown, or waiting forever on a worker that ignores SIGINT);
* the worker gets the default SIGINT handler back, which a process started
  in the background (`nohup cmd &`) would otherwise pass on as ignored.

The reaper is installed when `tff_kd` is imported, so binaries, tests and
notebook kernels all get it. Builders in this library never set a context
themselves; callers pick one (`set_local_context` for simulation), which keeps
the processes runnable under any future multi-worker context.
"""

import atexit
import ctypes
import ctypes.util
import gc
import os
import signal
import subprocess
import sys
import threading
import types
from typing import Any

_PR_SET_PDEATHSIG = 1
_children: list[subprocess.Popen] = []
_lock = threading.Lock()
_installed = False


def _die_with_parent() -> None:
  """Runs in the forked child before exec; Linux only, best effort."""
  libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6',
                     use_errno=True)
  libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  # TFF stops its worker with SIGINT and then waits for it without a
  # timeout. A process started in the background (`nohup cmd &`) inherits an
  # ignored SIGINT, so its worker would never stop and Python would hang at
  # exit: give the worker the default handler back.
  signal.signal(signal.SIGINT, signal.SIG_DFL)


class _ReapedPopen(subprocess.Popen):
  """`subprocess.Popen` that registers the child for reaping."""

  def __init__(self, *args: Any, **kwargs: Any):
    if sys.platform.startswith('linux'):
      kwargs.setdefault('preexec_fn', _die_with_parent)
    super().__init__(*args, **kwargs)
    with _lock:
      _children.append(self)


def _kill_keeping_zombie(child: subprocess.Popen) -> bool:
  """SIGKILLs `child` if it runs and waits for it to exit, without reaping.

  The exited child stays a zombie, so TFF's own clean-up, which signals the
  pid and then waits for it, still finds it and returns at once.

  Returns:
    Whether the child was still running.
  """
  try:
    running = os.waitid(os.P_PID, child.pid,
                        os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
  except ChildProcessError:  # Already reaped.
    return False
  if running:
    os.kill(child.pid, signal.SIGKILL)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
  return running


def shutdown() -> int:
  """Stops every worker and TFF's default context; safe to call twice.

  Workers are killed first: TFF's own clean-up (run when the context is
  dropped) sends SIGINT and waits without a timeout, which hangs on a worker
  that does not stop. Afterwards it finds them exited and returns at once.

  Returns:
    How many workers were still running.
  """
  with _lock:
    children = list(_children)
    _children.clear()
  killed = sum(_kill_keeping_zombie(c) for c in children)
  if _installed:
    from tensorflow_federated.python.core.impl.context_stack import set_default_context  # pylint: disable=g-import-not-at-top
    set_default_context.set_no_default_context()
    gc.collect()
  for child in children:
    child.poll()  # Reaps what TFF's clean-up did not.
  return killed


def start_reaped(args: list[str]) -> subprocess.Popen:
  """Starts a child (e.g. a `worker_binary` service) that dies with us.

  Its output is discarded: workers log every request.
  """
  return _ReapedPopen(args, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)


def install_worker_reaper() -> None:
  """Makes TFF's local executor factory start reaped `worker_binary`s."""
  global _installed
  if _installed:
    return
  # Imported lazily: TFF import is slow and not every tff_kd user needs it.
  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory  # pylint: disable=g-import-not-at-top

  # Only the module's own reference is replaced; `subprocess` elsewhere is
  # untouched.
  executor_factory.subprocess = types.SimpleNamespace(Popen=_ReapedPopen)
  atexit.register(shutdown)
  _installed = True


def set_local_context() -> None:
  """Installs TFF's synchronous local C++ context, with the reaper."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  install_worker_reaper()
  tff.backends.native.set_sync_local_cpp_execution_context()


def set_test_context() -> None:
  """Installs TFF's synchronous *test* C++ context, with the reaper.

  The same runtime as `set_local_context`, but it also implements the
  secure-aggregation intrinsics (`tff.federated_secure_sum_bitwidth`, used
  by `tff.aggregators.SecureSumFactory`) by rewriting them to plain sums, as
  simulation needs; the local context rejects them. DaFKD's private mode
  (appendix B) runs under it.
  """
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  install_worker_reaper()
  tff.backends.test.set_sync_test_cpp_execution_context()


def set_context_for(needs_secure_sum: bool) -> None:
  """The test context if the process uses secure sums, else the local one."""
  if needs_secure_sum:
    set_test_context()
  else:
    set_local_context()
