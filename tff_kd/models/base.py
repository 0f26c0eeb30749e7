"""The type every classifier builder of this package returns: `Classifier`.

It lives apart from the builders so that they import in one direction:
`names` (text only) <- `base` <- `keras_models` (`from_keras`) <-
`py_models` (your own model, split by `from_keras`) <- `classifiers`
(`build_classifier`, which builds all of them) <- `pretraining` and
`pretrained`; `tests/test_layout.py` keeps every package of tff_kd free of
import circles.
`tff_kd.models.classifiers.Classifier` is this class.
"""

from typing import NamedTuple

import tensorflow as tf


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
