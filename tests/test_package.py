"""Importing tff_kd has no side effects; `context.install()` defers
tensorflow_probability, and the module still works.

Scanning `sys.modules` (AutoGraph, `inspect`) does not load it."""

import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent("""
    import sys
    import tff_kd
    from tff_kd.runtime import context
    assert 'tensorflow_probability' not in sys.modules  # No side effects.
    context.install()  # Imports TFF, which imports tensorflow_privacy.
    assert 'tensorflow_federated' in sys.modules
    stand_in = sys.modules['tensorflow_probability']
    assert type(stand_in).__name__ == '_Deferred', type(stand_in)
    import tensorflow as tf

    @tf.function  # AutoGraph scans every module's __file__ to convert it.
    def converted(x):
      if x > 0:  # A tensor condition: only AutoGraph can trace this.
        return x + 1
      return x - 1

    assert int(converted(tf.constant(1))) == 2
    import inspect
    assert inspect.getmodule(converted.python_function).__name__ == '__main__'
    assert sys.modules['tensorflow_probability'] is stand_in  # Still.
    from tensorflow_privacy.privacy.dp_query import discrete_gaussian_utils
    sample = discrete_gaussian_utils.sample_discrete_gaussian(1, [3], tf.int64)
    assert sample.shape == (3,)
    real = sys.modules['tensorflow_probability']
    assert type(real).__name__ == 'module', type(real)
    assert stand_in.distributions is real.distributions
    import tensorflow_probability.python.distributions as tfd
    assert tfd.Normal(0.0, 1.0).sample().shape == ()
    print('OK')
""")


def test_tensorflow_probability_loads_at_first_use(tmp_path):
  script = tmp_path / 'script.py'  # AutoGraph reads the source file.
  script.write_text(_SCRIPT)
  proc = subprocess.run([sys.executable, str(script)], capture_output=True,
                        text=True, timeout=240,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip().endswith('OK')


def _run(script: str, tmp_path) -> subprocess.CompletedProcess:
  path = tmp_path / 'script.py'
  path.write_text(textwrap.dedent(script))
  return subprocess.run(
      [sys.executable, str(path)], capture_output=True, text=True,
      timeout=240, cwd=os.path.dirname(os.path.dirname(__file__)),
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3',
               PYTHONPATH=os.pathsep.join(
                   [os.path.dirname(os.path.dirname(__file__)),
                    os.environ.get('PYTHONPATH', '')])))


def test_importing_the_library_has_no_side_effects(tmp_path):
  proc = _run("""
      import sys
      from tff_kd.runtime import context
      from tff_kd.program import experiment
      experiment.run  # Its first use imports the loop, and TFF.
      assert type(sys.modules['tensorflow_probability']).__name__ == 'module'
      assert not context._installed  # No worker reaper.
      print('OK')
  """, tmp_path)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip().endswith('OK')


@pytest.mark.parametrize('binary', ['train', 'compare', 'worker'])
def test_binaries_defer_tensorflow_probability(tmp_path, binary):
  """The binaries call `context.install()` before they import TFF."""
  proc = _run(f"""
      import sys
      import binaries.{binary}
      assert 'tensorflow_federated' in sys.modules
      stand_in = sys.modules['tensorflow_probability']
      assert type(stand_in).__name__ == '_Deferred', type(stand_in)
      from tff_kd.runtime import context
      assert context._installed  # The worker reaper.
      print('OK')
  """, tmp_path)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip().endswith('OK')
