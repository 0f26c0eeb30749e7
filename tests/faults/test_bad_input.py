"""Bad input and a busy or unusable run folder: one line, exit 2, nothing run.

Every case goes through the `train` binary's own flag parser and `main`,
all cases in one process (`common.main_in_process`: one TensorFlow
start-up instead of one per case); one case runs the real binary to check
that absl's `app.run` adds nothing (no usage lines). The folder lock is
checked across real processes: the test process holds it, the binary is
refused naming its PID; a holder killed with SIGKILL leaves a lock that
does not block.
"""

import os
import signal
import subprocess
import sys

import pytest

from tests.faults import common
from tff_kd import errors
from tff_kd.program import run_folder


def _chattr(path: str, flag: str) -> bool:
  return subprocess.run(['chattr', flag, path], capture_output=True,
                        check=False).returncode == 0


@pytest.fixture
def immutable_dir(tmp_path):
  """A folder nothing can be created in: `chattr +i` (needs root's
  CAP_LINUX_IMMUTABLE), else mode 0555 for a user other than root."""
  path = tmp_path / 'immutable'
  path.mkdir()
  if _chattr(str(path), '+i'):
    yield str(path)
    _chattr(str(path), '-i')
  elif os.geteuid() != 0:
    path.chmod(0o555)
    yield str(path)
    path.chmod(0o755)
  else:
    pytest.skip('chattr +i is not permitted here')


def test_every_bad_input_is_one_line_and_exit_2(tmp_path, immutable_dir):
  a_file = tmp_path / 'a_file'
  a_file.write_text('x')
  held = tmp_path / 'held'
  readme = os.path.join(common.REPO, 'README.md')
  run = f'--root_dir={tmp_path / "run"}'
  cases = [
      (['--seed=-1', run], 'seed must be an integer >= 0, got -1'),
      (['--config.client_optimizer.learning_rate=-0.1', run],
       'client_optimizer.learning_rate must be a finite number > 0'),
      (['--config.client_optimizer.learning_rate=inf', run],
       'client_optimizer.learning_rate must be a finite number > 0, got inf'),
      ([f'--config={readme}', run], 'cannot load the config file'),
      (['--method=fedfoo', run], "method 'fedfoo' is unknown"),
      (['--config.nosuch=1', run], "config key 'nosuch' does not exist"),
      (['--config=configs/nosuch.py', run], 'cannot load the config file'),
      (['--config.partition.alpha=-0.5', run], 'alpha must be > 0, got -0.5'),
      (['stray', run], "unexpected argument(s) 'stray'"),
      ([f'--root_dir={a_file}/run'],
       f'cannot create --root_dir {a_file}/run: a part of the path is a file'),
      ([f'--root_dir={a_file}'], f'--root_dir {a_file} is a file'),
      ([f'--root_dir={immutable_dir}/run'],
       f'cannot create --root_dir {immutable_dir}/run'),
      ([f'--root_dir={immutable_dir}'],
       f'cannot write in --root_dir {immutable_dir}'),
      (['--root_dir='], '--root_dir is empty'),
      ([f'--root_dir={held}'],
       f'{held} is in use by another run (PID {os.getpid()})'),
  ]
  first = [*common.SMALL]
  with run_folder.locked(str(held)):
    results = common.main_in_process([first + argv for argv, _ in cases])
  for (argv, message), result in zip(cases, results):
    assert result['code'] == 2, (argv, result)
    common.one_line_error(2, result['stderr'], message)
    assert len(result['stderr'].strip().splitlines()) == 1, result
  assert not os.path.exists(tmp_path / 'run')  # Refused before any output.
  assert os.listdir(held) == [run_folder.LOCK_FILE]


def test_the_binary_itself_gives_one_line(tmp_path):
  """No usage lines from absl around a stray positional argument."""
  proc = common.train(*common.SMALL, f'--root_dir={tmp_path}', 'extra')
  _, stderr = proc.communicate(timeout=300)
  common.one_line_error(proc.returncode, stderr, "unexpected argument(s) "
                        "'extra'")
  assert len(stderr.strip().splitlines()) == 1, stderr


def test_a_lock_left_by_a_killed_holder_does_not_block(tmp_path):
  root = str(tmp_path / 'run')
  holder = subprocess.Popen(
      [sys.executable, '-c', 'import sys, time\n'
       'from tff_kd.program import run_folder\n'
       f'with run_folder.locked({root!r}):\n'
       '  print("locked", flush=True); time.sleep(600)'],
      cwd=common.REPO, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == 'locked'
    with pytest.raises(errors.RunFolderError,
                       match=rf'in use by another run \(PID {holder.pid}\)'):
      with run_folder.locked(root):
        pass
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  assert run_folder.holder(root) == str(holder.pid)  # Stale, and harmless:
  with run_folder.locked(root):
    assert run_folder.holder(root) == str(os.getpid())
    with run_folder.locked(root):  # Re-entrant within a process.
      pass
    # Another open file description of this process is refused too.
    with pytest.raises(errors.RunFolderError):
      run_folder._acquire(root)  # pylint: disable=protected-access


def test_debris_of_killed_writers_is_removed(tmp_path):
  root = tmp_path
  (root / 'checkpoints' / 'program_state_3_temp1234').mkdir(parents=True)
  (root / 'checkpoints' / 'program_state_2').mkdir()
  (root / 'metrics.csv_temp9876').write_text('round\n')
  (root / 'metrics.csv').write_text('round\n')
  with run_folder.locked(str(root)):
    removed = run_folder.remove_debris(str(root), 'checkpoints')
  assert sorted(os.path.basename(p) for p in removed) == [
      'metrics.csv_temp9876', 'program_state_3_temp1234']
  assert common.debris(str(root)) == []
  assert os.path.isdir(root / 'checkpoints' / 'program_state_2')
