"""What every benchmark records: its command, the machine, its result files.

A benchmark's result names the command that produced it (`command`) and the
machine it ran on (`machine`, one line that its Markdown report can quote),
and goes to `<prefix>.json` plus, where it has one, a Markdown report
`<prefix>.md` (`write_result`).
"""

import importlib.metadata
import json
import os
import platform
import sys
from typing import Any, Callable, Optional, Union


def command(module_name: str) -> str:
  """The command line that runs this process's benchmark.

  Args:
    module_name: the benchmark's module under `benchmarks`, e.g. 'threads'.

  Returns:
    `python -m benchmarks.<module_name>` followed by this process's flags.
  """
  return ' '.join([f'python -m benchmarks.{module_name}'] + sys.argv[1:])


def _version(module_name: str, distribution: str) -> str:
  """A package's version, without importing it where it is not loaded yet."""
  module = sys.modules.get(module_name)
  if getattr(module, '__version__', None):
    return module.__version__
  try:
    return importlib.metadata.version(distribution)
  except importlib.metadata.PackageNotFoundError:
    return 'not installed'


def machine() -> str:
  """The machine and software a benchmark ran on, as one line.

  TensorFlow and TFF are not imported for it: benchmarks that only start
  other processes do not pay for their import.

  Returns:
    E.g. 'x86_64, 2 cores, Python 3.11.7, TF 2.14.1, TFF 0.87.0'.
  """
  return (f'{platform.processor() or platform.machine()}, '
          f'{os.cpu_count()} cores, Python {platform.python_version()}, '
          f"TF {_version('tensorflow', 'tensorflow')}, "
          f"TFF {_version('tensorflow_federated', 'tensorflow-federated')}")


def write_result(
    prefix: str, result: Any,
    markdown: Union[str, Callable[[Any], str], None] = None,
    indent: int = 2) -> Optional[str]:
  """Writes `<prefix>.json` and, given a report, `<prefix>.md`.

  The JSON is written first, so a report that fails to render still leaves
  the numbers on disk. The folder of `prefix` is created if needed.

  Args:
    prefix: the output path without its extension.
    result: the JSON-serialisable result.
    markdown: the Markdown report, a function of `result` that returns it,
      or None for no report.
    indent: the JSON's indentation.

  Returns:
    The Markdown text written, or None without a report.
  """
  os.makedirs(os.path.dirname(prefix) or '.', exist_ok=True)
  with open(prefix + '.json', 'w') as f:
    json.dump(result, f, indent=indent)
  if markdown is None:
    return None
  text = markdown(result) if callable(markdown) else markdown
  with open(prefix + '.md', 'w') as f:
    f.write(text)
  return text
