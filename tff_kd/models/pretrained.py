"""Pretrained initial weights: `model.weights` and the `client_weights` lists.

A model's weights setting is one of

* `''` (or None): the seeded random initialisation;
* `'imagenet'`: Keras' ImageNet weights of a `keras:<Application>` backbone
  (Keras downloads them once into `$KERAS_HOME/models`, by default
  `~/.keras/models`; offline, one `ConfigError` line says so and names the
  folder to put the file in); the new head stays seeded;
* `'pretrain:<dataset>'`: weights the library makes once by training the
  classifier on another dataset and caches under the data dir
  (`tff_kd.models.pretraining`);
* a path: Keras weights of the *whole* classifier (`Classifier.model`,
  e.g. `model.save_weights('w.weights.h5')` or `studies/fedd3a_protocol/pretrain.py`'s
  file): an `.h5` / `.weights.h5` / `.hdf5` file, a TensorFlow checkpoint
  (the prefix whose `.index` file exists), or a Keras SavedModel folder
  (e.g. a run's exported model).

`classifier_builder(...)` reads the weights once, eagerly, into the
classifier built for the experiment's image shape and classes, and refuses a
file that does not fit in one line naming the file and the first
mismatched variable (before any TFF computation is built). It returns a
no-arg builder whose every build, eager or inside a TFF computation's
graph, starts from those values: a variable creator hands each variable
(in creation order, which is the same in every build) its pretrained value
as its initial value. So the round-0 state of every method (the global
model, FedDF's prototypes, FedD3A's per-client models) holds the
pretrained weights without any method knowing; a resumed run reads its
checkpoint over them as before. The values are constants in the graphs of
the computations that build the model: fine for the models this library
trains (an ImageNet ResNet50 adds about 100 MB per such graph).
"""

import functools
import os
import socket
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_kd import errors
from tff_kd.models import classifiers
from tff_kd.models import pretraining
# The text-only settings and checks (no TensorFlow), re-exported here.
from tff_kd.models.names import check_weights
from tff_kd.models.names import check_weights_list
from tff_kd.models.names import IMAGENET
from tff_kd.models.names import parse_weights_list
from tff_kd.models.names import weights_format

# Seconds Keras' download may wait on a silent network before giving up.
_DOWNLOAD_TIMEOUT_S = 30.0

ClassifierFn = Callable[[], classifiers.Classifier]


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def _stamp(path: str) -> tuple:
  """A cache key part that changes when the weights file changes."""
  path = os.path.expanduser(path)
  fmt = weights_format(path)
  target = {'saved_model': os.path.join(path, 'saved_model.pb'),
            'checkpoint': path + '.index'}.get(fmt, path)
  stat = os.stat(target)
  return (os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


def _keras_cache_dir() -> str:
  home = os.environ.get('KERAS_HOME',
                        os.path.join(os.path.expanduser('~'), '.keras'))
  return os.path.join(home, 'models')


class _Recorder:
  """A variable creator that lists the named variables it sees, in order.

  Keras' `Model` also makes unnamed int64 counters in eager mode only; they
  are not weights and are left out, so eager and graph builds line up.
  """

  def __init__(self):
    self.created = []

  def __call__(self, next_creator, **kwargs):
    variable = next_creator(**kwargs)
    if kwargs.get('name') is not None:
      self.created.append(variable)
    return variable


class _InitialValues:
  """A variable creator giving the i-th named variable `values[i]`."""

  def __init__(self, values: Sequence[np.ndarray]):
    self._values = values
    self.count = 0

  def __call__(self, next_creator, **kwargs):
    if kwargs.get('name') is None:
      return next_creator(**kwargs)
    i = self.count
    self.count += 1
    if i >= len(self._values):
      raise RuntimeError(
          f'the model made more than the {len(self._values)} variables of '
          'its pretrained build: its builder is not deterministic')
    value = self._values[i]
    shape = kwargs.get('shape')
    if shape is not None and tf.TensorShape(shape) != value.shape:
      raise RuntimeError(
          f'variable {i} ({kwargs.get("name")}) has shape {shape}, but its '
          f'pretrained value {value.shape}: the builder is not '
          'deterministic')
    kwargs['initial_value'] = value
    return next_creator(**kwargs)


def build_with_values(build: ClassifierFn,
                      values: Sequence[np.ndarray]) -> classifiers.Classifier:
  """`build()` with its variables' initial values taken from `values`."""
  creator = _InitialValues(values)
  with tf.variable_creator_scope(creator):
    classifier = build()
  if creator.count != len(values):
    raise RuntimeError(
        f'the model made {creator.count} variables, its pretrained build '
        f'{len(values)}: the builder is not deterministic')
  return classifier


def _load_saved_model(model: tf.keras.Model, path: str, what: str) -> None:
  try:
    source = tf.keras.models.load_model(path, compile=False)
  except Exception as e:  # pylint: disable=broad-except
    # Keras raises a mix of IO, value and TF errors for unreadable folders.
    raise errors.ConfigError(
        f'{what}: {path} is not a Keras SavedModel ({_first_line(e)})'
    ) from None
  have, want = source.weights, model.weights
  for i, (src, dst) in enumerate(zip(have, want)):
    if tuple(src.shape) != tuple(dst.shape):
      raise errors.ConfigError(
          f'{what}: {path} does not fit the model: variable {i} '
          f'{src.name} has shape {tuple(src.shape)}, the model\'s {dst.name} '
          f'{tuple(dst.shape)}')
  if len(have) != len(want):
    raise errors.ConfigError(
        f'{what}: {path} does not fit the model: it holds {len(have)} '
        f'variables, the model {len(want)}')
  model.set_weights([v.numpy() for v in have])


def _legacy_h5_mismatch(model: tf.keras.Model, path: str) -> Optional[str]:
  """The first variable where a Keras 2 (`.h5`) weights file and `model`
  differ, or None (also for the newer `.weights.h5` layout, which Keras'
  own loader checks)."""
  import h5py  # pylint: disable=g-import-not-at-top
  with h5py.File(path, 'r') as f:
    group = f['model_weights'] if 'model_weights' in f else f
    if 'layer_names' not in group.attrs:
      return None
    text = lambda v: v.decode('utf8') if isinstance(v, bytes) else str(v)  # noqa: E731
    saved = [(text(w), tuple(group[text(layer)][text(w)].shape))
             for layer in group.attrs['layer_names']
             for w in group[text(layer)].attrs['weight_names']]
  expected = [(w.name, tuple(w.shape)) for layer in model.layers
              for w in layer.trainable_weights + layer.non_trainable_weights]
  for i, ((saved_name, saved_shape), (name, shape)) in enumerate(
      zip(saved, expected)):
    if saved_shape != shape:
      return (f'variable {i} is {saved_name} {saved_shape} in the file but '
              f'{name} {shape} in the model')
  if len(saved) != len(expected):
    return (f'the file holds {len(saved)} variables, the model '
            f'{len(expected)}')
  return None


def load_weights(model: tf.keras.Model, path: str, what: str) -> None:
  """Reads a weights file into `model`, or one `ConfigError` line.

  Args:
    model: The whole classifier (`Classifier.model`).
    path: An h5 file, a TF checkpoint prefix or a Keras SavedModel folder.
    what: The setting's name for the message, e.g. 'model.weights'.
  """
  path = os.path.expanduser(path)
  fmt = weights_format(path)
  if fmt is None:
    check_weights(what, path)
  if fmt == 'saved_model':
    _load_saved_model(model, path, what)
    return
  mismatch = _legacy_h5_mismatch(model, path) if fmt == 'h5' else None
  if mismatch:
    raise errors.ConfigError(
        f'{what}: {path} does not fit the model: {mismatch}')
  try:
    status = model.load_weights(path)
    if fmt == 'checkpoint':
      status.assert_existing_objects_matched()
  except (ValueError, AssertionError, KeyError, OSError,
          tf.errors.OpError) as e:
    raise errors.ConfigError(
        f'{what}: {path} does not fit the model: {_first_line(e)}') from None


def _imagenet_build(build_kwargs: dict, what: str) -> classifiers.Classifier:
  """The classifier with Keras' ImageNet backbone weights (downloaded by
  Keras if not cached), or one `ConfigError` line when they cannot be had."""
  previous = socket.getdefaulttimeout()
  socket.setdefaulttimeout(_DOWNLOAD_TIMEOUT_S)
  try:
    return classifiers.build_classifier(**build_kwargs,
                                        backbone_weights=IMAGENET)
  except errors.ConfigError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    # Keras' get_file raises a bare Exception for fetch failures.
    raise errors.ConfigError(
        f"{what}='imagenet': Keras could not get the ImageNet weights of "
        f"{build_kwargs['name']} ({_first_line(e)}); offline, put Keras' "
        f'weights file in {_keras_cache_dir()} (KERAS_HOME) or give a local '
        'weights file') from None
  finally:
    socket.setdefaulttimeout(previous)


# Pretrained values per (model, shape, classes, norm, seed, weights, file).
_VALUES: dict[tuple, list[np.ndarray]] = {}


def pretrained_values(name: str, *, input_shape: Sequence[int],
                      num_classes: int, norm: str, seed: int, weights: str,
                      what: str = 'model.weights',
                      options: Optional[dict] = None) -> list[np.ndarray]:
  """The initial values (named variables, in creation order) of the
  classifier with `weights` applied; read once per file version. Eager only.

  Raises:
    ConfigError: bad setting, unreadable or mismatched file, or ImageNet
      weights that cannot be downloaded.
  """
  check_weights(what, weights, name)
  kwargs = dict(name=name, input_shape=tuple(int(v) for v in input_shape),
                num_classes=int(num_classes), norm=norm, seed=int(seed),
                options=dict(options or {}))
  key = (tuple(sorted((k, repr(v)) for k, v in kwargs.items())),
         weights if weights == IMAGENET else _stamp(weights))
  if key in _VALUES:
    return _VALUES[key]
  if not tf.executing_eagerly():
    raise RuntimeError(
        'pretrained weights are read eagerly: call classifier_builder '
        'outside of graph building')
  recorder = _Recorder()
  with tf.variable_creator_scope(recorder):
    if weights == IMAGENET:
      classifier = _imagenet_build(kwargs, what)
    else:
      classifier = classifiers.build_classifier(**kwargs)
  if weights != IMAGENET:
    load_weights(classifier.model, weights, what)
  if {id(v) for v in recorder.created} != {
      id(v) for v in classifier.model.weights} or len(recorder.created) != (
          len(classifier.model.weights)):
    raise RuntimeError(
        f'{name}: the variables made while building are not the model\'s '
        'weights; its pretrained values cannot be carried into other builds')
  values = [v.numpy() for v in recorder.created]
  _VALUES[key] = values
  return values


def classifier_builder(name: str, *, input_shape: Sequence[int],
                       num_classes: int, norm: str = 'batch', seed: int = 0,
                       weights: Optional[str] = '',
                       what: str = 'model.weights',
                       options: Optional[dict] = None,
                       data_dir: str = '~/tensorflow_datasets',
                       manual_dir: Optional[str] = None) -> ClassifierFn:
  """A no-arg builder of the classifier, starting from `weights`.

  With no weights, `functools.partial(build_classifier, ...)`: the seeded
  model, exactly as before pretrained weights existed. Otherwise the
  weights are read now (eagerly; errors surface here, before any
  computation) and every build starts from them, in eager and graph mode.

  Args:
    name: A model name (`tff_kd.models.MODELS` or `keras:<Application>`).
    input_shape: (H, W, C) of the images.
    num_classes: Number of logits.
    norm: One of `NORMS` (unused by Keras Applications).
    seed: Initialiser seed (of the seeded parts: all of them without
      weights, the new head with 'imagenet').
    weights: '' / None, 'imagenet' or a path (module docstring).
    what: The setting's name, for messages.
    options: Keras Applications' further constructor arguments.
    data_dir: Where a `pretrain:` setting's weights are cached (and its
      dataset's tfds files).
    manual_dir: Raw files of a `pretrain:` setting's dataset.

  Returns:
    A no-arg callable returning a fresh `Classifier`.

  Raises:
    ConfigError: as `pretrained_values`, a bad model name, or a
      `pretrain:` setting whose pretraining failed.
  """
  build = functools.partial(classifiers.build_classifier, name,
                            input_shape=tuple(input_shape),
                            num_classes=num_classes, norm=norm, seed=seed,
                            **({'options': dict(options)} if options else {}))
  if not weights:
    return build
  weights = pretraining.resolve(
      weights, key=what, model=name, norm=norm, image_shape=input_shape,
      seed=seed, data_dir=data_dir, manual_dir=manual_dir)
  values = pretrained_values(name, input_shape=input_shape,
                             num_classes=num_classes, norm=norm, seed=seed,
                             weights=weights, what=what, options=options)
  return functools.partial(build_with_values, build, values)


def _model(builder: ClassifierFn) -> tf.keras.Model:
  return builder().model


def model_fn_of(builder: ClassifierFn) -> Callable[[], tf.keras.Model]:
  """The no-arg logits-model builder of a classifier builder."""
  return functools.partial(_model, builder)
