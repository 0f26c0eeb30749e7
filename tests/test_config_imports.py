"""The config classes import no TensorFlow (issue 41).

Checking a config needs its sections' dataclasses (`tff_kd.hparams`, the
`distill` section, every method's `hparams.py`) and the model and weights
names (`tff_kd.models.names`); importing any of them must import neither
TensorFlow nor TensorFlow Federated. Each module is imported in a fresh
interpreter of its own, which reports the import chain that pulled
TensorFlow in, if one did.

The names that stand in for TensorFlow's own lists (`KERAS_ACTIVATIONS`,
`APPLICATIONS`) are kept in step with Keras here (these tests import it).
"""

import os
import pathlib
import subprocess
import sys

import pytest

from tff_kd import hparams as hp
from tff_kd.models import names

ROOT = pathlib.Path(__file__).resolve().parents[1]
_METHODS = ROOT / 'tff_kd' / 'methods'
FORBIDDEN = ('tensorflow', 'tensorflow_federated')

CONFIG_MODULES = [
    'tff_kd.hparams',
    'tff_kd.core.distill_hparams',
    'tff_kd.models.names',
] + [
    f'tff_kd.methods.{p.name}.hparams'
    for p in sorted(_METHODS.iterdir())
    if (p / '__init__.py').exists() and (p / 'hparams.py').exists()
]

# Run in the child: records where each forbidden package was first asked
# for (the tff_kd frames of the stack), imports the module, and prints one
# line per forbidden package that ended up in sys.modules.
_CHILD = r'''
import importlib, sys, traceback
FORBIDDEN = {forbidden!r}
first = {{}}

class Spy:
  def find_spec(self, name, path=None, target=None):
    if name in FORBIDDEN and name not in first:
      first[name] = [f'{{f.filename}}:{{f.lineno}}'
                     for f in traceback.extract_stack()
                     if '/tff_kd/' in f.filename]
    return None

sys.meta_path.insert(0, Spy())
importlib.import_module({module!r})
for name in FORBIDDEN:
  if name in sys.modules:
    print(f'{{name}} imported via ' + ' -> '.join(first.get(name, ['?'])))
'''


def test_every_method_package_has_its_config_module_checked():
  packages = sorted(p.name for p in _METHODS.iterdir()
                    if (p / '__init__.py').exists())
  checked = {m.split('.')[2] for m in CONFIG_MODULES
             if m.startswith('tff_kd.methods.')}
  # A method without options (FedAvg) has no hparams module.
  assert checked == {p for p in packages
                     if (_METHODS / p / 'hparams.py').exists()}
  assert 'dafkd' in checked and 'fedgen' in checked


@pytest.mark.parametrize('module', CONFIG_MODULES)
def test_config_module_imports_no_tensorflow(module):
  env = dict(os.environ,
             PYTHONPATH=os.pathsep.join(
                 [str(ROOT)] + [p for p in os.environ.get(
                     'PYTHONPATH', '').split(os.pathsep) if p]))
  done = subprocess.run(
      [sys.executable, '-c',
       _CHILD.format(forbidden=FORBIDDEN, module=module)],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
      check=False)
  assert done.returncode == 0, (
      f'importing {module} failed: {done.stderr.strip().splitlines()[-1:]}')
  pulled = done.stdout.strip()
  assert not pulled, f'importing {module}: {pulled}'


def test_keras_activations_are_keras_names():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for name in hp.KERAS_ACTIVATIONS:
    assert callable(tf.keras.activations.get(name)), name


def test_applications_are_keras_applications():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  keras = sorted(
      n for n in dir(tf.keras.applications)
      if n[:1].isupper() and callable(getattr(tf.keras.applications, n)))
  assert list(names.APPLICATIONS) == keras


def test_models_lists_the_built_architectures():
  from tff_kd.models import classifiers  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=protected-access
  assert tuple(classifiers._ARCHITECTURES) == names.MODELS
