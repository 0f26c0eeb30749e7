"""Modules whose public names are imported from their home at first use.

`tff_kd.models` and `tff_kd.program.experiment` list their public names
and the module that defines each, and import that module only when a name
is first read (PEP 562), so that importing them costs nothing: the config
tree checks model names without TensorFlow, and `plot` reads results
without TensorFlow Federated.
"""

import importlib
from typing import Any, Callable, Mapping, MutableMapping, Sequence


def exports(namespace: MutableMapping[str, Any], package: str,
            names: Mapping[str, str], modules: Sequence[str] = ()
            ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
  """A module's `__getattr__` and `__dir__` for lazily imported names.

  Args:
    namespace: The module's `globals()`, where a value is kept once read.
    package: The package of the defining modules, e.g. 'tff_kd.models'.
    names: Public name -> the module (in `package`) that defines it.
    modules: Modules of `package` that are public attributes themselves.

  Returns:
    (`__getattr__`, `__dir__`) for the module to assign.
  """

  def getattr_(name: str) -> Any:
    if name in modules:
      return importlib.import_module(f'{package}.{name}')
    if name not in names:
      raise AttributeError(
          f"module {namespace['__name__']!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f'{package}.{names[name]}'),
                    name)
    namespace[name] = value
    return value

  def dir_() -> list[str]:
    return sorted(set(names) | set(modules))

  return getattr_, dir_
