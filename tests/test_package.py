"""Importing tff_kd defers tensorflow_probability, and the module still works.

Scanning `sys.modules` (AutoGraph, `inspect`) does not load it."""

import os
import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent("""
    import sys
    import tff_kd  # Imports TFF, which imports tensorflow_privacy.
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
