"""Serves one TFF worker for `train --config.runtime.workers=host:port,...`.

Usage (on each worker machine, from the same environment as the driver):

  tff_kd_worker --port=8000

It replaces itself with TFF's own executor service, the `worker_binary`
shipped in the `tensorflow-federated` wheel (TFF 0.87), listening for gRPC on
every interface. The service is unauthenticated and unencrypted: run it on a
private network or behind a TLS-terminating proxy (docs/DISTRIBUTED.md).
"""

import os

from tff_kd.runtime import context
context.install()  # Before `runtime` imports TensorFlow Federated.

from absl import app  # pylint: disable=g-import-not-at-top,g-bad-import-order
from absl import flags  # pylint: disable=g-import-not-at-top

from tff_kd.runtime import workers  # pylint: disable=g-import-not-at-top

_PORT = flags.DEFINE_integer('port', 8000, 'gRPC port to serve on.')
_CONCURRENT_CLIENTS = flags.DEFINE_integer(
    'concurrent_clients', 0, 'Client computations served at a time (0: one '
    'per usable core; -1: no limit, TFF\'s default).', lower_bound=-1)
_INTRA_OP_THREADS = flags.DEFINE_integer(
    'intra_op_threads', 1, 'Threads inside each TensorFlow op (0: '
    'TensorFlow\'s default, every core); as `runtime.intra_op_threads` does '
    'for the local worker.', lower_bound=0)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  if not 0 < _PORT.value < 65536:
    raise app.UsageError(f'--port must be in [1, 65535], got {_PORT.value}')
  command = workers.worker_command(
      _PORT.value, concurrent_clients=_CONCURRENT_CLIENTS.value)
  print(f'tff_kd_worker: serving TFF worker on port {_PORT.value} '
        f'({command[0]})', flush=True)
  os.execve(command[0], command,
            {**os.environ, **context.threads_env(_INTRA_OP_THREADS.value)})


def run() -> None:
  """Console-script entry point (`tff_kd_worker`)."""
  app.run(main)


if __name__ == '__main__':
  app.run(main)
