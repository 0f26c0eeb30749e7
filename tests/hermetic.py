"""The suite's own home: what it writes stays in its temporary folders.

`enter()` (called by `tests/conftest.py` before anything imports
TensorFlow) points HOME, the tfds data dir, the Keras cache and XDG's cache
at one temporary folder for the whole session, shared by the pytest-xdist
workers, which inherit the environment. `snapshot` and `changes` tell what
a session wrote where it must not: the user's real home and the files of
the checkout that git does not ignore.
"""

import os
import shutil
import subprocess
import tempfile
from typing import Optional

# Set by the first process of a session (the controller); its workers
# inherit it and share the folder.
HOME_ENV = 'TFF_KD_TEST_HOME'
REAL_HOME_ENV = 'TFF_KD_TEST_REAL_HOME'


def enter() -> bool:
  """Moves this session's HOME and caches into a temporary folder.

  Returns:
    True in the process that made the folder (it removes it, `leave`).
  """
  if os.environ.get(HOME_ENV):
    return False
  home = tempfile.mkdtemp(prefix='tff_kd_test_home.')
  os.environ[REAL_HOME_ENV] = os.path.expanduser('~')
  os.environ[HOME_ENV] = home
  os.environ['HOME'] = home
  os.environ['TFDS_DATA_DIR'] = os.path.join(home, 'tensorflow_datasets')
  os.environ['KERAS_HOME'] = os.path.join(home, '.keras')
  os.environ['XDG_CACHE_HOME'] = os.path.join(home, '.cache')
  os.environ['MPLCONFIGDIR'] = os.path.join(home, '.config', 'matplotlib')
  return True


def leave() -> None:
  """Removes the session's home (in the process that made it)."""
  home = os.environ.get(HOME_ENV)
  if home and home.startswith(tempfile.gettempdir()):
    shutil.rmtree(home, ignore_errors=True)


def _tree(root: str, skip: tuple[str, ...] = ()) -> dict[str, tuple]:
  """(mtime, size) of every file and link under `root` (not following
  links), keyed by path; folders named in `skip` are left out."""
  found = {}
  for folder, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if os.path.join(folder, d) not in skip]
    for name in files:
      path = os.path.join(folder, name)
      try:
        stat = os.lstat(path)
      except OSError:
        continue
      found[path] = (stat.st_mtime_ns, stat.st_size)
  return found


def _git_status(repo: str) -> Optional[set[str]]:
  """The checkout's changed and untracked files that git does not ignore
  (None outside a git checkout)."""
  if not os.path.exists(os.path.join(repo, '.git')):
    return None
  out = subprocess.run(
      ['git', '-C', repo, 'status', '--porcelain', '--untracked-files=all'],
      capture_output=True, text=True, check=False).stdout
  return set(out.splitlines())


def snapshot(home: str, repo: str) -> dict:
  """What `changes` compares: the files of `home` (less the checkout and
  the session's own folders, when they lie inside it) and the checkout's
  git status."""
  skip = (repo, os.environ.get(HOME_ENV, ''), tempfile.gettempdir())
  return dict(home=_tree(home, skip) if os.path.isdir(home) else {},
              repo=_git_status(repo))


def changes(before: dict, after: dict) -> list[str]:
  """What differs between two snapshots, one line per path."""
  lines = []
  for path in sorted(set(before['home']) | set(after['home'])):
    if before['home'].get(path) != after['home'].get(path):
      what = ('new' if path not in before['home'] else
              'removed' if path not in after['home'] else 'changed')
      lines.append(f'{what}: {path}')
  if before['repo'] is not None and after['repo'] is not None:
    lines += [f'checkout: {entry}'
              for entry in sorted(after['repo'] - before['repo'])]
  return lines
