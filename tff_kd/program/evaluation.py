"""Centralised evaluation of the global model on the whole test set.

Evaluation deliberately runs outside TFF, on one Keras model whose weights
are overwritten each round: the test set is never split across clients
(DaFKD's reference code split it, which changes the metric) and never
serialised into a federated computation.
"""

from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class EvalResult(NamedTuple):
  loss: float
  accuracy: float


class Evaluator:
  """Accuracy and cross-entropy of given `ModelWeights` on fixed data."""

  def __init__(self, model: tf.keras.Model, x: np.ndarray, y: np.ndarray,
               *, batch_size: int = 1000):
    self._model = model
    self._num = len(y)
    self._data = (tf.data.Dataset.from_tensor_slices((x, y.astype(np.int32)))
                  .batch(batch_size).cache())
    self._eval = tf.function(self._sums)

  def _sums(self, dataset: tf.data.Dataset) -> tuple[tf.Tensor, tf.Tensor]:
    loss_sum = tf.constant(0.0)
    correct = tf.constant(0.0)
    for x, y in iter(dataset):  # See local_training.train_locally.
      logits = self._model(x, training=False)
      loss_sum += tf.reduce_sum(
          tf.keras.losses.sparse_categorical_crossentropy(
              y, logits, from_logits=True))
      correct += tf.reduce_sum(tf.cast(
          tf.equal(tf.argmax(logits, -1, output_type=tf.int32), y),
          tf.float32))
    return loss_sum, correct

  def trace(self) -> None:
    """Traces (and runs once, with the model's current weights) the
    evaluation function, so that the first call costs what later ones do."""
    self._eval(self._data)

  def __call__(self, weights: tff.learning.models.ModelWeights) -> EvalResult:
    weights.assign_weights_to(self._model)
    loss_sum, correct = self._eval(self._data)
    return EvalResult(float(loss_sum) / self._num,
                      float(correct) / self._num)
