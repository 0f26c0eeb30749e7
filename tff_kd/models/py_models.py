"""Your own Keras model by name: `model.name='py:<module>:<function>'`.

A config names a user's model as `py:<module>:<function>` (docs/own_model.md).
Checking the config finds the module without running it
(`tff_kd.models.names.check_py_model`); building the model
(`tff_kd.models.classifiers.build_classifier`, so every method, pretrained
weights, resume and export take it as they take the library's own) imports
the module and calls the function here:

* with the keyword arguments among `input_shape` (the images' (H, W, C),
  a tuple of ints), `num_classes` (an int) and `seed` (the run's seed)
  that its signature names (all of them if it takes `**kwargs`); it may
  take none, and must require no other;
* it returns either a functional Keras model and its feature layer (the
  layer's name or index in `model.layers`), as a tuple `(model,
  feature_layer)`, which `tff_kd.models.keras_models.from_keras` splits
  into extractor and head; or a `Classifier` already split (what
  `from_keras` returns).

The model must take the experiment's images ([batch, H, W, C], normalised
to [-1, 1]) and give `num_classes` logits (a final softmax is stripped by
`from_keras`). The function is called at every build, in eager mode and
inside TFF's graphs, so it must build a fresh model each time; its Keras
initialisers are reseeded from the run's seed, as Keras Applications' are
(`classifiers._SeededInitialisers`), so the same seed gives the same
initial weights in every build.
"""

import importlib
import inspect
from typing import Any, Callable, Sequence

import tensorflow as tf

from tff_kd import errors
from tff_kd.models import base
from tff_kd.models import keras_models
from tff_kd.models import names

# The keyword arguments a model function may take.
ARGUMENTS: tuple[str, ...] = ('input_shape', 'num_classes', 'seed')


def load_function(name: str) -> Callable[..., Any]:
  """The function a `py:<module>:<function>` name designates, imported.

  Raises:
    ConfigError: bad syntax, a module that is not found, or a module
      without such a function.
  """
  module_name, function_name = names.check_py_model('model', name)
  module = importlib.import_module(module_name)
  function = getattr(module, function_name, None)
  if not callable(function):
    raise errors.ConfigError(
        f'model {name!r}: module {module_name} ({module.__file__}) has no '
        f'function {function_name}')
  return function


def _call_arguments(name: str, function: Callable[..., Any],
                    available: dict[str, Any]) -> dict[str, Any]:
  """The arguments of `available` that `function` takes, by name.

  Raises:
    ConfigError: it requires an argument that is not one of `ARGUMENTS`.
  """
  try:
    parameters = inspect.signature(function).parameters.values()
  except (TypeError, ValueError):  # No signature (some builtins): none.
    return {}
  kind = inspect.Parameter
  named = (kind.POSITIONAL_OR_KEYWORD, kind.KEYWORD_ONLY)
  required = [p.name for p in parameters
              if p.default is kind.empty and (
                  p.kind == kind.POSITIONAL_ONLY or
                  (p.kind in named and p.name not in available))]
  if required:
    raise errors.ConfigError(
        f'model {name!r}: the function requires {", ".join(required)}; it '
        f'may take only {", ".join(ARGUMENTS)} (by keyword), or nothing')
  if any(p.kind == kind.VAR_KEYWORD for p in parameters):
    return dict(available)
  taken = {p.name for p in parameters if p.kind in named}
  return {k: v for k, v in available.items() if k in taken}


def _describe(value: Any) -> str:
  if isinstance(value, tuple):
    kinds = ', '.join(type(v).__name__ for v in value)
    return f'a tuple of {len(value)} ({kinds})'
  return f'a value of type {type(value).__name__}'


def _as_classifier(name: str, result: Any,
                   num_classes: int) -> base.Classifier:
  """The function's result as a `Classifier`, or one `ConfigError` line."""
  if isinstance(result, base.Classifier):
    return result
  if (isinstance(result, tuple) and len(result) == 2 and
      isinstance(result[0], tf.keras.Model)):
    try:
      return keras_models.from_keras(result[0], result[1],
                                     num_classes=num_classes)
    except errors.ConfigError as e:
      raise errors.ConfigError(f'model {name!r}: {e}') from None
  raise errors.ConfigError(
      f'model {name!r}: the function returned {_describe(result)}, not '
      '(a tf.keras.Model, its feature layer\'s name or index) nor a '
      'tff_kd Classifier (tff_kd.models.from_keras)')


def _check_shapes(name: str, classifier: base.Classifier,
                  input_shape: tuple[int, ...], num_classes: int) -> None:
  """Refuses a model that does not take the images or give the logits."""
  model = classifier.model
  takes = tuple(model.input_shape[1:])
  if len(takes) != len(input_shape) or any(
      t is not None and t != s for t, s in zip(takes, input_shape)):
    raise errors.ConfigError(
        f'model {name!r} takes inputs of shape {takes}, but the images are '
        f'{input_shape}: build it for the input_shape argument')
  gives = tuple(model.output_shape)
  if len(gives) != 2 or gives[-1] != num_classes:
    raise errors.ConfigError(
        f'model {name!r} gives outputs of shape {gives}, not [batch, '
        f'{num_classes}] logits: build it for the num_classes argument')


def build(name: str, *, input_shape: Sequence[int], num_classes: int,
          seed: int) -> base.Classifier:
  """Builds a `py:<module>:<function>` model as a `Classifier`.

  Called by `classifiers.build_classifier`, inside its reseeding scope.

  Args:
    name: The model name.
    input_shape: (H, W, C) of the images.
    num_classes: Number of logits.
    seed: The run's seed.

  Returns:
    A `Classifier` whose variables are those the function made.

  Raises:
    ConfigError: a bad name, a missing module or function, a function that
      requires other arguments, returns something else than a model and
      its feature layer or a `Classifier`, or whose model does not fit the
      images or classes.
  """
  function = load_function(name)
  input_shape = tuple(int(v) for v in input_shape)
  kwargs = _call_arguments(
      name, function, dict(input_shape=input_shape,
                           num_classes=int(num_classes), seed=int(seed)))
  classifier = _as_classifier(name, function(**kwargs), int(num_classes))
  _check_shapes(name, classifier, input_shape, int(num_classes))
  return classifier
