"""Session-wide test setup: a home of its own, TFF's local context, and no
leaked workers.

Before anything imports TensorFlow, the session moves HOME and the tfds,
Keras and XDG caches into one temporary folder (`tests/hermetic.py`). It
installs TFF's local C++ context once (with tff_kd's reaper) and, when it
ends, shuts the context down and fails the run if any `worker_binary` child
of this process is still alive, or if the session wrote into the user's
real home or into files of the checkout that git does not ignore.
"""

import os
import time

from tests import hermetic

_OWNS_HOME = hermetic.enter()
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# The tests opt in to tff_kd's process set-up before anything imports TFF.
from tff_kd.runtime import context as _context  # pylint: disable=g-import-not-at-top
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
  from tff_kd.runtime import context  # pylint: disable=g-import-not-at-top
  context.set_local_context()
  yield
  context.shutdown()


_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_before: dict = {}


def _is_controller(session) -> bool:
  """The process that runs the session (pytest-xdist's workers are not)."""
  return not hasattr(session.config, 'workerinput')


def pytest_sessionstart(session):
  if _is_controller(session):
    _before.update(hermetic.snapshot(
        os.environ[hermetic.REAL_HOME_ENV], _REPO))


def pytest_sessionfinish(session, exitstatus):
  from tff_kd.runtime import context  # pylint: disable=g-import-not-at-top
  context.shutdown()
  if _is_controller(session) and _before:
    written = hermetic.changes(_before, hermetic.snapshot(
        os.environ[hermetic.REAL_HOME_ENV], _REPO))
    if written:
      print('\nERROR: the test session wrote outside its temporary folders '
            "and the checkout's ignored paths:\n  " + '\n  '.join(written))
      session.exitstatus = 1
  if _OWNS_HOME:
    hermetic.leave()
  leaked = live_workers(psutil.Process())
  if leaked:
    print(f'\nERROR: worker_binary processes survived the test session: '
          f'{[p.pid for p in leaked]}')
    for p in leaked:
      p.kill()
    session.exitstatus = 1
