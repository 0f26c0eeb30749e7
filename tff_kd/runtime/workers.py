"""Several workers, on one machine or many: TFF's remote C++ runtime.

A worker is TFF's own executor service, the `worker_binary` that ships in
the `tensorflow-federated` wheel, listening for gRPC on a port
(`tff_kd_worker --port=8000`, see `binaries/worker.py`). The driver (the
`train` binary, a notebook, a pipeline) talks to the workers through
`remote_context`:

* one TFF `AsyncExecutionContext` per worker, each over a
  `RemoteExecutor` and a gRPC channel to that worker;
* TFF's `MergeableCompExecutionContext` on top: it compiles each round to
  mergeable form (the clients' part up to the aggregation, the merge, the
  server's part after it), runs the round's clients in one sub-round per
  worker, and merges the partial aggregates in order. The stacking
  aggregators (`tff_kd.core.stacking.slots_merge`) and per-client stores
  (`tff_kd.federated.client_store`) are `federated_aggregate`s with
  merges, so every method splits this way; a run gives the model of the
  one-worker run (tests/runtime/test_workers.py).

Faults: TFF retries a sub-round whose worker returns a retryable gRPC error
(UNAVAILABLE, ...) forever, so a dead worker hangs the driver. Each worker's
stub here waits at most `timeout_s` for the worker to come back and then
raises `WorkerError` naming it. The wait is shared by every call to that
worker (TFF makes several per sub-round, and more to clean up after a
failure), so a dead worker stops the run `timeout_s` after its first failed
call, not a multiple of it; the run stops before the round is
checkpointed, and the same command resumes once the worker is back.

Not supported on remote workers: secure sums (DaFKD's private mode), which
TFF's remote runtime does not implement (simulation rewrites them in the
test context); `check_supported` says so before any compute.
"""

import os
import re
import signal
import subprocess
import threading
import time
from typing import Sequence

from absl import logging
import grpc
import portpicker
import tensorflow_federated as tff
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import executors_errors
from tensorflow_federated.python.core.impl.executors import remote_executor
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub

from tff_kd import errors
from tff_kd.runtime import context
from tff_kd.runtime import graph_rewrites

# Models and client stacks travel as single messages.
_GRPC_OPTIONS = (('grpc.max_send_message_length', -1),
                 ('grpc.max_receive_message_length', -1))
_ADDRESS = re.compile(r'^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$')
_STUB_METHODS = ('get_executor', 'create_value', 'create_call',
                 'create_struct', 'create_selection', 'compute', 'dispose',
                 'dispose_executor')


class WorkerError(errors.UserError):
  """A worker that cannot be reached (stopped, crashed, network down)."""


def parse_workers(spec: str) -> list[str]:
  """'host:port,host:port' -> addresses; raises `ConfigError` if malformed."""
  addresses = [a.strip() for a in spec.split(',') if a.strip()]
  for address in addresses:
    if not _ADDRESS.match(address) or not 0 < int(
        address.rsplit(':', 1)[1]) < 65536:
      raise errors.ConfigError(
          f'runtime.workers: {address!r} is not host:port (e.g. '
          "'localhost:8000,10.0.0.2:8000')")
  if len(set(addresses)) != len(addresses):
    raise errors.ConfigError(f'runtime.workers lists a worker twice: {spec!r}')
  return addresses


def check_supported(needs_secure_sum: bool, workers: str) -> None:
  """Raises `ConfigError` for a malformed worker list or a process the
  remote runtime cannot run."""
  if parse_workers(workers) and needs_secure_sum:
    raise errors.ConfigError(
        'runtime.workers: secure sums (dafkd.private) run only in the '
        "local test context; TFF's remote workers do not implement them")


class _WorkerStub(remote_executor_grpc_stub.RemoteExecutorGrpcStub):
  """A worker's stub whose retryable failures end after `timeout_s` in all.

  The first failing call starts the worker's deadline, `timeout_s` away;
  every failing call until the worker answers again waits for it only up
  to that shared deadline (TFF makes several calls per sub-round, and its
  clean-up after a failure makes more: each waiting the full timeout made a
  dead worker cost 2-3 timeouts). A call that succeeds clears the deadline.
  """

  def __init__(self, address: str, timeout_s: float):
    self.address = address
    self._timeout_s = timeout_s
    self._deadline = None  # time.monotonic() by which it must be back.
    self._deadline_lock = threading.Lock()
    channel = grpc.insecure_channel(address, _GRPC_OPTIONS)
    super().__init__(channel)
    for name in _STUB_METHODS:
      setattr(self, name, self._guarded(getattr(super(), name)))

  def _wait_until_back(self, error: Exception) -> None:
    """Returns once the worker accepts connections again; raises
    `WorkerError` when the shared deadline passes first."""
    with self._deadline_lock:
      if self._deadline is None:
        self._deadline = time.monotonic() + self._timeout_s
      left = self._deadline - time.monotonic()
    try:
      grpc.channel_ready_future(self._channel).result(timeout=max(left, 0.0))
    except grpc.FutureTimeoutError:
      raise WorkerError(
          f'worker {self.address} is unreachable (no answer for '
          f'{self._timeout_s:g} s): {_grpc_message(error)}; the last '
          'checkpoint is intact: restart the worker and run the same '
          'command to resume') from None

  def _guarded(self, rpc):
    def call(request):
      try:
        response = rpc(request)
      except executors_errors.RetryableGRPCError as e:
        # TFF's context will retry; let it only if the worker is back.
        self._wait_until_back(e)
        raise
      with self._deadline_lock:
        self._deadline = None
      return response
    return call


def _grpc_message(e: Exception) -> str:
  cause = e.args[0] if e.args else e
  details = getattr(cause, 'details', None)
  return (details() if callable(details) else str(cause)).splitlines()[0]


def _worker_context(
    address: str, timeout_s: float,
    grappler: str) -> async_execution_context.AsyncExecutionContext:
  stub = _WorkerStub(address, timeout_s)

  def stack_fn(cardinalities):
    # Computations without client-placed arguments (e.g. `initialize`)
    # run with zero clients, as in TFF's local context.
    if cardinalities.get(tff.CLIENTS) is None:
      cardinalities[tff.CLIENTS] = 0
    executor = remote_executor.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  return async_execution_context.AsyncExecutionContext(
      executor_fn=python_executor_stacks.ResourceManagingExecutorFactory(
          executor_stack_fn=stack_fn),
      compiler_fn=graph_rewrites.compiler_for(grappler),
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)


def remote_context(workers: Sequence[str], *, timeout_s: float = 60.0,
                   grappler: str = graph_rewrites.DEFAULT):
  """A synchronous TFF context that runs rounds on `workers`.

  Args:
    workers: 'host:port' addresses of running worker services.
    timeout_s: How long a worker may stay unreachable before `WorkerError`.
    grappler: `runtime.grappler` (`tff_kd.runtime.graph_rewrites`).

  Returns:
    A TFF `MergeableCompExecutionContext`; install it with
    `set_remote_context` or `tff.framework.get_context_stack().install`.
  """
  if not workers:
    raise errors.ConfigError('remote_context needs at least one worker')
  if timeout_s <= 0:
    raise errors.ConfigError(
        f'runtime.worker_timeout_s must be > 0, got {timeout_s!r}')
  return tff.backends.native.create_mergeable_comp_execution_context(
      [_worker_context(a, timeout_s, grappler) for a in workers])


def set_remote_context(workers: Sequence[str], *, timeout_s: float = 60.0,
                       grappler: str = graph_rewrites.DEFAULT) -> None:
  """Installs `remote_context(workers)` as TFF's default context."""
  tff.framework.get_context_stack().set_default_context(
      remote_context(workers, timeout_s=timeout_s, grappler=grappler))


def worker_binary() -> str:
  """The path of TFF's `worker_binary` (shipped in the TFF wheel)."""
  return os.path.join(os.path.dirname(tff.__file__), 'data', 'worker_binary')


def worker_command(port: int, *, concurrent_clients: int = 0) -> list[str]:
  """The command that serves one worker on `port` (all interfaces),
  running `concurrent_clients` client computations at a time (as in
  `tff_kd.runtime.context.max_concurrent_calls`)."""
  calls = context.max_concurrent_calls(concurrent_clients)
  return [worker_binary(), f'--port={int(port)}',
          f'--max_concurrent_computation_calls={calls}']


def start_local_workers(count: int, *,
                        ready_timeout_s: float = 60.0) -> list[
                            tuple[str, subprocess.Popen]]:
  """Starts `count` workers on free localhost ports (tests, studies).

  They are reaped with this process (`tff_kd.runtime.context`); stop them
  earlier with `stop_workers`.

  Returns:
    (address, process) pairs, each worker ready to serve.
  """
  context.install_worker_reaper()
  workers = []
  for _ in range(count):
    port = portpicker.pick_unused_port()
    proc = context.start_reaped(worker_command(port))
    workers.append((f'localhost:{port}', proc))
  deadline = time.monotonic() + ready_timeout_s
  for address, proc in workers:
    channel = grpc.insecure_channel(address)
    try:
      grpc.channel_ready_future(channel).result(
          timeout=max(1.0, deadline - time.monotonic()))
    except grpc.FutureTimeoutError:
      stop_workers(workers)
      raise WorkerError(f'worker {address} did not start within '
                        f'{ready_timeout_s:g} s') from None
    finally:
      channel.close()
  logging.info('started workers %s', [a for a, _ in workers])
  return workers


def stop_workers(workers: Sequence[tuple[str, subprocess.Popen]]) -> None:
  """Kills workers from `start_local_workers` and waits for them."""
  for _, proc in workers:
    if proc.poll() is None:
      proc.send_signal(signal.SIGKILL)
  for _, proc in workers:
    proc.wait()
