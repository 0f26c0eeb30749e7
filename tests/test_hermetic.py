"""The suite's writes stay in its own folders (`tests/hermetic.py`).

The session check in `tests/conftest.py` fails a run that writes into the
user's real home or into files of the checkout that git does not ignore;
these tests pin that the session runs in a home of its own and that the
check sees such writes.
"""

import os
import subprocess
import tempfile

from tests import hermetic


def test_the_session_has_a_home_of_its_own():
  home = os.environ[hermetic.HOME_ENV]
  assert os.path.expanduser('~') == home
  assert home.startswith(tempfile.gettempdir())
  assert os.environ[hermetic.REAL_HOME_ENV] != home
  for name in ('TFDS_DATA_DIR', 'KERAS_HOME', 'XDG_CACHE_HOME',
               'MPLCONFIGDIR'):
    assert os.environ[name].startswith(home + os.sep), name
  # The library's default data dir ('~/tensorflow_datasets') lands there.
  from tff_kd.program import settings  # pylint: disable=g-import-not-at-top
  default = settings.DatasetSettings().data_dir
  assert os.path.expanduser(default).startswith(home + os.sep)


def test_the_check_sees_writes_to_home_and_the_checkout(tmp_path):
  home, repo = tmp_path / 'home', tmp_path / 'repo'
  (home / '.cache').mkdir(parents=True)
  (home / '.cache' / 'old').write_text('x')
  repo.mkdir()
  git = ['git', '-C', str(repo)]
  subprocess.run(git + ['init', '-q'], check=True)
  (repo / '.gitignore').write_text('/runs/\n')
  (repo / 'kept.py').write_text('a = 1\n')
  subprocess.run(git + ['add', '.'], check=True)
  subprocess.run(git + ['-c', 'user.name=t', '-c', 'user.email=t@t',
                        'commit', '-q', '-m', 'x'], check=True)
  before = hermetic.snapshot(str(home), str(repo))
  assert not hermetic.changes(before, hermetic.snapshot(str(home),
                                                        str(repo)))
  (home / 'tensorflow_datasets').mkdir()
  (home / 'tensorflow_datasets' / 'cache.npz').write_text('x')
  (home / '.cache' / 'old').write_text('xy')
  (repo / 'runs').mkdir()
  (repo / 'runs' / 'ignored.csv').write_text('1')
  (repo / 'client_data').mkdir()
  (repo / 'client_data' / 'part.npz').write_text('1')
  (repo / 'kept.py').write_text('a = 2\n')
  assert hermetic.changes(before, hermetic.snapshot(str(home), str(repo))) == [
      f'changed: {home}/.cache/old',
      f'new: {home}/tensorflow_datasets/cache.npz',
      'checkout:  M kept.py',
      'checkout: ?? client_data/part.npz']
