"""Learning-curve figures: written, and holding the expected series."""

import csv
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from tff_kd import errors
from tff_kd.program import plots

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _fake_run(root, name, method, seed, accuracy, extra=None):
  run_dir = os.path.join(root, name)
  os.makedirs(run_dir)
  with open(os.path.join(run_dir, 'config.json'), 'w') as f:
    json.dump({'method': method, 'seed': seed, 'rounds': len(accuracy)}, f)
  rows = []
  for r, a in enumerate(accuracy, 1):
    row = {'round': r, 'test/accuracy': a, 'train/loss': 1.0 / r,
           'time/train_s': 2.0, 'time/eval_s': 0.5}
    row.update({k: v[r - 1] for k, v in (extra or {}).items()})
    rows.append(row)
  with open(os.path.join(run_dir, 'metrics.csv'), 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  return run_dir


@pytest.fixture
def runs(tmp_path):
  a0 = _fake_run(tmp_path, 'a0', 'fedavg', 0, [0.2, 0.4, 0.6])
  a1 = _fake_run(tmp_path, 'a1', 'fedavg', 1, [0.4, 0.6, 0.8])
  b0 = _fake_run(tmp_path, 'b0', 'dafkd', 0, [0.3, 0.5, 0.9], {
      'distill/alpha_entropy': [2.0, 1.9, 1.8],
      'distill/holder_ratio': [1.0, 1.2, 1.4],
      'distill/ensemble_accuracy_weighted': [0.5, 0.6, 0.7],
      'distill/ensemble_accuracy_uniform': [0.5, 0.55, 0.6],
      'distill/last_loss': [0.3, 0.2, 0.1]})
  return tmp_path, [a0, a1, b0]


def _lines(ax):
  return {line.get_label(): line.get_ydata() for line in ax.get_lines()}


def test_seeds_of_one_config_are_one_mean_curve(runs):
  root, dirs = runs
  out = os.path.join(root, 'figs', 'curves.png')
  fig = plots.plot_runs(dirs, out, title='t')
  assert os.path.getsize(out) > 10_000
  titles = [ax.get_title() for ax in fig.axes]
  assert titles[:3] == ['Test accuracy', 'Training loss',
                        'Test accuracy against time']
  accuracy = _lines(fig.axes[0])
  assert sorted(accuracy) == ['dafkd', 'fedavg']
  np.testing.assert_allclose(accuracy['fedavg'], [0.3, 0.5, 0.7])
  np.testing.assert_allclose(accuracy['dafkd'], [0.3, 0.5, 0.9])
  # The time axis is the cumulative training + evaluation seconds.
  np.testing.assert_allclose(fig.axes[2].get_lines()[0].get_xdata(),
                             [2.5, 5.0, 7.5])
  # Two seeds: a +- std band (one filled area) for fedavg only.
  assert len(fig.axes[0].collections) == 1


def test_kd_panels_appear_with_their_metrics(runs):
  root, dirs = runs
  fig = plots.plot_runs(dirs, os.path.join(root, 'kd.png'))
  by_title = {ax.get_title(): ax for ax in fig.axes}
  assert _lines(by_title['Teacher-weight entropy'])['dafkd'].tolist() == [
      2.0, 1.9, 1.8]
  ratio = by_title['Domain awareness (weight on holders / uniform)']
  assert list(_lines(ratio)) == ['dafkd']
  ensembles = _lines(by_title['Ensemble accuracy on labeled server images'])
  assert sorted(ensembles) == ['dafkd uniform', 'dafkd weighted']
  assert 'Distillation loss (last steps of a round)' in by_title
  # FedAvg alone has none of them.
  fig = plots.plot_runs(dirs[:2], os.path.join(root, 'plain.png'))
  assert len(fig.axes) == 3


def test_nothing_to_plot_is_a_clear_error(tmp_path):
  with pytest.raises(errors.DataError, match='no metrics'):
    plots.plot_runs([str(tmp_path)], str(tmp_path / 'x.png'))


def test_plot_binary_compares_and_refuses_empty_folders(runs):
  root, _ = runs
  out = os.path.join(root, 'cli.png')
  proc = subprocess.run(
      [sys.executable, '-m', 'binaries.plot', f'--runs={root}',
       f'--out={out}', '--compare'], cwd=_REPO, capture_output=True,
      text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.strip().splitlines()
  assert 'fedavg: final test accuracy 0.7000, best 0.7000' in lines[0] or (
      'fedavg: final test accuracy 0.7000, best 0.7000' in lines[1])
  assert lines[-1] == f'curves: {out}'
  assert os.path.exists(out)
  empty = os.path.join(root, 'empty')
  os.makedirs(empty)
  proc = subprocess.run(
      [sys.executable, '-m', 'binaries.plot', f'--runs={empty}'],
      cwd=_REPO, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1] == (
      f'plot: error: {empty} holds no run (no metrics.csv)')


def test_train_and_plot_report_the_first_round_of_the_best(tmp_path):
  """A tie ([.5, .9, .9]) is round 2 in `train`'s summary and `plot`'s."""
  from binaries import plot  # pylint: disable=g-import-not-at-top
  from binaries import train  # pylint: disable=g-import-not-at-top

  run_dir = _fake_run(tmp_path, 'tie', 'fedgen', 0, [0.5, 0.9, 0.9])
  assert plots.best_round([0.5, 0.9, 0.9]) == (0.9, 2)
  assert plots.best_round([np.nan, 0.9, 0.9], [4.0, 5.0, 6.0]) == (0.9, 5)
  assert plot.comparison([run_dir]) == [
      '  fedgen: final test accuracy 0.9000, best 0.9000 (round 2 of 3, '
      '1 run)']
  result = types.SimpleNamespace(  # What `train` reads of a RunResult.
      final={'round': 3, 'test/accuracy': 0.9}, export_dir=None,
      resumed_after=0)
  # pylint: disable-next=protected-access
  summary = train._summary(run_dir, result, 1.0, None)
  assert summary.splitlines()[0] == (
      'final test accuracy 0.9000 after 3 rounds (best 0.9000 in round 2); '
      '1 s')
