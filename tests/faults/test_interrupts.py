"""A run killed or interrupted at any instant: one line, and an exact resume.

Real `train` processes (digits, 3 rounds). The kill lands at the one
dangerous instant, between round 2's metrics and its checkpoint, by the
loop's own hook (`loop.KILL_BEFORE_CHECKPOINT_ENV`: the process SIGKILLs
itself there); the resumed run must hold every round exactly once in
`metrics.csv` and TensorBoard, name the best round from the CSV, and leave
no half-written `*_temp*` entries. SIGINT (Ctrl-C) and SIGTERM go to the
whole process group, as a terminal sends them, the TFF worker included.
"""

import os
import signal
import time

import psutil
import pytest

from tests.conftest import live_workers
from tests.faults import common
from tff_kd.program import loop
from tff_kd.program import plots


def test_a_kill_between_metrics_and_checkpoint_loses_no_round(tmp_path):
  root = str(tmp_path / 'run')
  args = [*common.SMALL, '--config.rounds=3', f'--root_dir={root}']
  proc = common.train(*args, env={loop.KILL_BEFORE_CHECKPOINT_ENV: '2'})
  _, stderr = proc.communicate(timeout=300)
  assert proc.returncode == -signal.SIGKILL, stderr[-2000:]
  # Round 2 is logged, not checkpointed; the lock file names a dead PID.
  assert common.csv_rounds(root) == [1, 2]
  assert sorted(os.listdir(os.path.join(root, 'checkpoints'))) == [
      'program_state_0', 'program_state_1']

  proc = common.train(*args)
  stdout, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 0, stderr[-2000:]
  assert 'resumed after round 1' in stdout
  assert common.csv_rounds(root) == [1, 2, 3]
  assert common.tensorboard_steps(root) == [1, 2, 3]
  history = plots.read_metrics(root)
  accuracy = dict(zip(history['round'], history['test/accuracy']))
  best = max((a, int(r)) for r, a in accuracy.items())
  assert f'(best {best[0]:.4f} in round {best[1]})' in stdout, stdout
  assert common.debris(root) == []


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_process_group_is_one_line(tmp_path, signum):
  root = str(tmp_path / 'run')
  proc = common.train(*common.SMALL, '--config.rounds=50',
                      f'--root_dir={root}', start_new_session=True)
  deadline = time.monotonic() + 300
  while not os.path.exists(os.path.join(root, 'metrics.csv')) or (
      not common.csv_rounds(root)):
    assert proc.poll() is None and time.monotonic() < deadline
    time.sleep(0.2)
  workers = live_workers(psutil.Process(proc.pid))
  os.killpg(proc.pid, signum)
  sent = time.monotonic()
  _, stderr = proc.communicate(timeout=120)
  seconds = time.monotonic() - sent
  name = signal.Signals(signum).name
  last = common.one_line_error(proc.returncode, stderr, f'stopped by {name}; ')
  saved = max(int(d.rsplit('_', 1)[1])
              for d in os.listdir(os.path.join(root, 'checkpoints')))
  assert (f'the last good state (round {saved}) is in {root}/checkpoints; run '
          'the same command to resume') in last
  assert seconds < 30, seconds
  logged = ''.join(open(os.path.join(root, 'logs', f)).read()
                   for f in os.listdir(os.path.join(root, 'logs')))
  assert 'Traceback' in logged and f'KeyboardInterrupt: {name}' in logged
  print(f'{name}: exit {proc.returncode} {seconds:.1f} s after the signal: '
        f'{last}')
  for worker in workers:
    assert not worker.is_running() or (
        worker.status() == psutil.STATUS_ZOMBIE)
