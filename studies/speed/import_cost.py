r"""What importing `train` costs, and how much of it is the library's own.

A `train` process starts by importing TensorFlow and TensorFlow Federated,
which is most of its start-up against the PyTorch reference
(`sidebyside.py`: start-up + teardown 1.5-1.6x the reference's). This
script imports the `train` binary (`binaries.train`, everything a run
imports before its first round) in fresh processes under Python's
`-X importtime`, and splits the import time by where it goes:

* `tensorflow`: TensorFlow itself (imported first by TFF);
* `tensorflow_federated`, and the add-ons on TF's and TFF 0.87's import
  path: JAX (through TF's `compat.v1.lite`), TF Model Optimization, TF
  Privacy and dp_accounting (TFF's aggregators import the last three
  unconditionally);
* the library's own modules (`tff_kd`, `binaries`, `configs`), and
  everything else (numpy, scipy, ...).

A part is the sum of its modules' self times (the time of a module's own
body, without what it imports), so the parts split the total. Each is the
median over the repeats (so they need not add up exactly). Writes `<out>.md` and prints it.

Usage (about 5 s per repeat on 2 CPU cores):
  TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -m studies.speed.import_cost \
      --repeats=5 --out=studies/speed/results/import_cost
"""

import os
import platform
import re
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

_REPEATS = flags.DEFINE_integer('repeats', 5, 'Fresh processes.')
_MODULE = flags.DEFINE_string('module', 'binaries.train',
                              'The module a process imports.')
_OUT = flags.DEFINE_string('out', 'studies/speed/results/import_cost',
                           'Result path without its .md suffix.')

_LINE = re.compile(r'^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$')
# Where the time goes: part -> the top-level packages whose cumulative
# import time it is (the first entry of each package, where it was first
# imported).
_ADD_ONS = ('jax', 'tensorflow_model_optimization', 'tensorflow_privacy',
            'dp_accounting')
_OWN = ('tff_kd', 'binaries', 'configs')


def parse(text: str) -> dict[str, tuple[int, int]]:
  """`-X importtime` output -> module -> (self us, cumulative us)."""
  out = {}
  for line in text.splitlines():
    match = _LINE.match(line)
    if match:
      out[match[4]] = (int(match[1]), int(match[2]))
  return out


def parts(times: dict[str, tuple[int, int]], module: str) -> dict[str, float]:
  """One process's import time in seconds, by part: the self times of
  every module, summed by top-level package (an exact split of the total),
  the named ones (see the module docstring) on their own rows and the
  rest as 'other'."""
  by_package: dict[str, float] = {}
  for name, (self_us, _) in times.items():
    package = name.split('.')[0]
    by_package[package] = by_package.get(package, 0.0) + self_us / 1e6
  out = {'total': times.get(module, (0, 0))[1] / 1e6,
         'tensorflow': by_package.pop('tensorflow', 0.0),
         'tensorflow_federated': by_package.pop('tensorflow_federated', 0.0)}
  for name in _ADD_ONS:
    out[f'{name} (on the TF / TFF import path)'] = by_package.pop(name, 0.0)
  out["the library's own modules (tff_kd, binaries, configs)"] = sum(
      by_package.pop(name, 0.0) for name in _OWN)
  out['other'] = sum(by_package.values())
  return out


def largest_others(times: dict[str, tuple[int, int]], n: int = 5
                   ) -> list[tuple[str, float]]:
  """The `n` packages of 'other' with the most self time (seconds)."""
  named = {'tensorflow', 'tensorflow_federated', *_ADD_ONS, *_OWN}
  by_package: dict[str, float] = {}
  for name, (self_us, _) in times.items():
    package = name.split('.')[0]
    if package not in named:
      by_package[package] = by_package.get(package, 0.0) + self_us / 1e6
  return sorted(by_package.items(), key=lambda kv: -kv[1])[:n]


def measure(module: str) -> tuple[dict[str, float], float, list]:
  """One fresh process: its parts, its wall seconds and its largest
  other packages."""
  t0 = time.perf_counter()
  done = subprocess.run(
      [sys.executable, '-X', 'importtime', '-c', f'import {module}'],
      capture_output=True, text=True, check=True,
      env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'})
  times = parse(done.stderr)
  return (parts(times, module), time.perf_counter() - t0,
          largest_others(times))


def main(argv):
  del argv
  runs = [measure(_MODULE.value) for _ in range(_REPEATS.value)]
  names = list(runs[0][0])
  median = {n: statistics.median(r[0][n] for r in runs) for n in names}
  wall = statistics.median(r[1] for r in runs)
  total = median['total']
  lines = [
      f'# What importing `{_MODULE.value}` costs', '',
      f'Command: `python -m studies.speed.import_cost --repeats='
      f'{_REPEATS.value} --module={_MODULE.value}`. Machine: '
      f'{platform.machine()}, {os.cpu_count()} cores shared with other '
      f'jobs, Python {platform.python_version()}; '
      f'{time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}. Median over '
      f'{_REPEATS.value} fresh processes (`-X importtime`); the process '
      f'wall time, interpreter start-up included: {wall:.2f} s.', '',
      '| part | seconds | share |', '|---|---|---|']
  lines += [f'| {n} | {median[n]:.3f} | {median[n] / total:.0%} |'
            for n in names]
  lines += ['', "'other', largest first (the first process): " + ', '.join(
      f'{name} {seconds:.3f} s' for name, seconds in runs[0][2]) + '.']
  text = '\n'.join(lines) + '\n'
  os.makedirs(os.path.dirname(_OUT.value) or '.', exist_ok=True)
  with open(f'{_OUT.value}.md', 'w') as f:
    f.write(text)
  print(text)


if __name__ == '__main__':
  app.run(main)
