"""A run folder (`--root_dir`): checked, locked for one run, kept clean.

A run folder holds one run at a time. `locked(root_dir)` creates the folder
(after `check` has refused an empty name, a file or a path under a file)
and takes an exclusive `fcntl.flock` on `<root_dir>/run.lock`, which it
holds until the block ends; the lock file holds the holder's PID, which a
second run on the same folder names in its one-line error. The kernel
releases a flock when its holder dies, even on SIGKILL, so a lock left by a
killed run never blocks its resume. The lock is re-entrant within a
process (the `train` binary takes it before its log file; `loop.run` takes
it again for notebook callers).

Under the lock, `remove_debris` deletes the `*_temp<NNNN>` files and
folders that TFF's writers (`tff.program.CSVFileReleaseManager`,
`FileProgramStateManager`) leave when a run is killed mid-write: they are
never read, and a live writer cannot own them while the lock is held.

This module imports no TensorFlow, so that checking and locking a folder
costs nothing before the heavy imports.
"""

import contextlib
import errno
import fcntl
import os
import re
import shutil
import threading
from typing import Iterator

from tff_kd import errors

LOCK_FILE = 'run.lock'
# TFF's writers: `<path>_temp<randint(1000, 9999)>`.
_DEBRIS = re.compile(r'_temp\d{4}$')
# Lock files this process holds: real path -> [fd, depth].
_held: dict[str, list[int]] = {}
_held_lock = threading.Lock()


def check(root_dir: str) -> None:
  """Creates `root_dir`, or raises `RunFolderError` with one line.

  Refused: an empty name, a path that is a file, a path under a file, a
  folder that cannot be created (permissions, immutable parent).
  """
  if not root_dir or not root_dir.strip():
    raise errors.RunFolderError('--root_dir is empty; name an output folder')
  if os.path.exists(root_dir) and not os.path.isdir(root_dir):
    raise errors.RunFolderError(
        f'--root_dir {root_dir} is a file, not a folder; name a folder')
  try:
    os.makedirs(root_dir, exist_ok=True)
  except OSError as e:
    reason = e.strerror or type(e).__name__
    if e.errno in (errno.ENOTDIR, errno.EEXIST):
      reason = 'a part of the path is a file'
    raise errors.RunFolderError(
        f'cannot create --root_dir {root_dir}: {reason}') from None


def holder(root_dir: str) -> str:
  """The PID written in the folder's lock file, or '?'."""
  try:
    with open(os.path.join(root_dir, LOCK_FILE)) as f:
      pid = f.read().strip()
  except OSError:
    return '?'
  return pid if pid.isdigit() else '?'


@contextlib.contextmanager
def locked(root_dir: str) -> Iterator[None]:
  """Holds the run folder's exclusive lock for the block.

  Creates the folder first (`check`).

  Raises:
    RunFolderError: the folder cannot be created or written, or another
      process holds its lock (naming that process's PID).
  """
  check(root_dir)
  key = os.path.realpath(root_dir)
  with _held_lock:  # _acquire does not block: it may run under it.
    entry = _held.setdefault(key, [-1, 0])
    if not entry[1]:
      try:
        entry[0] = _acquire(root_dir)
      except BaseException:
        del _held[key]
        raise
    entry[1] += 1
  try:
    yield
  finally:
    with _held_lock:
      entry = _held[key]
      entry[1] -= 1
      if not entry[1]:
        del _held[key]
        os.close(entry[0])  # Releases the flock.


def _acquire(root_dir: str) -> int:
  path = os.path.join(root_dir, LOCK_FILE)
  try:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
  except OSError as e:
    raise errors.RunFolderError(
        f'cannot write in --root_dir {root_dir}: '
        f'{e.strerror or type(e).__name__} ({path})') from None
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    os.close(fd)
    raise errors.RunFolderError(
        f'{root_dir} is in use by another run (PID {holder(root_dir)}); '
        'wait for it to end or use another --root_dir') from None
  try:
    os.ftruncate(fd, 0)
    os.write(fd, f'{os.getpid()}\n'.encode())
  except OSError as e:
    os.close(fd)
    raise errors.RunFolderError(
        f'cannot write in --root_dir {root_dir}: '
        f'{e.strerror or type(e).__name__} ({path})') from None
  return fd


def remove_debris(root_dir: str, *subdirs: str) -> list[str]:
  """Deletes TFF's half-written `*_temp<NNNN>` entries in `root_dir` and
  its `subdirs`; call it under `locked`. Returns what it deleted."""
  removed = []
  for folder in (root_dir, *(os.path.join(root_dir, s) for s in subdirs)):
    try:
      names = os.listdir(folder)
    except FileNotFoundError:
      continue
    for name in names:
      if not _DEBRIS.search(name):
        continue
      path = os.path.join(folder, name)
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
      else:
        os.remove(path)
      removed.append(path)
  return removed
