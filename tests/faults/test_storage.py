"""A write that fails mid-run: one line naming the path, the last good round
and how to resume; the resumed run then logs every round exactly once.

A full disk is simulated: the injected write raises `OSError(ENOSPC)`, as
Python's and TF's file writes do on a full file system (mounting a small
one needs privileges a test cannot assume). The checkpoint folder that
turns read-only mid-run is real: `chattr +i` where root may use it (else
mode 0555 for another user), just before round 2's checkpoint.
"""

import errno
import os
import subprocess

import pytest
import tensorflow_federated as tff

from tests.faults import common
from tests.helpers import digits_config
from tff_kd import errors
from tff_kd.program import checkpoints
from tff_kd.program import experiment


def _read_only(path: str, on: bool) -> bool:
  """Makes a folder read-only (or writable again); False if impossible."""
  if subprocess.run(['chattr', '+i' if on else '-i', path],
                    capture_output=True, check=False).returncode == 0:
    return True
  if os.geteuid() != 0:
    os.chmod(path, 0o555 if on else 0o755)
    return True
  return False


@pytest.mark.parametrize('fault', ['disk_full_at_checkpoint',
                                   'disk_full_at_metrics',
                                   'checkpoints_read_only'])
def test_a_failed_write_is_one_line_and_the_run_resumes(tmp_path, monkeypatch,
                                                        fault):
  root = str(tmp_path / 'run')
  config = digits_config(rounds=3, export=False)
  folder = os.path.join(root, 'checkpoints')
  real_save = checkpoints.CheckpointManager.save
  real_release = tff.program.CSVFileReleaseManager.release
  made_read_only = []

  async def save(self, state, version):
    if version == 2 and fault == 'disk_full_at_checkpoint':
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                    self.path_for_version(version))
    if version == 2 and fault == 'checkpoints_read_only':
      if not _read_only(folder, True):
        pytest.skip('no way to make a folder read-only here')
      made_read_only.append(folder)
    return await real_save(self, state, version)

  async def release(self, value, key):
    if key == 2 and fault == 'disk_full_at_metrics':
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                    os.path.join(root, 'metrics.csv'))
    return await real_release(self, value, key)

  monkeypatch.setattr(checkpoints.CheckpointManager, 'save', save)
  monkeypatch.setattr(tff.program.CSVFileReleaseManager, 'release', release)
  try:
    with pytest.raises(errors.StorageError) as raised:
      experiment.run(config, root, progress=False)
  finally:
    for path in made_read_only:
      _read_only(path, False)
  message = str(raised.value)
  assert '\n' not in message
  path = {'disk_full_at_checkpoint': f'{folder}/program_state_2',
          'disk_full_at_metrics': f'{root}/metrics.csv',
          'checkpoints_read_only': f'{folder}/program_state_2'}[fault]
  assert message.startswith(f'cannot write {path}'), message
  reason = ('No space left on device' if fault.startswith('disk_full')
            else 'ermission denied' if os.geteuid() else
            'Operation not permitted')
  assert reason in message, message
  assert (f'the last good state (round 1) stays in {folder}; free space or '
          'make the folder writable, then run the same command to resume'
          in message), message
  print(f'{fault}: {message}')

  monkeypatch.undo()
  result = experiment.run(config, root, progress=False)
  assert result.resumed_after == 1
  assert common.csv_rounds(root) == [1, 2, 3]
  assert common.tensorboard_steps(root) == [1, 2, 3]
  assert common.debris(root) == []
