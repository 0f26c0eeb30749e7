"""Session-wide test setup: TFF's local context, and no leaked workers.

The session installs TFF's local C++ context once (with tff_kd's reaper) and,
when it ends, shuts the context down and fails the run if any
`worker_binary` child of this process is still alive.
"""

import os
import subprocess
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# The tests opt in to tff_kd's process set-up before anything imports TFF.
from tff_kd.program import context as _context  # pylint: disable=g-import-not-at-top
_context.install()

import psutil  # pylint: disable=g-import-not-at-top,g-bad-import-order
import pytest

SHARED_DATA = os.path.abspath(
    os.path.join(os.path.dirname(__file__), '..', '..', 'shared', 'data'))


def live_workers(parent: psutil.Process | None = None) -> list[psutil.Process]:
  """`worker_binary` processes that are not zombies (optionally: children)."""
  procs = (parent.children(recursive=True) if parent is not None
           else psutil.process_iter())
  found = []
  for p in procs:
    try:
      if 'worker_binary' in p.name() and p.status() != psutil.STATUS_ZOMBIE:
        found.append(p)
    except psutil.Error:
      pass
  return found


# A test that starts a process tree of its own (a Jupyter kernel, a
# benchmark) gives it this variable with a value of its own; the
# `worker_binary` processes of that tree inherit it (tff_kd starts them with
# the parent's environment), so the test can tell them from the workers of
# other programs running on the same machine.
WORKER_TAG_ENV = 'TFF_KD_TEST_WORKER_TAG'


def tagged_workers(tag: str) -> list[psutil.Process]:
  """Live `worker_binary` processes whose environment holds
  `WORKER_TAG_ENV=tag`."""
  found = []
  for p in live_workers():
    try:
      if p.environ().get(WORKER_TAG_ENV) == tag:
        found.append(p)
    except psutil.Error:
      pass
  return found


def wait_for_no_tagged_workers(tag: str, timeout_s: float = 10.0) -> None:
  """Fails unless every worker tagged `tag` is gone within `timeout_s`."""
  deadline = time.monotonic() + timeout_s
  while True:
    alive = [p.pid for p in tagged_workers(tag)]
    if not alive:
      return
    assert time.monotonic() < deadline, (
        f'worker_binary {alive} outlived the process that started it')
    time.sleep(0.2)


@pytest.fixture(scope='session')
def mnist_data_dir(tmp_path_factory) -> str:
  """A tfds data_dir for MNIST built from the shared raw files (~25 s, the
  first test that loads it pays; later ones read the npz cache)."""
  if not os.path.isdir(os.path.join(SHARED_DATA, 'mnist')):
    pytest.skip(f'shared data {SHARED_DATA}/mnist is missing')
  return str(tmp_path_factory.mktemp('tfds_mnist'))


def pytest_configure(config):
  config.addinivalue_line(
      'markers', 'slow: end-to-end runs of a minute or more; '
      '`make test-fast` (-m "not slow") leaves them out')


@pytest.fixture(scope='session', autouse=True)
def tff_context():
  from tff_kd.program import context  # pylint: disable=g-import-not-at-top
  context.set_local_context()
  yield
  context.shutdown()


_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_repo_entries_at_start: set[str] = set()


def _new_repo_entries() -> list[str]:
  """Top-level entries of the checkout made since the session started that
  git does not ignore (a test writing into the checkout, e.g. a run with
  an empty --root_dir wrote client_data/ and logs/ there once)."""
  new = sorted(set(os.listdir(_REPO)) - _repo_entries_at_start)
  if not new or not os.path.exists(os.path.join(_REPO, '.git')):
    return []
  ignored = subprocess.run(
      ['git', '-C', _REPO, 'check-ignore', '--', *new], capture_output=True,
      text=True, check=False).stdout.split()
  return [n for n in new if n not in ignored]


def pytest_sessionstart(session):
  _repo_entries_at_start.update(os.listdir(_REPO))


def pytest_sessionfinish(session, exitstatus):
  from tff_kd.program import context  # pylint: disable=g-import-not-at-top
  context.shutdown()
  written = _new_repo_entries()
  if written:
    print(f'\nERROR: the test session wrote into the checkout {_REPO}: '
          f'{written}')
    session.exitstatus = 1
  leaked = live_workers(psutil.Process())
  if leaked:
    print(f'\nERROR: worker_binary processes survived the test session: '
          f'{[p.pid for p in leaked]}')
    for p in leaked:
      p.kill()
    session.exitstatus = 1
