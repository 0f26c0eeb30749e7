"""Serves one TFF worker for `train --config.runtime.workers=host:port,...`.

Usage (on each worker machine, from the same environment as the driver):

  tff_kd_worker --port=8000

It replaces itself with TFF's own executor service, the `worker_binary`
shipped in the `tensorflow-federated` wheel (TFF 0.87), listening for gRPC on
every interface. The service is unauthenticated and unencrypted: run it on a
private network or behind a TLS-terminating proxy (docs/DISTRIBUTED.md).
"""

import os

from absl import app
from absl import flags

from tff_kd.program import runtime

_PORT = flags.DEFINE_integer('port', 8000, 'gRPC port to serve on.')


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  if not 0 < _PORT.value < 65536:
    raise app.UsageError(f'--port must be in [1, 65535], got {_PORT.value}')
  command = runtime.worker_command(_PORT.value)
  print(f'tff_kd_worker: serving TFF worker on port {_PORT.value} '
        f'({command[0]})', flush=True)
  os.execv(command[0], command)


def run() -> None:
  """Console-script entry point (`tff_kd_worker`)."""
  app.run(main)


if __name__ == '__main__':
  app.run(main)
