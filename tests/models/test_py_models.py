"""Your own Keras model from the command line: `model.name='py:<mod>:<fn>'`.

The name's checks (syntax, the module found without running it), the
function's contract (its arguments, what it returns, one `ConfigError`
line otherwise), the architecture digest, and real runs: a two-round run
of a user's module on the bundled digits, its resume to round 3, a run
folder without a digest (saved before digests were recorded) resuming,
and a resume with a module whose architecture changed refused in one
line, in Python (`experiment.run`) and from the `train` command.
"""

import importlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from tff_kd import errors
from tff_kd import models
from tff_kd.models import names
from tff_kd.models import py_models
from tff_kd.program import checkpoints
from tff_kd.program import experiment

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# A small CNN for 28x28x1 MNIST-like images by default; it is built for the
# experiment's images and classes (8x8x1 digits here) when given them.
CNN = '''
import tensorflow as tf


def build(input_shape=(28, 28, 1), num_classes=10):
  inputs = tf.keras.Input(input_shape)
  h = tf.keras.layers.Conv2D({width}, 3, padding='same',
                             activation='relu')(inputs)
  h = tf.keras.layers.MaxPool2D()(h)
  h = tf.keras.layers.Flatten()(h)
  h = tf.keras.layers.Dense(32, activation='relu', name='feat')(h)
  outputs = tf.keras.layers.Dense(num_classes, activation='softmax')(h)
  return tf.keras.Model(inputs, outputs), 'feat'
'''

# Functions that break the contract, and ones that keep it otherwise.
OTHERS = '''
import tensorflow as tf

from tff_kd import models


def _model(input_shape, num_classes):
  inputs = tf.keras.Input(input_shape)
  h = tf.keras.layers.Flatten()(inputs)
  h = tf.keras.layers.Dense(16, activation='relu', name='feat')(h)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(h))


def classifier(input_shape, num_classes, seed):
  return models.from_keras(_model(input_shape, num_classes), 'feat')


def fixed():
  return _model((8, 8, 1), 10), -2


def anything(**kwargs):
  return _model(kwargs['input_shape'], kwargs['num_classes']), 'feat'


def mnist_only():
  return _model((28, 28, 1), 10), 'feat'


def number():
  return 3


def model_only(input_shape, num_classes):
  return _model(input_shape, num_classes)


def bad_layer(input_shape, num_classes):
  return _model(input_shape, num_classes), 'nope'


def needs_width(width, input_shape):
  return _model(input_shape, 10), 'feat'


not_a_function = 3
'''


@pytest.fixture
def module(tmp_path, monkeypatch):
  """Writes a module into tmp_path (on sys.path); returns its writer."""
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(sys, 'dont_write_bytecode', True)
  written = []

  def write(name: str, source: str) -> str:
    (tmp_path / f'{name}.py').write_text(textwrap.dedent(source))
    sys.modules.pop(name, None)  # A rewritten module is imported again.
    importlib.invalidate_caches()
    written.append(name)
    return name

  yield write
  for name in written:
    sys.modules.pop(name, None)


def _one_line(e: pytest.ExceptionInfo) -> str:
  message = str(e.value)
  assert '\n' not in message, message
  return message


# ---------------------------------------------------------------------------
# The name's checks (no TensorFlow, no code of the module run).


@pytest.mark.parametrize('name', [
    'py:', 'py:mod', 'py:mod:', 'py::build', 'py:1mod:build',
    'py:mod:build:more', 'py:mod.:build', 'py:.mod:build', 'py:class:build',
    'py:mod:build-2', 'py:my mod:build'])
def test_bad_syntax_is_one_line(name):
  with pytest.raises(errors.ConfigError) as e:
    models.check_model_name('model.name', name)
  assert _one_line(e).startswith(f'model.name={name!r}: expected '
                                 'py:<module>:<function>')


def test_missing_module_is_one_line():
  with pytest.raises(errors.ConfigError) as e:
    models.check_model_name('model.name', 'py:no_such_module_xq:build')
  assert _one_line(e).startswith(
      "model.name='py:no_such_module_xq:build': module no_such_module_xq "
      'not found')
  with pytest.raises(errors.ConfigError, match='module no_such_pkg_xq.sub not '
                     'found'):
    models.check_model_name('model.name', 'py:no_such_pkg_xq.sub:build')


def test_config_check_finds_the_module_without_running_it(module):
  name = module('own_unrun', 'raise RuntimeError("ran")\n')
  models.check_model_name('model.name', f'py:{name}:build')
  assert name not in sys.modules
  settings = experiment.from_config(
      helpers.digits_config(**{'model.name': f'py:{name}:build'}))
  assert settings.model.name == f'py:{name}:build'
  with pytest.raises(errors.ConfigError, match='module own_nowhere not '
                     'found'):
    experiment.from_config(
        helpers.digits_config(**{'model.name': 'py:own_nowhere:build'}))


def test_the_current_directory_is_searched_last(tmp_path, monkeypatch):
  (tmp_path / 'own_here.py').write_text('def build():\n  pass\n')
  monkeypatch.chdir(tmp_path)
  path = [p for p in sys.path
          if os.path.abspath(p or os.curdir) != str(tmp_path)]
  monkeypatch.setattr(sys, 'path', path)
  models.check_model_name('model.name', 'py:own_here:build')
  assert sys.path[-1] == str(tmp_path)  # So that building imports it.
  sys.modules.pop('own_here', None)


def test_model_lists_take_py_entries_without_a_norm(module):
  name = module('own_listed', CNN.format(width=4))
  entry = f'py:{name}:build'
  assert names.parse_model_list(f'{entry},cnn:group', default_norm='batch',
                                key='feddf.client_models') == [
                                    (entry, 'batch'), ('cnn', 'group')]
  with pytest.raises(errors.ConfigError, match='module own_absent not '
                     'found'):
    names.parse_model_list('cnn,py:own_absent:build', default_norm='batch',
                           key='feddf.client_models')
  feddf = experiment.from_config(helpers.smoke_config(
      'feddf', **{'feddf.client_models': f'{entry},cnn'}))
  assert [n for _, n, _ in feddf.named_models] == [entry, 'cnn']
  fedd3a = experiment.from_config(helpers.smoke_config(
      'fedd3a', **{'fedd3a.client_models': f'cnn,{entry}'}))
  assert [(r, n) for r, n, _ in fedd3a.named_models] == [
      ('global model 0', 'cnn'), ('client model 0', 'cnn'),
      ('client model 1', entry)]


def test_py_models_take_no_pretrain_weights(module):
  name = module('own_unpretrained', CNN.format(width=4))
  with pytest.raises(errors.ConfigError, match='your own model'):
    names.check_weights('model.weights', 'pretrain:mnist',
                        f'py:{name}:build')
  with pytest.raises(errors.ConfigError, match='needs a keras:'):
    names.check_weights('model.weights', 'imagenet', f'py:{name}:build')


# ---------------------------------------------------------------------------
# Building: the function's contract.


def _build(name: str, seed: int = 0) -> models.Classifier:
  return models.build_classifier(name, input_shape=(8, 8, 1),
                                 num_classes=10, seed=seed)


def test_a_model_and_its_feature_layer_become_a_seeded_classifier(module):
  name = f"py:{module('own_cnn', CNN.format(width=4))}:build"
  clf = _build(name)
  assert clf.feature_dim == 32
  assert clf.model.input_shape == (None, 8, 8, 1)
  assert clf.model.output_shape == (None, 10)  # Logits: softmax stripped.
  same, other = _build(name), _build(name, seed=1)
  for a, b in zip(clf.model.get_weights(), same.model.get_weights()):
    np.testing.assert_array_equal(a, b)
  assert not all(np.array_equal(a, b) for a, b in zip(
      clf.model.get_weights(), other.model.get_weights()))


@pytest.mark.parametrize('function,feature_dim', [
    ('classifier', 16), ('fixed', 16), ('anything', 16)])
def test_functions_of_any_accepted_form_build(module, function,
                                              feature_dim):
  clf = _build(f"py:{module('own_forms', OTHERS)}:{function}")
  assert clf.feature_dim == feature_dim
  assert clf.model.output_shape == (None, 10)


@pytest.mark.parametrize('function,message', [
    ('number', 'the function returned a value of type int, not (a '
     'tf.keras.Model'),
    ('model_only', 'the function returned a value of type Functional'),
    ('bad_layer', "feature_layer 'nope' is not a layer of"),
    ('needs_width', 'the function requires width; it may take only '
     'input_shape, num_classes, seed'),
    ('mnist_only', 'takes inputs of shape (28, 28, 1), but the images are '
     '(8, 8, 1)'),
    ('missing', 'has no function missing'),
    ('not_a_function', 'has no function not_a_function'),
])
def test_a_function_breaking_the_contract_is_one_line(module, function,
                                                      message):
  name = f"py:{module('own_broken', OTHERS)}:{function}"
  with pytest.raises(errors.ConfigError) as e:
    _build(name)
  text = _one_line(e)
  assert text.startswith(f'model {name!r}') and message in text, text


def test_the_architecture_digest_follows_layers_and_shapes(module):
  narrow = f"py:{module('own_narrow', CNN.format(width=4))}:build"
  wide = f"py:{module('own_wide', CNN.format(width=8))}:build"
  digest = lambda clf: models.architecture_digest(clf.model)  # noqa: E731
  assert digest(_build(narrow)) == digest(_build(narrow, seed=3))
  assert len(digest(_build(narrow))) == 16
  assert digest(_build(narrow)) != digest(_build(wide))
  cnn = lambda norm: models.build_classifier(  # noqa: E731
      'cnn', input_shape=(8, 8, 1), num_classes=10, norm=norm)
  assert digest(cnn('batch')) != digest(cnn('group'))
  # A graph build (as in TFF's computations) has the eager one's digest.
  eager = digest(_build(narrow))
  with tf.Graph().as_default():
    assert digest(_build(narrow, seed=5)) == eager


# ---------------------------------------------------------------------------
# Real runs.


def _config(name: str, rounds: int, **overrides):
  return helpers.digits_config(**{'model.name': name, 'rounds': rounds,
                                  **overrides})


def _recorded(root: str) -> list[dict]:
  with open(os.path.join(root, checkpoints.ARCHITECTURE_FILE)) as f:
    return json.load(f)['models']


def test_train_resume_and_a_changed_architecture(module, tmp_path):
  name = f"py:{module('own_run', CNN.format(width=4))}:build"
  root = str(tmp_path / 'run')
  first = experiment.run(_config(name, 2), root, progress=False)
  assert first.final['round'] == 2
  digest = models.architecture_digest(_build(name).model)
  assert _recorded(root) == [
      {'role': 'global model 0', 'name': name, 'digest': digest}]
  with open(os.path.join(first.export_dir, 'metadata.json')) as f:
    assert json.load(f)['architecture'] == digest
  served = tf.saved_model.load(first.export_dir).signatures[
      'serving_default'](images=tf.zeros([2, 8, 8, 1]))
  assert served['logits'].shape == (2, 10)

  resumed = experiment.run(_config(name, 3, export=False), root,
                           progress=False)
  assert resumed.resumed_after == 2 and resumed.final['round'] == 3
  assert [r['round'] for r in resumed.history] == [3]

  # A folder saved before digests were recorded resumes, and records one.
  os.remove(os.path.join(root, checkpoints.ARCHITECTURE_FILE))
  again = experiment.run(_config(name, 3, export=False), root,
                         progress=False)
  assert again.resumed_after == 3 and not again.history
  assert _recorded(root)[0]['digest'] == digest

  # The same name, another architecture: refused in one line.
  module('own_run', CNN.format(width=8))
  with open(os.path.join(root, 'metrics.csv')) as f:
    metrics = f.read()
  with pytest.raises(errors.CheckpointError) as e:
    experiment.run(_config(name, 4, export=False), root, progress=False)
  wide = models.architecture_digest(_build(name).model)
  assert _one_line(e) == (
      f"{root} holds a run of model {name!r} with architecture {digest}, "
      f'but it builds architecture {wide} now (its layers or their shapes '
      'changed); restore the model code or use a new --root_dir')
  with open(os.path.join(root, 'metrics.csv')) as f:
    assert f.read() == metrics
  assert _recorded(root)[0]['digest'] == digest


def _train(cwd: str, *args: str) -> subprocess.CompletedProcess:
  """The `train` console command, run in `cwd` (where the module is)."""
  command = os.path.join(os.path.dirname(sys.executable), 'train')
  if not os.path.exists(command):
    pytest.skip('the train console command is not installed')
  return subprocess.run(
      [command, f'--config={_REPO}/configs/digits.py',
       '--config.partition.num_clients=6', '--config.clients_per_round=3',
       '--config.export=false', '--noprogress', *args],
      cwd=cwd, capture_output=True, text=True, timeout=600, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3',
               PYTHONPATH=os.pathsep.join(
                   p for p in (_REPO, os.environ.get('PYTHONPATH')) if p)))


def test_train_command_takes_a_module_of_the_current_directory(tmp_path):
  (tmp_path / 'own_cli.py').write_text(CNN.format(width=4))
  root = str(tmp_path / 'run')
  args = ['--config.model.name=py:own_cli:build', f'--root_dir={root}']
  done = _train(str(tmp_path), *args, '--config.rounds=2')
  assert done.returncode == 0, done.stderr[-2000:]
  assert 'final test accuracy' in done.stdout
  assert _recorded(root)[0]['name'] == 'py:own_cli:build'
  (tmp_path / 'own_cli.py').write_text(CNN.format(width=8))
  done = _train(str(tmp_path), *args, '--config.rounds=3')
  assert done.returncode == 2, done.stderr[-2000:]
  assert 'Traceback' not in done.stderr
  last = done.stderr.strip().splitlines()[-1]
  assert last.startswith(f"train: error: {root} holds a run of model "
                         "'py:own_cli:build' with architecture "), last
  done = _train(str(tmp_path), '--config.model.name=py:own_gone:build',
                f'--root_dir={tmp_path / "other"}')
  assert done.returncode == 2
  assert done.stderr.strip().splitlines()[-1] == (
      "train: error: model.name='py:own_gone:build': module own_gone not "
      'found (looked on sys.path and in the current directory '
      f'{os.path.realpath(tmp_path)})')


def test_unknown_model_names_mention_py_models():
  with pytest.raises(errors.ConfigError, match=r'py:<module>:<function>'):
    models.check_model_name('model.name', 'vgg')
  assert py_models.ARGUMENTS == ('input_shape', 'num_classes', 'seed')
