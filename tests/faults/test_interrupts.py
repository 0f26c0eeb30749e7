"""A run killed or interrupted at any instant: one line, and an exact resume.

Real `train` processes (digits, 3 rounds). The kill lands at the one
dangerous instant, between round 2's metrics and its checkpoint, by the
loop's own hook (`loop.KILL_BEFORE_CHECKPOINT_ENV`: the process SIGKILLs
itself there); the resumed run must hold every round exactly once in
`metrics.csv` and TensorBoard, name the best round from the CSV, and leave
no half-written `*_temp*` entries. SIGINT (Ctrl-C) and SIGTERM go to the
whole process group, as a terminal sends them, the TFF worker included.

In-process runs (digits, `helpers.digits_config`) stop at that instant by an
exception from the same hook, then restart in the two ways where only the
run's own drop of the metrics released past its checkpoint
(`releases.drop_after`) removes them, as TFF's CSV release manager replaces
the rows from a key on only when it releases one: a resumed run that dies
before its first release, and a restart with no round left to run.
"""

import os
import signal
import time

import psutil
import pytest

from tests.conftest import live_workers
from tests.faults import common
from tests.helpers import digits_config
from tff_kd.program import checkpoints
from tff_kd.program import experiment
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


class _Killed(Exception):
  """Stands in for a kill of an in-process run."""


def _stopped_between_metrics_and_checkpoint(root: str, monkeypatch) -> None:
  """Leaves `root` as the kill test's first run does: rounds 1 and 2 in
  the CSV and TensorBoard, round 1 the newest checkpoint."""

  def before_checkpoint(round_num: int) -> None:
    if round_num == 2:
      raise _Killed(round_num)

  with monkeypatch.context() as m:
    m.setattr(loop, '_before_checkpoint', before_checkpoint)
    with pytest.raises(_Killed):
      experiment.run(digits_config(rounds=3, export=False), root,
                     progress=False)
  assert checkpoints.last_saved_round(root) == 1
  assert common.csv_rounds(root) == [1, 2]
  assert common.tensorboard_steps(root) == [1, 2]


def test_a_resume_that_dies_before_its_first_release_keeps_no_stale_round(
    tmp_path, monkeypatch):
  root = str(tmp_path / 'run')
  _stopped_between_metrics_and_checkpoint(root, monkeypatch)
  released = []

  def release(manager, value, key):
    del manager, value  # Unused: the run dies here.
    released.append(key)
    raise _Killed(key)

  monkeypatch.setattr(loop, '_release', release)
  with pytest.raises(_Killed):
    experiment.run(digits_config(rounds=3, export=False), root,
                   progress=False)
  # It trained round 2 again and died just before releasing it.
  assert released == [2]
  assert checkpoints.last_saved_round(root) == 1
  assert common.csv_rounds(root) == [1]
  assert common.tensorboard_steps(root) == [1]


def test_a_restart_with_no_round_left_keeps_no_stale_round(tmp_path,
                                                          monkeypatch):
  root = str(tmp_path / 'run')
  _stopped_between_metrics_and_checkpoint(root, monkeypatch)
  # `rounds` at the checkpoint's round: nothing to run, nothing released.
  result = experiment.run(digits_config(rounds=1, export=False), root,
                          progress=False)
  assert result.resumed_after == 1 and result.history == []
  assert checkpoints.last_saved_round(root) == 1
  assert common.csv_rounds(root) == [1]
  assert common.tensorboard_steps(root) == [1]
