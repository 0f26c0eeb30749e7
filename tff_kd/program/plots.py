"""Learning curves and KD diagnostics as PNG figures (matplotlib, headless).

A run folder written by `tff_kd.program.experiment.run` holds `metrics.csv`
(one row per round) and `config.json`. `plot_runs` reads several run
folders, groups the runs whose configs differ only in `seed` and draws, per
group, the mean over seeds with a +- one standard deviation band:

* test accuracy and training loss against the round;
* test accuracy against wall time (the cumulative training and evaluation
  seconds the run logged; left out when no run logged its times);
* where a run logged them, the KD mechanism's own curves: the teacher-weight
  entropy (DaFKD's eq. 7 alpha, FedD3A's eq. 6 weights), DaFKD's domain
  awareness (the weight on the clients that hold a sample's label against
  uniform weights, `dafkd.weight_diagnostics`), the weighted against the
  uniform ensemble's accuracy on the server's labeled images, and the
  distillation loss.

`plot_histories` draws the same panels from histories already in memory
(the benchmark scripts use it for their result files). Every function
returns the `matplotlib.figure.Figure` it saved, so callers (and tests) can
inspect the series it holds.
"""

import csv
import json
import math
import os
from typing import Mapping, Optional, Sequence

import matplotlib

matplotlib.use('Agg')  # Headless: no display on servers and in CI.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from tff_kd import errors

History = Mapping[str, Sequence[float]]

# (panel title, y label, [(metric, line suffix)]): KD panels are drawn only
# when some history holds one of their metrics.
_KD_PANELS = (
    ('Teacher-weight entropy', 'nats',
     [('distill/alpha_entropy', ''), ('distill/weight_entropy', '')]),
    ('Domain awareness (weight on holders / uniform)', 'ratio',
     [('distill/holder_ratio', '')]),
    ('Ensemble accuracy on labeled server images', 'accuracy',
     [('distill/ensemble_accuracy_weighted', ' weighted'),
      ('distill/ensemble_accuracy_uniform', ' uniform'),
      ('distill/ensemble_accuracy', ' weighted'),
      ('distill/uniform_accuracy', ' uniform')]),
    ('Distillation loss (last steps of a round)', 'KD loss',
     [('distill/last_loss', ''), ('distill/distill_last_loss', '')]),
)


def read_metrics(run_dir: str) -> dict[str, list[float]]:
  """`metrics.csv` of a run as metric -> per-round values (NaN if absent).

  A round logged twice (re-run after a resume) keeps its last row.

  Raises:
    DataError: the folder has no readable metrics.csv.
  """
  path = os.path.join(run_dir, 'metrics.csv')
  try:
    with open(path) as f:
      rows = list(csv.DictReader(f))
  except OSError as e:
    raise errors.DataError(f'no metrics in {run_dir}: {e.strerror}') from None
  by_round = {int(r['round']): r for r in rows}
  history: dict[str, list[float]] = {}
  for key in sorted({k for r in rows for k in r} - {'round'}):
    history[key] = [_number(by_round[i].get(key)) for i in sorted(by_round)]
  history['round'] = [float(i) for i in sorted(by_round)]
  return history


def best_round(values: Sequence[float],
               rounds: Optional[Sequence[float]] = None) -> tuple[float, int]:
  """The best (highest) value and the first round that reached it.

  `train`'s summary and `plot --compare` both report a run's best round
  with it, so that a tie names the same (the earliest) round in both.

  Args:
    values: Per-round values (e.g. test accuracy); NaN ones are skipped.
    rounds: Their rounds, as `read_metrics` gives them (default: 1, 2, ...).

  Returns:
    (best value, its first round).

  Raises:
    DataError: no value is a number.
  """
  rounds = range(1, len(values) + 1) if rounds is None else rounds
  numbers = [(v, int(r)) for r, v in zip(rounds, values) if not math.isnan(v)]
  if not numbers:
    raise errors.DataError('no round logged a value')
  best = max(v for v, _ in numbers)
  return best, next(r for v, r in numbers if v == best)


def _number(value) -> float:
  try:
    return float(value)
  except (TypeError, ValueError):
    return math.nan


def _config(run_dir: str) -> dict:
  try:
    with open(os.path.join(run_dir, 'config.json')) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def group_runs(run_dirs: Sequence[str]) -> dict[str, list[str]]:
  """Runs whose configs differ only in `seed` share a group (label)."""
  groups: dict[str, list[str]] = {}
  keys: dict[str, str] = {}
  for run_dir in run_dirs:
    config = _config(run_dir)
    config.pop('seed', None)
    key = json.dumps(config, sort_keys=True)
    if key not in keys:
      name = config.get('method') or os.path.basename(
          os.path.normpath(run_dir))
      label = name if name not in groups else (
          f'{name} ({os.path.basename(os.path.normpath(run_dir))})')
      keys[key] = label
      groups[label] = []
    groups[keys[key]].append(run_dir)
  return groups


def _stack(histories: Sequence[History], key: str) -> Optional[np.ndarray]:
  """[seeds, rounds] of one metric (rounds cut to the shortest run)."""
  series = [np.asarray(h[key], float) for h in histories if key in h]
  if not series or all(np.all(np.isnan(s)) for s in series):
    return None
  n = min(len(s) for s in series)
  return np.stack([s[:n] for s in series])


def _wall_time(history: History) -> Optional[np.ndarray]:
  if 'time/train_s' not in history:
    return None
  seconds = np.nan_to_num(np.asarray(history['time/train_s'], float))
  if 'time/eval_s' in history:
    seconds += np.nan_to_num(np.asarray(history['time/eval_s'], float))
  return np.cumsum(seconds)


def _band(ax, x, values: np.ndarray, label: str, color, linestyle: str):
  mean = np.nanmean(values, axis=0)
  (line,) = ax.plot(x[:len(mean)], mean, label=label, color=color,
                    linestyle=linestyle)
  if len(values) > 1:
    std = np.nanstd(values, axis=0)
    ax.fill_between(x[:len(mean)], mean - std, mean + std, color=color,
                    alpha=0.2, linewidth=0)
  return line


def _has_times(groups: Mapping[str, Sequence[History]]) -> bool:
  return any(all(_wall_time(h) is not None for h in histories)
             for histories in groups.values())


def plot_histories(groups: Mapping[str, Sequence[History]], out_path: str,
                   *, title: str = '') -> plt.Figure:
  """Curves of several groups of runs (one history per seed) as one PNG.

  Args:
    groups: label -> histories; a history maps metric names (the keys of
      `metrics.csv`, e.g. 'test/accuracy') to per-round values.
    out_path: The PNG to write (its folder is created).
    title: Figure title.

  Returns:
    The saved figure; every line's label is its group label (plus
    ' weighted' / ' uniform' in the ensemble panel).

  Raises:
    DataError: no group holds a test accuracy to plot.
  """
  if not any(_stack(h, 'test/accuracy') is not None for h in groups.values()):
    raise errors.DataError('nothing to plot: no run logged test/accuracy')
  panels = [('Test accuracy', 'accuracy', [('test/accuracy', '')], 'round'),
            ('Training loss', 'loss', [('train/loss', '')], 'round')]
  if _has_times(groups):
    panels.append(('Test accuracy against time', 'accuracy',
                   [('test/accuracy', '')], 'time'))
  for name, unit, metrics in _KD_PANELS:
    if any(_stack(h, key) is not None for h in groups.values()
           for key, _ in metrics):
      panels.append((name, unit, metrics, 'round'))
  cols = 3
  rows = math.ceil(len(panels) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows),
                           squeeze=False)
  # One colour per group in every panel; the second line of a group in a
  # panel (the uniform ensemble) is dashed.
  colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
  color_of = {label: colors[i % len(colors)]
              for i, label in enumerate(groups)}
  for ax, (name, unit, metrics, x_axis) in zip(axes.flat, panels):
    ax.set_title(name)
    ax.set_ylabel(unit)
    ax.set_xlabel('round' if x_axis == 'round' else 'seconds (train + eval)')
    for label, histories in groups.items():
      for key, suffix in metrics:
        values = _stack(histories, key)
        if values is None:
          continue
        if x_axis == 'round':
          x = np.arange(1, values.shape[1] + 1)
        else:
          times = [_wall_time(h) for h in histories]
          if any(t is None for t in times):
            continue
          x = np.mean([t[:values.shape[1]] for t in times], axis=0)
        _band(ax, x, values, label + suffix, color_of[label],
              '--' if suffix == ' uniform' else '-')
    if ax.get_lines():
      ax.legend(fontsize='small')
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(panels):]:
    ax.remove()
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  fig.savefig(out_path, dpi=90)
  plt.close(fig)
  return fig


def plot_runs(run_dirs: Sequence[str], out_path: str, *,
              title: str = '') -> plt.Figure:
  """`plot_histories` of run folders, grouped by `group_runs`."""
  groups = {label: [read_metrics(d) for d in dirs]
            for label, dirs in group_runs(run_dirs).items()}
  return plot_histories(groups, out_path, title=title)
