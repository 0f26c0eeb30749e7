"""tff_kd: federated knowledge distillation as TensorFlow Federated processes.

Importing the package makes every TFF `worker_binary` started by this process
die with it (see `tff_kd.program.context`).
"""

from tff_kd.program import context as _context

_context.install_worker_reaper()

__version__ = '0.1.0'
