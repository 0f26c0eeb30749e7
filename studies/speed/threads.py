r"""How the local worker's threads and concurrency change a round.

TFF's local C++ runtime runs every client computation of a round at once
(`max_concurrent_computation_calls=-1`) and TensorFlow spreads each op over
all cores (`TF_NUM_INTRAOP_THREADS` unset). For this library's small models
both cost time: the ops are too small to split, and ten concurrent clients
on two cores contend. `runtime.concurrent_clients` and
`runtime.intra_op_threads` (`tff_kd.runtime.context`) set them.

This runs `studies/speed/fedgen_workload.py --pure_tf_rounds=0` (the FedGen
reference workload: 10 clients x 20 steps per round, evaluation every
round) once per setting and repeat, alternating the settings, each in its
own process, and reports per-round seconds (`process.next`, and train +
eval), the first round and the final accuracy.

`--settings` runs some of the settings only, as `concurrent:intra` pairs
(e.g. `--settings=-1:0`; default: all four); without TFF's and
TensorFlow's defaults (`-1:0`) the report has no ratio to them.

Usage:
  .venv/bin/python -m studies.speed.threads --manual_dir=../shared/data/mnist \
      --rounds=15 --repeats=2 --methods=fedavg,fedgen \
      --out=studies/speed/results/threads
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

from studies import common

_MANUAL_DIR = flags.DEFINE_string('manual_dir', '../shared/data/mnist',
                                  'Raw MNIST IDX files.')
_ROUNDS = flags.DEFINE_integer('rounds', 15, 'Rounds per run.')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Runs per setting.')
_METHODS = flags.DEFINE_list('methods', ['fedavg', 'fedgen'], 'Methods.')
_OUT = flags.DEFINE_string('out', 'studies/speed/results/threads',
                           'Output prefix (<out>.json, <out>.md).')
_OVERRIDES = common.define_overrides_flag()

# (runtime.concurrent_clients, runtime.intra_op_threads, label).
_SETTINGS = (
    (-1, 0, "TFF's and TensorFlow's defaults (no limit, every core)"),
    (-1, 1, 'no limit, 1 thread per op'),
    (0, 0, 'one client per core, every core per op'),
    (0, 1, 'one client per core, 1 thread per op (the default)'),
)
_SETTINGS_FLAG = flags.DEFINE_list(
    'settings', [f'{c}:{i}' for c, i, _ in _SETTINGS],
    'Settings run, as runtime.concurrent_clients:runtime.intra_op_threads '
    'pairs out of the four of the table (default: all four).')


def _chosen_settings() -> tuple:
  """The settings of `--settings`, in the table's order."""
  known = {f'{c}:{i}': (c, i, label) for c, i, label in _SETTINGS}
  unknown = set(_SETTINGS_FLAG.value) - set(known)
  if unknown:
    raise app.UsageError(f'--settings: unknown {sorted(unknown)}; known: '
                         f'{sorted(known)}')
  return tuple(s for key, s in known.items() if key in _SETTINGS_FLAG.value)


def _run(method: str, concurrent: int, intra: int) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, 'run.json')
    subprocess.run(
        [sys.executable, '-m', 'studies.speed.fedgen_workload',
         f'--manual_dir={_MANUAL_DIR.value}', f'--rounds={_ROUNDS.value}',
         '--pure_tf_rounds=0', f'--method={method}',
         f'--concurrent_clients={concurrent}',
         f'--intra_op_threads={intra}', f'--out={out}',
         f'--overrides={",".join(_OVERRIDES.value)}'],
        check=True, capture_output=True, timeout=1800)
    with open(out) as f:
      run = json.load(f)['runs'][0]
  return dict(
      next_median=run['tff_next_s']['median'],
      next_mean=run['tff_next_s']['mean'],
      train_eval_mean=run['seconds_per_round']['mean'],
      first_round_next=run['first_round_tff_s'],
      accuracy=run['curve'][-1][2])


def _markdown(results: dict, methods: list[str], rounds: int,
              settings: tuple = _SETTINGS) -> str:
  """The results as a Markdown report.

  Args:
    results: what `main` records.
    methods: the methods run, in the report's order.
    rounds: the rounds of every run.
    settings: the settings run, in the table's order.

  Returns:
    The report.
  """
  lines = ['# Worker threads and concurrency, FedGen reference workload', '',
           'Command:', '', f"    {results['command']}", '',
           f"Machine: {results['machine']}. Each run is its own process; "
           'settings alternate within every repeat. Seconds per round, '
           f'mean over the repeats of each run\'s rounds 2..{rounds - 1}'
           ' (median for `process.next`); accuracy on the users\' slices '
           f'after {rounds} rounds.', '',
           '| method | concurrent_clients | intra_op_threads | setting | '
           '`process.next` median | train + eval mean | first round '
           '`process.next` | ratio to defaults (train + eval) | accuracy |',
           '|---|---|---|---|---|---|---|---|---|']
  for method in methods:
    rows = {}
    for concurrent, intra, label in settings:
      runs = [r for r in results['runs'] if r['method'] == method and
              (r['concurrent_clients'], r['intra_op_threads']) ==
              (concurrent, intra)]
      rows[(concurrent, intra)] = (label, {
          k: statistics.fmean(r[k] for r in runs)
          for k in ('next_median', 'train_eval_mean', 'first_round_next')},
                                   sorted({round(r['accuracy'], 4)
                                           for r in runs}))
    # The defaults' mean, where they ran.
    base = rows.get(_SETTINGS[0][:2], (None, {}))[1].get('train_eval_mean')
    for (concurrent, intra), (label, m, acc) in rows.items():
      ratio = '-' if base is None else f"{m['train_eval_mean'] / base:.2f}"
      lines.append(
          f'| {method} | {concurrent} | {intra} | {label} | '
          f"{m['next_median']:.3f} s | {m['train_eval_mean']:.3f} s | "
          f"{m['first_round_next']:.3f} s | "
          f'{ratio} | '
          f"{' / '.join(f'{a:.4f}' for a in acc)} |")
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  settings = _chosen_settings()
  results = dict(
      command=common.command('speed.threads'), machine=common.machine(),
      settings=[dict(concurrent_clients=c, intra_op_threads=i, label=l)
                for c, i, l in settings],
      runs=[])
  for method in _METHODS.value:
    for repeat in range(_REPEATS.value):
      for concurrent, intra, _ in settings:
        row = dict(method=method, repeat=repeat,
                   concurrent_clients=concurrent, intra_op_threads=intra,
                   **_run(method, concurrent, intra))
        print(json.dumps(row), flush=True)
        results['runs'].append(row)
  common.write_result(
      _OUT.value, results,
      lambda r: _markdown(r, _METHODS.value, _ROUNDS.value, settings),
      indent=1)


if __name__ == '__main__':
  app.run(main)
