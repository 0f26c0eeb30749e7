"""What every study script records: its command, the machine, its result files.

A study's result names the command that produced it (`command`) and the
machine it ran on (`machine`, one line that its Markdown report can quote),
and goes to `<prefix>.json` plus, where it has one, a Markdown report
`<prefix>.md` (`write_result`). A script that measures in fresh processes
runs itself as a child (`run_child`); a failed process is reported by its
error line (`error_line`).
"""

import importlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from typing import Any, Callable, Optional, Sequence, Union

from absl import flags


def command(module_name: str) -> str:
  """The command line that runs this process's study script.

  Args:
    module_name: the script's module under `studies`, e.g. 'speed.threads'.

  Returns:
    `python -m studies.<module_name>` followed by this process's flags.
  """
  return ' '.join([f'python -m studies.{module_name}'] + sys.argv[1:])


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
  """The machine and software a study ran on, as one line.

  TensorFlow and TFF are not imported for it: scripts that only start
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


def error_line(stderr: str) -> str:
  """The last line of a failed process's stderr that names an error (else
  its last line), at most 300 characters."""
  lines = stderr.splitlines()
  errors = [line for line in lines if 'error' in line.lower()]
  return (errors or lines or ['?'])[-1][:300]


def run_child(module_name: str, *args: str) -> Any:
  """Runs `python -m studies.<module_name> args` in a fresh process (its
  TensorFlow logging quiet); the JSON value of its last stdout line.

  Raises:
    RuntimeError: The process failed; the message is its `error_line`.
  """
  proc = subprocess.run(
      [sys.executable, '-m', f'studies.{module_name}', *args],
      capture_output=True, text=True, check=False,
      env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'})
  if proc.returncode != 0:
    raise RuntimeError(f'studies.{module_name} {" ".join(args)} failed: '
                       f'{error_line(proc.stderr)}')
  return json.loads(proc.stdout.strip().splitlines()[-1])


def define_overrides_flag() -> flags.FlagHolder:
  """The `--overrides` flag: `key=value` config changes, applied last.

  As `train`'s `key=value` arguments; the smoke tests use it to run a study
  on scikit-learn's bundled digits in a few seconds.

  Returns:
    The flag's holder.
  """
  return flags.DEFINE_list(
      'overrides', [], 'key=value config overrides, applied last (e.g. '
      'dataset.name=digits,rounds=2).')


def config_module(path: str) -> Any:
  """The config module of a `--config` path, e.g. 'configs/digits.py'
  (imported as `configs.digits`; its `get_config()` builds the config)."""
  return importlib.import_module(path.removesuffix('.py').replace('/', '.'))


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
  """`key=value` strings as {dotted key: value}, in order (a key given
  twice keeps its last value); each value parsed as `train` parses it."""
  from tff_kd.program import experiment  # pylint: disable=g-import-not-at-top
  out = {}
  for item in items:
    key, _, value = item.partition('=')
    out[key] = experiment.parse_value(value)
  return out


def apply_overrides(config: Any, items: Sequence[str]) -> Any:
  """Applies `key=value` overrides (`parse_overrides`) to an experiment
  config.

  Args:
    config: an experiment `ConfigDict` (see `configs/base.py`).
    items: `key=value` strings; each value is parsed as `train` parses it.

  Returns:
    `config`, changed in place.
  """
  from tff_kd.program import experiment  # pylint: disable=g-import-not-at-top
  for key, value in parse_overrides(items).items():
    experiment.with_overrides(config, {key: value})
  return config


def study_record(folder: str) -> dict[str, Any]:
  """A finished `compare` run folder (`record.json`, `metrics.csv`,
  `config.json`) as the studies' run record: variant (the run's label),
  method, seed, config, the per-round accuracy, train_loss, train_seconds
  and eval_seconds, final_accuracy, seconds_per_round (without round 1),
  first_round_seconds, wall_seconds and metrics (every `distill/*` and
  `client/*` metric per round); or, for a failed run, its error."""
  from tff_kd.program import experiment  # pylint: disable=g-import-not-at-top
  with open(os.path.join(folder, 'record.json')) as f:
    done = json.load(f)
  out = dict(variant=done['label'], method=done['method'], seed=done['seed'])
  if done.get('error'):
    return {**out, 'error': done['error']}
  with open(os.path.join(folder, 'config.json')) as f:
    config = json.load(f)
  h = experiment.read_metrics(folder)
  times = h['time/train_s']
  return dict(
      **out, config=config, accuracy=h['test/accuracy'],
      train_loss=h['train/loss'], train_seconds=times,
      eval_seconds=h.get('time/eval_s', [0.0] * len(times)),
      final_accuracy=done['final_accuracy'],
      seconds_per_round=experiment.seconds_per_round(times),
      first_round_seconds=times[0], wall_seconds=done['wall_seconds'],
      metrics={k: v for k, v in h.items()
               if k.startswith(('distill/', 'client/'))})
