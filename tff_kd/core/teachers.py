"""Pure-TF teacher evaluation on a server pool, shared by the KD methods.

The stacked client models (`tff_kd.core.stacking.Stack`) are the teachers of
server-side distillation (FedDF, Lin et al., NeurIPS 2020, AVGLOGITS; FedD3A's
weighted ensemble). `stacked_logits` evaluates every stacked model on the
server's pool with one reused Keras model per architecture.
"""

from typing import Callable, Optional, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.core import distillation
from tff_kd.core import local_training
from tff_kd.core import loops

ModelWeights = tff.learning.models.ModelWeights


def load_row(variables: ModelWeights,
             global_weights: Optional[ModelWeights], deltas: ModelWeights,
             k: tf.Tensor) -> None:
  """Loads stacked row k into a model's variables (graph code).

  Trainable values are `global + delta_k` (or `delta_k` itself, a whole
  model, with `global_weights=None`); non-trainable values are the row's
  own (a client's BatchNorm statistics).

  Args:
    variables: The model's `ModelWeights` of variables.
    global_weights: The broadcast `ModelWeights`, or None.
    deltas: Stacked [M, ...] rows, as in `stacked_logits`.
    k: The row.
  """
  bases = (global_weights.trainable if global_weights is not None else
           [None] * len(variables.trainable))
  for v, g, d in zip(variables.trainable, bases, deltas.trainable):
    v.assign(d[k] if g is None else g + d[k])
  for v, d in zip(variables.non_trainable, deltas.non_trainable):
    v.assign(d[k])


@tf.autograph.experimental.do_not_convert
def stacked_logits(model: tf.keras.Model,
                   global_weights: Optional[ModelWeights],
                   deltas: ModelWeights, valid: tf.Tensor, x: tf.Tensor,
                   batch_size: int = 256) -> tf.Tensor:
  """Logits [M, N, C] of each stacked client model (zeros for invalid rows).

  Row k's model is `global + delta_k` (trainable) with the client's own
  non-trainable values; with `global_weights=None` the rows are whole
  models (FedD3A's heterogeneous clients upload their weights). One Keras
  model is reused for all rows, so the server builds one model per
  prototype, not one per client. Call inside a `tf.function` (as `fuse`
  does) so that the weight assignments are ordered.

  Args:
    model: A built Keras model of the rows' architecture (overwritten).
    global_weights: This prototype's global `ModelWeights` (broadcast), or
      None when `deltas` holds whole weights.
    deltas: Stacked client results, as in `average_update`.
    valid: [M] bool, rows to evaluate.
    x: Inputs [N, ...].
    batch_size: Examples per forward pass.
  """
  variables = local_training.model_weights(model)
  num_slots = int(valid.shape[0])
  num_classes = int(model.output_shape[-1])

  def row_logits(k):
    load_row(variables, global_weights, deltas, k)
    return distillation.teacher_logits([model], x, batch_size)[0]

  def write_row(outputs, k):
    logits = tf.cond(valid[k], lambda: row_logits(k),
                     lambda: tf.zeros([tf.shape(x)[0], num_classes]))
    return outputs.write(k, logits)

  outputs = loops.fold_range(
      num_slots, write_row,
      tf.TensorArray(tf.float32, size=num_slots,
                     element_shape=tf.TensorShape([None, num_classes])))
  return outputs.stack()


def accuracy(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
  """Fraction of argmax predictions equal to the labels (0 if empty)."""
  labels = tf.cast(tf.reshape(labels, [-1]), tf.int64)
  correct = tf.reduce_sum(tf.cast(
      tf.equal(tf.argmax(logits, axis=-1), labels), tf.float32))
  return correct / tf.maximum(tf.cast(tf.shape(labels)[0], tf.float32), 1.0)


def check_pool_shape(pool_shape: Sequence[int], input_shape: Sequence[int],
                     what: str = 'proxy dataset') -> None:
  """Raises `errors.DataError` unless per-example shapes match."""
  if tuple(pool_shape) != tuple(input_shape):
    raise errors.DataError(
        f'{what} images have shape {tuple(pool_shape)} but the model expects '
        f'{tuple(input_shape)}; resize it to the training image shape')


def check_models(model_fns: Sequence[Callable[[], tf.keras.Model]],
                 pool_shape: Sequence[int], *,
                 what: str = 'feddf prototypes') -> None:
  """Raises unless the models share input shape and classes with the pool.

  Heterogeneous teachers (FedDF's prototypes, FedD3A's client models) are
  distilled on one server pool, so they must read the same images and
  predict the same classes.

  Raises:
    ConfigError: models with different input shapes or class counts.
    DataError: pool images whose shape is not the models' input.
  """
  shapes, classes = [], []
  for fn in model_fns:
    model = local_training.structure_of(fn)
    shapes.append(tuple(model.input_shape[1:]))
    classes.append(model.output_shape[-1])
  if len(set(shapes)) > 1 or len(set(classes)) > 1:
    raise errors.ConfigError(
        f'{what} must share input shape and classes, got input '
        f'shapes {shapes} and {classes} classes')
  check_pool_shape(pool_shape, shapes[0])
