"""The `train` binary: one-line errors, SIGKILL + resume, no leaked workers."""

import csv
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from tests import helpers
from tests.conftest import live_workers
from tests.helpers import digits_config as _config
from tests.program.test_resume import logged_losses
from tff_kd.program import experiment
from tff_kd.program import state_files

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_SMALL = ['--config=configs/digits.py', '--config.partition.num_clients=6',
          '--config.clients_per_round=3', '--noprogress']


def _train(*args, **kwargs) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, '-m', 'binaries.train', *args], cwd=_REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'), **kwargs)


# Bad flags and config values, a bad --root_dir and a busy one:
# tests/faults/test_bad_input.py, all in one process.


def _one_line_error(proc: subprocess.Popen, message: str) -> None:
  _, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 2, stderr[-2000:]
  assert 'Traceback' not in stderr
  last = stderr.strip().splitlines()[-1]
  assert last.startswith('train: error: ') and message in last, stderr[-800:]


@pytest.mark.parametrize('content,message', [
    (None, 'usps.h5 for dataset'),  # Missing.
    (b'\x00not an hdf5 file' * 8, 'is not a readable USPS file'),
])
def test_missing_or_corrupt_data_file_trains_nothing(tmp_path, content,
                                                     message):
  raw = tmp_path / 'raw'
  os.makedirs(raw)
  if content is not None:
    (raw / 'usps.h5').write_bytes(content)
  root = tmp_path / 'run'
  _one_line_error(_train(*_SMALL, f'--root_dir={root}',
                         '--config.dataset.name=usps',
                         f'--config.dataset.manual_dir={raw}',
                         f'--config.dataset.data_dir={tmp_path / "tfds"}'),
                  message)
  assert not os.path.exists(root / 'checkpoints')
  assert not os.path.exists(root / 'metrics.csv')


@pytest.mark.slow
def test_corrupt_checkpoint_trains_nothing(tmp_path):
  root = str(tmp_path / 'run')
  args = [*_SMALL, '--config.rounds=2', '--config.export=false',
          f'--root_dir={root}']
  proc = _train(*args)
  _, stderr = proc.communicate(timeout=600)
  assert proc.returncode == 0, stderr[-2000:]
  # Every checkpoint unreadable (one unreadable newest one falls back:
  # tests/program/test_experiment.py).
  for version in (0, 1, 2):
    with open(os.path.join(root, 'checkpoints', f'program_state_{version}',
                           state_files.STATE_FILE), 'wb') as f:
      f.write(b'\x00garbage' * 10)
  with open(os.path.join(root, 'metrics.csv')) as f:
    metrics = f.read()
  _one_line_error(_train(*args[:-2], '--config.rounds=4',
                         '--config.export=false', f'--root_dir={root}'),
                  'unreadable or incompatible')
  with open(os.path.join(root, 'metrics.csv')) as f:
    assert f.read() == metrics
  assert sorted(os.listdir(os.path.join(root, 'checkpoints'))) == [
      'program_state_0', 'program_state_1', 'program_state_2']


def test_console_shows_header_progress_and_summary_only(tmp_path):
  root = tmp_path / 'run'
  proc = _train(*_SMALL[:-1], '--config.rounds=2', f'--root_dir={root}')
  stdout, stderr = proc.communicate(timeout=600)
  assert proc.returncode == 0, stderr[-2000:]
  out = stdout.strip().splitlines()
  assert out[0] == ('train: fedavg on digits, 6 clients (3 per round), 2 '
                    f'rounds, seed 0; outputs in {root}')
  assert out[1].startswith('final test accuracy ') and '(best ' in out[1]
  for name in ('metrics.csv', 'tb', 'checkpoints', 'export/tff_kd/1',
               'curves.png', 'logs'):
    assert any(line.strip().endswith(str(root / name)) for line in out), name
  assert os.path.exists(root / 'curves.png')
  # The progress bar is all stderr holds: no INFO or deprecation records,
  # which go to the log file instead.
  assert 'round/s' in stderr
  for noise in ('INFO', 'I1', 'deprecated', 'Assets written'):
    assert noise not in stderr, stderr[-2000:]
  logged = ''.join(open(os.path.join(root, 'logs', f)).read()
                   for f in os.listdir(root / 'logs'))
  assert 'Program state saved' in logged and 'deprecated' in logged


def _rounds_logged(root: str) -> int:
  try:
    with open(os.path.join(root, 'metrics.csv')) as f:
      return len(list(csv.DictReader(f)))
  except FileNotFoundError:
    return 0


@pytest.mark.slow
def test_sigkill_then_restart_resumes_with_same_result(tmp_path):
  root = str(tmp_path / 'killed')
  args = [*_SMALL, '--config.rounds=5', '--config.export=false',
          f'--root_dir={root}']
  proc = _train(*args)
  deadline = time.time() + 300
  while _rounds_logged(root) < 2 and proc.poll() is None:
    assert time.time() < deadline, 'train made no progress'
    time.sleep(0.2)
  workers = [p.pid for p in live_workers(psutil.Process(proc.pid))]
  assert workers, 'the run should have a TFF worker'
  proc.send_signal(signal.SIGKILL)
  proc.communicate()
  done_before = _rounds_logged(root)
  assert 2 <= done_before < 5, 'the kill should land mid-run'
  # The killed run's own workers die with it (PDEATHSIG).
  deadline = time.time() + 10
  while any(psutil.pid_exists(pid) and psutil.Process(pid).status() !=
            psutil.STATUS_ZOMBIE for pid in workers):
    assert time.time() < deadline, f'workers {workers} outlived the kill'
    time.sleep(0.2)

  proc = _train(*args)
  stdout, stderr = proc.communicate(timeout=600)
  assert proc.returncode == 0, stderr[-2000:]
  # Rounds are logged before their checkpoint is saved: the kill may fall
  # between the two, and the resumed run then logs that round again, once.
  assert any(f'resumed after round {r}' in stdout
             for r in (done_before - 1, done_before)), stdout
  with open(os.path.join(root, 'metrics.csv')) as f:
    assert [int(r['round']) for r in csv.DictReader(f)] == [1, 2, 3, 4, 5]

  config = _config(rounds=5, export=False)
  straight = str(tmp_path / 'straight')
  experiment.run(config, straight, progress=False)
  # Every logged round has the uninterrupted run's loss, and the final weights are the same bit for bit.
  expected, got = logged_losses(straight), logged_losses(root)
  assert sorted(got) == [1, 2, 3, 4, 5]
  for r, values in got.items():
    assert values == [expected[r][0]] * len(values), r
  (_, got_state), (_, want_state) = map(helpers.saved_leaves,
                                        (root, straight))
  assert len(got_state) == len(want_state)
  for a, b in zip(got_state, want_state):  # Every leaf of the state.
    np.testing.assert_array_equal(a, b)
  # The finished process left no worker behind either.
  time.sleep(1)
  assert not [p for p in live_workers() if p.ppid() in (proc.pid, 1)]
