"""Centralised evaluation of the global model on the whole test set.

Evaluation deliberately runs outside TFF, on one Keras model whose weights
are overwritten each round: the test set is never split across clients
(DaFKD's reference code split it, which changes the metric) and never
serialised into a federated computation.
"""

import functools
from typing import Callable, NamedTuple
import weakref

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import loops


class EvalResult(NamedTuple):
  loss: float
  accuracy: float


# One evaluation `tf.function` per model, freed with the model: evaluators
# that share a model (and batch structure) share its trace.
_EVAL_FNS: 'weakref.WeakKeyDictionary[tf.keras.Model, Callable]' = (
    weakref.WeakKeyDictionary())


def _eval_fn(model: tf.keras.Model) -> Callable:
  if model not in _EVAL_FNS:
    _EVAL_FNS[model] = tf.function(functools.partial(_sums, model),
                                   autograph=False)
  return _EVAL_FNS[model]


def _sums(model: tf.keras.Model,
          dataset: tf.data.Dataset) -> tuple[tf.Tensor, tf.Tensor]:
  """Summed cross-entropy and correct predictions of `model` on `dataset`."""

  def step(sums, batch):
    x, y = batch
    logits = model(x, training=False)
    loss = tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(
        y, logits, from_logits=True))
    correct = tf.reduce_sum(tf.cast(
        tf.equal(tf.argmax(logits, -1, output_type=tf.int32), y),
        tf.float32))
    return sums[0] + loss, sums[1] + correct

  return loops.fold_batches(dataset, step,
                            (tf.constant(0.0), tf.constant(0.0)))


class Evaluator:
  """Accuracy and cross-entropy of given `ModelWeights` on fixed data.

  Evaluators may share one Keras model (the weights are assigned on every
  call): they then share one trace of the evaluation function.
  """

  def __init__(self, model: tf.keras.Model, x: np.ndarray, y: np.ndarray,
               *, batch_size: int = 1000):
    self._model = model
    self._num = len(y)
    self._data = (tf.data.Dataset.from_tensor_slices((x, y.astype(np.int32)))
                  .batch(batch_size).cache())

  def trace(self) -> None:
    """Traces (and runs once, with the model's current weights) the
    evaluation function, so that the first call costs what later ones do."""
    _eval_fn(self._model)(self._data)

  def __call__(self, weights: tff.learning.models.ModelWeights) -> EvalResult:
    weights.assign_weights_to(self._model)
    loss_sum, correct = _eval_fn(self._model)(self._data)
    return EvalResult(float(loss_sum) / self._num,
                      float(correct) / self._num)
