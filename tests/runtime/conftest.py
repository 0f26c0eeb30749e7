"""Fixtures of the runtime tests."""

import pytest

from tff_kd.runtime import context


@pytest.fixture
def restore_context():
  """Puts the session's context back (tests/conftest.py) after a test that
  installs its own."""
  yield
  context.shutdown()
  context.set_local_context()
