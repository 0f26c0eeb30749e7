"""tff_kd: federated knowledge distillation as TensorFlow Federated processes.

Importing the package makes every TFF `worker_binary` started by this process
die with it (see `tff_kd.program.context`), and defers importing
tensorflow_probability to its first use (`_defer`).
"""

import importlib
import importlib.util
import sys
import types


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


def _defer(name: str) -> None:
  """Imports module `name` at its first attribute access, not before.

  TFF imports tensorflow_privacy, whose discrete-Gaussian sampler imports
  tensorflow_probability at module level but uses it only inside functions
  that this library never calls: 0.35 s of every start-up
  (benchmarks/README.md, side by side). Until an attribute is asked for,
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


_defer('tensorflow_probability')

from tff_kd.program import context as _context  # pylint: disable=g-import-not-at-top,wrong-import-position

_context.install_worker_reaper()

__version__ = '0.1.0'
