"""What every model builder of this package shares: the type a classifier
builder returns (`Classifier`), and how a builder constructs its Keras
models (`constructs_keras_models`).

It lives apart from the builders so that they import in one direction:
`names` (text only) <- `base` <- `keras_models` (`from_keras`) <-
`py_models` (your own model, split by `from_keras`) <- `classifiers`
(`build_classifier`, which builds all of them) <- `pretraining` and
`pretrained`; `tests/test_layout.py` keeps every package of tff_kd free of
import circles.
`tff_kd.models.classifiers.Classifier` is this class.
"""

import functools
from typing import Callable, NamedTuple, TypeVar

import tensorflow as tf

_F = TypeVar('_F', bound=Callable)


def constructs_keras_models(build: _F) -> _F:
  """Decorator: `build` constructs its functional Keras models in inference
  mode, which builds them 3-4x faster in a graph and gives the same models.

  Keras runs every layer once, symbolically, when a functional model is
  constructed, only to infer its output; a layer whose `training` is left
  unset reads Keras' learning phase, which in a graph (TFF traces every
  computation into one) is a tensor, so each BatchNormalization builds both
  of its branches and its moving-average updates as `tf.cond`s. With the
  learning phase 0 during the construction it builds only the inference
  branch. Nothing of it is kept: Keras does not record a `training` value it
  filled in itself, so the model's later calls (`training=True` or not) and
  its weights, their initial values, order and names, and its config are
  those of a model constructed without it (`tests/models/test_classifiers.py`
  pins the weights, the outputs in both modes and the architecture digest;
  the digits CNN: 0.28 to 0.07 s a build in a graph).

  Uses Keras 2.14's internal, warning-free form of `learning_phase_scope`.
  """

  @functools.wraps(build)
  def constructed(*args, **kwargs):
    from keras.src import backend as keras_backend  # pylint: disable=g-import-not-at-top
    with keras_backend.deprecated_internal_learning_phase_scope(0):
      return build(*args, **kwargs)

  return constructed  # type: ignore[return-value]


class Classifier(NamedTuple):
  """A classifier and its two shared-variable halves.

  Attributes:
    model: images -> logits.
    features: images -> [batch, feature_dim] features.
    head: features -> logits.
    feature_dim: Size of the feature vector.
  """

  model: tf.keras.Model
  features: tf.keras.Model
  head: tf.keras.Model
  feature_dim: int
