"""tff_kd: federated knowledge distillation as TensorFlow Federated processes.

Importing the package changes nothing in the process but one exit hook
(`tff_kd.runtime.context.exit_quietly`), which lets a script that imported
TensorFlow Federated through tff_kd end without TFF's clean-up traceback.
Programs (the binaries, the tests, notebooks, studies) opt in to the
process set-up they want by calling `tff_kd.runtime.context.install()` first
thing: it defers importing tensorflow_probability to its first use and makes
every TFF `worker_binary` started by the process die with it.
"""

import atexit
import sys

__version__ = '0.1.0'


@atexit.register
def _exit_quietly() -> None:
  if 'tensorflow_federated' in sys.modules:  # Else there is nothing to do.
    from tff_kd.runtime import context  # pylint: disable=g-import-not-at-top
    context.exit_quietly()
