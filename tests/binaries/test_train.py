"""The `train` binary: one-line errors, SIGKILL + resume, no leaked workers."""

import csv
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import live_workers
from tests.program.test_experiment import _config
from tff_kd.program import experiment

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_SMALL = ['--config=configs/digits.py', '--config.partition.num_clients=6',
          '--config.clients_per_round=3', '--noprogress']


def _train(*args, **kwargs) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, '-m', 'binaries.train', *args], cwd=_REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'), **kwargs)


@pytest.mark.parametrize('args,message', [
    (['--method=fedfoo'], "method 'fedfoo' is unknown"),
    (['--config.nosuch=1'], "config key 'nosuch' does not exist"),
    (['--config=configs/nosuch.py'], "cannot load the config file"),
    (['--config.partition.alpha=-0.5'], 'alpha must be > 0, got -0.5'),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
  proc = _train(*_SMALL, f'--root_dir={tmp_path}', *args)
  _, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 2
  assert 'Traceback' not in stderr
  last = stderr.strip().splitlines()[-1]
  assert last.startswith('train: error: ') and message in last, stderr[-800:]
  assert not os.path.exists(tmp_path / 'checkpoints')


def _rounds_logged(root: str) -> int:
  try:
    with open(os.path.join(root, 'metrics.csv')) as f:
      return len(list(csv.DictReader(f)))
  except FileNotFoundError:
    return 0


def test_sigkill_then_restart_resumes_with_same_result(tmp_path):
  root = str(tmp_path / 'killed')
  args = [*_SMALL, '--config.rounds=5', '--config.export=false',
          f'--root_dir={root}']
  proc = _train(*args)
  deadline = time.time() + 300
  while _rounds_logged(root) < 2 and proc.poll() is None:
    assert time.time() < deadline, 'train made no progress'
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.communicate()
  done_before = _rounds_logged(root)
  assert 2 <= done_before < 5, 'the kill should land mid-run'

  proc = _train(*args)
  stdout, stderr = proc.communicate(timeout=600)
  assert proc.returncode == 0, stderr[-2000:]
  assert 'Resuming' in stderr
  with open(os.path.join(root, 'metrics.csv')) as f:
    rounds = [int(r['round']) for r in csv.DictReader(f)]
  assert sorted(set(rounds)) == [1, 2, 3, 4, 5]

  straight = experiment.run(
      _config(rounds=5, export=False), str(tmp_path / 'straight'),
      progress=False)
  accuracy = float(stdout.split('final test accuracy ')[1].split()[0])
  assert accuracy == pytest.approx(straight.final['test/accuracy'],
                                   abs=1e-4)
  # Neither the killed nor the finished process left a worker behind.
  time.sleep(1)
  assert not [p for p in live_workers() if p.ppid() in (proc.pid, 1)]
