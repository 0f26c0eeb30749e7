"""Pure-TF local training shared by every method's client update.

One client round is: copy the broadcast global weights into a Keras model,
run local optimisation over the client's (already shuffled, batched and
step/epoch-limited) dataset, and return the model delta plus statistics.

The optional proximal term is FedProx's (Li et al., MLSys 2020, eq. 2):

    h_k(w; w^t) = F_k(w) + mu/2 * ||w - w^t||^2,

so `proximal_strength=0` is FedAvg's local SGD (McMahan et al., AISTATS 2017).

`structure_of` builds a model once per build function for reading its
shapes and variables (process builders ask for them several times).

Nothing here depends on a TFF placement; `tff_kd.federated` wraps it.
"""

from typing import Callable, NamedTuple, Optional, TypeVar
import weakref

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import loops


# (batch, logits of the model on batch['x'], step index) -> scalar extra loss.
Regularizer = Callable[[dict, tf.Tensor, tf.Tensor], tf.Tensor]
_T = TypeVar('_T')


class LocalResult(NamedTuple):
  """What one client's local training produces.

  Attributes:
    weights_delta: `ModelWeights` whose `trainable` part is
      `local - global` and whose `non_trainable` part holds the client's final
      non-trainable values (BatchNorm statistics), so the server can average
      them instead of leaving them at their initial values.
    num_examples: Examples seen (counting repeats across epochs), float32.
    loss_sum: Sum over examples of the task loss (without the proximal term).
    num_steps: Optimiser steps taken, int32.
  """

  weights_delta: tff.learning.models.ModelWeights
  num_examples: tf.Tensor
  loss_sum: tf.Tensor
  num_steps: tf.Tensor


def model_weights(model: tf.keras.Model) -> tff.learning.models.ModelWeights:
  """The `ModelWeights` (variables, in Keras order) of a Keras model."""
  return tff.learning.models.ModelWeights(
      trainable=list(model.trainable_weights),
      non_trainable=list(model.non_trainable_weights))


# What `structure_of` built, per build function (freed with the function).
_STRUCTURES: 'weakref.WeakKeyDictionary[Callable, object]' = (
    weakref.WeakKeyDictionary())


def structure_of(build_fn: Callable[[], _T]) -> _T:
  """`build_fn()`, built once per `build_fn` in a graph of its own.

  For reading shapes, variable structure and layer layout, never for
  running or training: a process builder asks for the same model's
  structure several times (FedGen: its classifier three times, its
  generator twice), and each Keras build costs 0.06-0.15 s of start-up on
  this kind of machine. The graph keeps variables out of the caller's
  context. Callables that cannot be weakly referenced (bound methods) are
  built on every call.
  """
  try:
    return _STRUCTURES[build_fn]
  except (KeyError, TypeError):
    pass
  with tf.Graph().as_default():
    built = build_fn()
  try:
    _STRUCTURES[build_fn] = built
  except TypeError:
    pass
  return built


def squared_distance(current: list[tf.Variable],
                     reference: list[tf.Tensor]) -> tf.Tensor:
  """Sum of squared L2 distances between two lists of tensors."""
  return tf.add_n([
      tf.reduce_sum(tf.square(c - tf.stop_gradient(r)))
      for c, r in zip(current, reference)
  ])


@tf.function(autograph=False)
def train_locally(model: tf.keras.Model,
                  optimizer: tff.learning.optimizers.Optimizer,
                  initial_weights: tff.learning.models.ModelWeights,
                  dataset: tf.data.Dataset,
                  learning_rate: tf.Tensor,
                  *,
                  proximal_strength: float = 0.0,
                  regularizer: Optional[Regularizer] = None) -> LocalResult:
  """Runs local (proximal) SGD-family training on one client.

  A `tf.function`, traced without AutoGraph (`loops.fold_batches` builds
  its loop over `dataset`). Build `model` and `optimizer` outside it.

  Args:
    model: Keras classifier producing logits; its variables are overwritten.
    optimizer: A `tff.learning.optimizers` optimizer; its state is created
      fresh each round, so per-client optimiser state never leaks across
      rounds or clients.
    initial_weights: The broadcast global weights.
    dataset: Batches of `{'x': images, 'y': int labels}`.
    learning_rate: This round's client learning rate (scalar float32).
    proximal_strength: FedProx mu; 0 disables the proximal term.
    regularizer: Optional extra term added to each step's mean batch loss
      (e.g. FedGen's generated-feature regulariser), called inside the
      gradient tape as `regularizer(batch, logits, step)` with the model's
      training-mode logits on the batch and the 0-based step index. Not
      counted in `loss_sum`.

  Returns:
    A `LocalResult`.
  """
  tf.nest.map_structure(lambda v, t: v.assign(t), model_weights(model),
                        initial_weights)
  trainable = model.trainable_weights
  global_trainable = [tf.identity(v) for v in trainable]
  specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
  opt_state = optimizer.initialize(specs)
  hparams = optimizer.get_hparams(opt_state)
  hparams['learning_rate'] = tf.cast(learning_rate, tf.float32)
  opt_state = optimizer.set_hparams(opt_state, hparams)
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
      from_logits=True, reduction=tf.keras.losses.Reduction.SUM)

  def step(state, batch):
    opt_state, num_examples, loss_sum, num_steps = state
    batch_size = tf.cast(tf.shape(batch['y'])[0], tf.float32)
    with tf.GradientTape() as tape:
      logits = model(batch['x'], training=True)
      task_loss = loss_fn(batch['y'], logits)
      loss = task_loss / batch_size
      if proximal_strength > 0:
        loss += 0.5 * proximal_strength * squared_distance(
            trainable, global_trainable)
      if regularizer is not None:
        loss += regularizer(batch, logits, num_steps)
    grads = tape.gradient(loss, trainable)
    opt_state, updated = optimizer.next(opt_state, tuple(trainable),
                                        tuple(grads))
    for variable, value in zip(trainable, updated):
      variable.assign(value)
    return (opt_state, num_examples + batch_size, loss_sum + task_loss,
            num_steps + 1)

  _, num_examples, loss_sum, num_steps = loops.fold_batches(
      dataset, step,
      (opt_state, tf.constant(0.0), tf.constant(0.0), tf.constant(0)))
  delta = tff.learning.models.ModelWeights(
      trainable=[v - g for v, g in zip(trainable, global_trainable)],
      non_trainable=[tf.identity(v) for v in model.non_trainable_weights])
  return LocalResult(delta, num_examples, loss_sum, num_steps)

