r"""Plots run folders as PNG curves: `plot --runs=runs/a,runs/b --out=x.png`.

Runs whose configs differ only in the seed are one curve, the mean over
seeds with a +- one standard deviation band (`tff_kd.program.plots`). A
folder that holds run folders (with `metrics.csv`) stands for all of them.
With `--compare`, it also prints one line per curve: the final and the best
test accuracy (means over seeds).
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import numpy as np

from tff_kd import errors
from tff_kd.program import experiment

_RUNS = flags.DEFINE_list('runs', None, 'Run folders (or folders of runs).',
                          required=True)
_OUT = flags.DEFINE_string('out', 'curves.png', 'The PNG to write.')
_TITLE = flags.DEFINE_string('title', '', 'Figure title.')
_COMPARE = flags.DEFINE_bool('compare', False,
                             'Print each curve\'s final and best accuracy.')


def run_folders(paths: list[str]) -> list[str]:
  """The run folders named by `paths` (a folder of runs gives all of them).

  Raises:
    DataError: a path that is neither a run nor holds runs.
  """
  found = []
  for path in paths:
    if os.path.isfile(os.path.join(path, 'metrics.csv')):
      found.append(path)
      continue
    inner = sorted(os.path.join(path, d) for d in (
        os.listdir(path) if os.path.isdir(path) else ())
                   if os.path.isfile(os.path.join(path, d, 'metrics.csv')))
    if not inner:
      raise errors.DataError(f'{path} holds no run (no metrics.csv)')
    found.extend(inner)
  return found


def comparison(run_dirs: list[str]) -> list[str]:
  """One line per group: final and best mean test accuracy."""
  lines = []
  for label, dirs in experiment.group_runs(run_dirs).items():
    accuracy = [np.asarray(experiment.read_metrics(d)['test/accuracy'])
                for d in dirs]
    n = min(len(a) for a in accuracy)
    mean = np.nanmean(np.stack([a[:n] for a in accuracy]), axis=0)
    best, best_round = experiment.best_round(mean.tolist())
    lines.append(f'{label:>8}: final test accuracy {mean[-1]:.4f}, best '
                 f'{best:.4f} (round {best_round} of {n}, {len(dirs)} '
                 f'run{"s" if len(dirs) > 1 else ""})')
  return lines


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  try:
    runs = run_folders(_RUNS.value)
    experiment.plot_runs(runs, _OUT.value, title=_TITLE.value)
    if _COMPARE.value:
      print('\n'.join(comparison(runs)))
  except errors.UserError as e:
    print(f'plot: error: {e}', file=sys.stderr)
    sys.exit(2)
  print(f'curves: {os.path.abspath(_OUT.value)}')


def run() -> None:
  """Console-script entry point (`plot`)."""
  app.run(main)


if __name__ == '__main__':
  run()
