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
  in the background (`nohup cmd &`) would otherwise pass on as ignored;
* gRPC's fork handlers are off (`GRPC_ENABLE_FORK_SUPPORT=false` unless the
  environment says otherwise): every child here execs at once, and the
  handlers' "Other threads are currently calling into gRPC, skipping fork()
  handlers" line could land after a stopped run's one-line error (in about
  half of the SIGTERMs to a loaded run's process group).

The local contexts also set how the worker uses the cores
(`studies/speed/results/threads.md` measures it): at most `concurrent_clients`
client computations at a time (default: one per usable core) and
`intra_op_threads` threads inside each TensorFlow op (default 1). TF's own
defaults, unlimited calls that each spread every op over all cores, cost
this library's small models up to 1.6x per round on 2 cores. And they start
the worker as soon as the context is installed, so its start overlaps the
data loading and tracing that come before the first call, and poll it for
readiness every 10 ms instead of TFF's 1 s (which cost every run a second).

Programs opt in with `install()`, first thing, before TensorFlow Federated
is imported: the binaries, tests/conftest.py, the notebook and the
studies' mains call it. It installs the reaper and defers importing
tensorflow_probability to its first use (`defer_import`). Importing
`tff_kd` does neither. Builders in this library never set a context
themselves; callers pick one (`set_local_context` for simulation), which keeps
the processes runnable under any future multi-worker context.
"""

import atexit
import ctypes
import ctypes.util
import gc
import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
import types
from typing import Any, Optional

_PR_SET_PDEATHSIG = 1
_children: list[subprocess.Popen] = []
_lock = threading.Lock()
_installed = False
_READY_POLL_S = 0.01
# Environment added to every worker's (e.g. TF_NUM_INTRAOP_THREADS).
_worker_env: dict[str, str] = {}
# A worker started ahead of TFF's request: (its exact command, process).
_prestarted: Optional[tuple[list[str], subprocess.Popen]] = None


_libc: Optional[ctypes.CDLL] = None


def _load_libc() -> ctypes.CDLL:
  """libc, looked up once in this process (`find_library` runs
  `ldconfig`: a fork that must not happen in a forked child)."""
  global _libc
  if _libc is None:
    _libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6',
                        use_errno=True)
  return _libc


def _die_with_parent() -> None:
  """Runs in the forked child before exec; Linux only, best effort."""
  _load_libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  # TFF stops its worker with SIGINT and then waits for it without a
  # timeout. A process started in the background (`nohup cmd &`) inherits an
  # ignored SIGINT, so its worker would never stop and Python would hang at
  # exit: give the worker the default handler back.
  signal.signal(signal.SIGINT, signal.SIG_DFL)


class _ReapedPopen(subprocess.Popen):
  """`subprocess.Popen` that registers the child for reaping."""

  def __init__(self, *args: Any, **kwargs: Any):
    if sys.platform.startswith('linux'):
      _load_libc()  # Here, not in the child.
      kwargs.setdefault('preexec_fn', _die_with_parent)
    if _worker_env and kwargs.get('env') is None:
      kwargs['env'] = {**os.environ, **_worker_env}
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
  global _prestarted
  with _lock:
    children = list(_children)
    _children.clear()
    _prestarted = None
  killed = sum(_kill_keeping_zombie(c) for c in children)
  if 'tensorflow_federated' in sys.modules:
    from tensorflow_federated.python.core.impl.context_stack import set_default_context  # pylint: disable=g-import-not-at-top
    set_default_context.set_no_default_context()
    gc.collect()
  for child in children:
    child.poll()  # Reaps what TFF's clean-up did not.
  return killed


def _kill_if_alive(pid: int, unused_signum: int) -> None:
  """`os.kill` with SIGKILL, doing nothing for a pid that is gone."""
  _signal_if_alive(pid, signal.SIGKILL)


def exit_quietly() -> None:
  """`shutdown`, at exit, for a process that imported TFF without `install()`.

  Importing TFF sets its local C++ context as the default; dropped only in
  interpreter teardown, after `subprocess` is gone, its clean-up printed
  "Exception ignored in: ... ServiceManager.__del__ ... AttributeError:
  'NoneType' object has no attribute 'Popen'" (and left a worker it had
  started running). Dropped here, while modules are alive, the clean-up
  stops the worker; with SIGKILL, as a worker that inherited an ignored
  SIGINT (a program started in the background) would never stop on TFF's
  SIGINT and the exit would wait for it forever. `tff_kd` registers this
  with `atexit` when it is imported; `install()` registers `shutdown`
  itself, so then this does nothing.
  """
  if _installed:
    return
  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory  # pylint: disable=g-import-not-at-top
  executor_factory.os = types.SimpleNamespace(path=os.path,
                                              kill=_kill_if_alive)
  shutdown()


def start_reaped(args: list[str]) -> subprocess.Popen:
  """Starts a child (e.g. a `worker_binary` service) that dies with us.

  Its output is discarded: workers log every request.
  """
  return _ReapedPopen(args, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)


def _signal_if_alive(pid: int, signum: int) -> None:
  """`os.kill`, doing nothing for a pid that is gone."""
  try:
    os.kill(pid, signum)
  except ProcessLookupError:
    pass


def install_worker_reaper() -> None:
  """Makes TFF's local executor factory start reaped `worker_binary`s."""
  global _installed
  if _installed:
    return
  # Imported lazily: TFF import is slow and not every tff_kd user needs it.
  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory  # pylint: disable=g-import-not-at-top

  # Only the module's own references are replaced; `subprocess` and
  # `portpicker` elsewhere are untouched.
  executor_factory.subprocess = types.SimpleNamespace(Popen=_TffPopen)
  # TFF's clean-up signals its worker's pid; `shutdown` may have reaped it
  # already (when the context outlives `shutdown`'s collection, e.g. held by
  # a stopped run's traceback), and the late signal raised ProcessLookupError
  # into a traceback printed at exit.
  executor_factory.os = types.SimpleNamespace(path=os.path,
                                              kill=_signal_if_alive)
  executor_factory.portpicker = types.SimpleNamespace(
      pick_unused_port=_pick_port)
  # TFF polls a new worker's channel every 1 s and looks before the channel
  # has had a chance to connect, so every local context paid a full second
  # before its first call. The worker is local: poll every 10 ms.
  executor_factory._LOCALHOST_SERVER_WAIT_TIME_SEC = _READY_POLL_S  # pylint: disable=protected-access
  atexit.register(shutdown)
  _installed = True


class _TffPopen(_ReapedPopen):
  """The `Popen` of TFF's local executor factory (a class: TFF checks
  `isinstance` on it). It hands out the prestarted worker when TFF asks
  for exactly its command; any other prestarted worker is stopped."""

  def __new__(cls, args: list[str], *unused_args: Any, **unused_kwargs: Any):
    global _prestarted
    with _lock:
      prestarted, _prestarted = _prestarted, None
    if prestarted is not None:
      command, process = prestarted
      if list(args) == command and process.poll() is None:
        return process
      _kill_keeping_zombie(process)
      process.poll()
    return super().__new__(cls)

  def __init__(self, *args: Any, **kwargs: Any):
    if getattr(self, '_started', False):  # The prestarted worker, handed out.
      return
    super().__init__(*args, **kwargs)
    self._started = True


class _Deferred(types.ModuleType):
  """Stands in for a module until one of its attributes is asked for."""

  def __getattr__(self, attr: str):  # Only for attributes it lacks.
    name = self.__name__
    if sys.modules.get(name) is self:
      del sys.modules[name]
      try:
        importlib.import_module(name)
      except BaseException:
        sys.modules.setdefault(name, self)
        raise
    return getattr(sys.modules[name], attr)


def defer_import(name: str) -> None:
  """Imports module `name` at its first attribute access, not before.

  TFF imports tensorflow_privacy, whose discrete-Gaussian sampler imports
  tensorflow_probability at module level but uses it only inside functions
  that this library never calls: 0.35 s of every start-up
  (studies/speed/README.md, side by side). Until an attribute is asked for,
  `sys.modules[name]` is a stand-in; then the real module is imported, and
  the stand-in forwards to it. (`importlib.util.LazyLoader` does not help:
  Python 3.11's import statement reads `__spec__`, which loads it.)
  Nothing happens if the module is already imported or not installed.
  """
  if name in sys.modules:
    return
  spec = importlib.util.find_spec(name)
  if spec is None:
    return
  stand_in = _Deferred(name)
  stand_in.__spec__ = spec
  stand_in.__loader__ = spec.loader
  # Code that scans `sys.modules` for a file (AutoGraph does, on every
  # function it converts; so does `inspect.getmodule`) must not load it.
  stand_in.__file__ = spec.origin
  sys.modules[name] = stand_in


def install() -> None:
  """Opts the program in to tff_kd's process set-up; call it first thing.

  Defers tensorflow_probability (`defer_import`), which has to happen
  before TensorFlow Federated is imported to save its start-up time, then
  installs the worker reaper (`install_worker_reaper`), with gRPC's fork
  handlers off unless `GRPC_ENABLE_FORK_SUPPORT` is set. Safe to call twice.
  """
  # Read when gRPC starts, so before TensorFlow Federated is imported.
  os.environ.setdefault('GRPC_ENABLE_FORK_SUPPORT', 'false')
  defer_import('tensorflow_probability')
  install_worker_reaper()


def _pick_port() -> int:
  """TFF's port picker: the prestarted worker's port while one waits."""
  with _lock:
    if _prestarted is not None:
      return int(_prestarted[0][1].split('=')[1])
  import portpicker  # pylint: disable=g-import-not-at-top
  return portpicker.pick_unused_port()


def _worker_command(port: int, max_calls: int) -> list[str]:
  """The command TFF's local executor factory starts a worker with."""
  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory  # pylint: disable=g-import-not-at-top
  binary = os.path.join(os.path.dirname(executor_factory.__file__), '..',
                        '..', '..', '..', 'data', 'worker_binary')
  return [binary, f'--port={port}',
          f'--max_concurrent_computation_calls={max_calls}']


def _prestart(max_calls: int) -> None:
  """Starts the worker TFF's next local context will ask for."""
  global _prestarted
  import portpicker  # pylint: disable=g-import-not-at-top
  command = _worker_command(portpicker.pick_unused_port(), max_calls)
  process = _TffPopen(command)  # Stops a previous one never asked for.
  with _lock:
    _prestarted = (command, process)


def usable_cores() -> int:
  """The cores this process may run on (its CPU affinity)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not Linux.
    return os.cpu_count() or 1


def max_concurrent_calls(concurrent_clients: int) -> int:
  """TFF's `max_concurrent_computation_calls` for `concurrent_clients`:
  0 is one per usable core, -1 no limit (TFF's default)."""
  if concurrent_clients < -1:
    raise ValueError(f'concurrent_clients must be >= -1, got '
                     f'{concurrent_clients}')
  return usable_cores() if concurrent_clients == 0 else concurrent_clients


def threads_env(intra_op_threads: int) -> dict[str, str]:
  """The environment giving a worker `intra_op_threads` threads inside each
  TensorFlow op (0: TensorFlow's default, every core)."""
  if intra_op_threads < 0:
    raise ValueError(f'intra_op_threads must be >= 0, got '
                     f'{intra_op_threads}')
  return ({'TF_NUM_INTRAOP_THREADS': str(intra_op_threads)}
          if intra_op_threads else {})


def setup_local_worker(*, concurrent_clients: int = 0,
                       intra_op_threads: int = 1,
                       prestart: bool = True) -> int:
  """Readies the worker of the next local C++ context to be created.

  Installs the reaper, sets the worker's threads and (`prestart`) starts
  it now, so that it is up by the first call.

  Args:
    concurrent_clients: Client computations the worker runs at a time (0:
      one per usable core; -1: no limit, TFF's default).
    intra_op_threads: Threads inside each TensorFlow op in the worker (0:
      TensorFlow's default, every core).
    prestart: Start the worker now rather than at the first call.

  Returns:
    The `max_concurrent_computation_calls` to create the context with.
  """
  calls = max_concurrent_calls(concurrent_clients)
  env = threads_env(intra_op_threads)
  with _lock:
    _worker_env.clear()
    _worker_env.update(env)
  install_worker_reaper()
  if prestart:
    _prestart(calls)
  return calls


def set_local_context(*, grappler: str = 'server', **kwargs: Any) -> None:
  """Installs TFF's synchronous local C++ context, with the reaper.

  Args:
    grappler: Where the computations' graphs are optimised
      (`tff_kd.runtime.graph_rewrites`): 'server' (TFF's way, once in this
      process, except the KD server steps, which the worker optimises for
      its devices) | 'static' (all TFF's way) | 'worker' (all by the
      worker).
    **kwargs: As in `setup_local_worker`.

  Raises:
    ValueError: an unknown `grappler`.
  """
  _install_local(_compiler_fn(grappler), **kwargs)


def set_test_context(*, grappler: str = 'server', **kwargs: Any) -> None:
  """Installs TFF's synchronous *test* C++ context, with the reaper.

  The same runtime as `set_local_context` (and the same arguments), but it
  also implements the secure-aggregation intrinsics
  (`tff.federated_secure_sum_bitwidth`, used by
  `tff.aggregators.SecureSumFactory`) by rewriting them to plain sums, as
  simulation needs; the local context rejects them. DaFKD's private mode
  (appendix B) runs under it.

  Raises:
    ValueError: an unknown `grappler`.
  """
  _install_local(_compiler_fn(grappler, test=True), **kwargs)


def _compiler_fn(grappler: str, *, test: bool = False) -> Any:
  """The `compiler_fn` of `runtime.grappler=grappler`, for the test
  context (secure sums) if `test`.

  Raises:
    ValueError: an unknown `grappler`.
  """
  from tff_kd.runtime import graph_rewrites  # pylint: disable=g-import-not-at-top

  return (graph_rewrites.test_compiler_for(grappler) if test else
          graph_rewrites.compiler_for(grappler))


def _install_local(compiler_fn: Any, **kwargs: Any) -> None:
  """Installs a local C++ context compiling with `compiler_fn`; `kwargs`
  as in `setup_local_worker`."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_kd.runtime import graph_rewrites  # pylint: disable=g-import-not-at-top

  tff.framework.set_default_context(graph_rewrites.local_context(
      setup_local_worker(**kwargs), compiler_fn))


def compiler_cache() -> Any:
  """The current context's compiler cache (TFF's `CompilerPipeline`), or
  None for a context without one. The context stack is per thread: look it
  up on the thread that installed the context."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  current = tff.framework.get_context_stack().current
  # TFF 0.87's sync contexts wrap an async one that owns the cache.
  owner = getattr(current, '_async_context', current)
  return getattr(owner, '_compiler_pipeline', None)


def precompile(*computations: Any, cache: Any = None) -> int:
  """Compiles computations for a context before their first call.

  TFF compiles a computation for its runtime on its first call (0.5 s for
  a FedAvg round's `next` here) and caches the result in the context; this
  fills that cache ahead of time, so the first round costs what later ones
  do. Anything that is not a `tff.Computation` is skipped.

  Args:
    *computations: What to compile.
    cache: A `compiler_cache()` (default: this thread's current context's),
      so that another thread can compile for it.

  Returns:
    How many computations were compiled: 0 under a context without a
    compiler cache.
  """
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  cache = cache if cache is not None else compiler_cache()
  if cache is None:
    return 0
  compiled = [c for c in computations if isinstance(c, tff.Computation)]
  for computation in compiled:
    cache.compile(computation)
  return len(compiled)


def freeze_imported_objects() -> float:
  """Hides every object alive now from Python's garbage collector.

  For programs (the `train` binary), right after TensorFlow and TFF are
  imported: their ~10^6 long-lived objects are then never traversed again,
  neither by later collections nor by the full one at interpreter exit
  (0.9 s here, 0.15 s frozen). Objects that die later are still freed as
  usual; only cycles among the frozen ones would never be collected, so a
  library never calls this for its users.

  Returns:
    The seconds it took (one full collection first, ~0.15 s).
  """
  start = time.perf_counter()
  gc.collect()
  gc.freeze()
  return time.perf_counter() - start


def set_context_for(needs_secure_sum: bool, **kwargs: Any) -> None:
  """The test context if the process uses secure sums, else the local one;
  `kwargs` go to either (`set_local_context`)."""
  if needs_secure_sum:
    set_test_context(**kwargs)
  else:
    set_local_context(**kwargs)
