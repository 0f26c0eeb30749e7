"""Pure-TF maths of FedDF's server-side model fusion.

FedDF: Lin, Kong, Stich, Jaggi, "Ensemble Distillation for Robust Model
Fusion in Federated Learning", NeurIPS 2020 (Algorithm 1; Algorithm 3 for
heterogeneous model prototypes). After local training the server

1. averages, per architecture prototype P, the example-weighted models of
   this round's clients of that prototype: x_{t,0}^P (Algorithm 3 line 7);
2. evaluates every received client model (of every prototype) on an
   unlabeled proxy pool and averages their logits, AVGLOGITS:
   target = softmax(mean_k f(x_k, d)) (uniform weights, T = 1);
3. optionally drops teachers whose accuracy on a small labeled server
   validation set is at or below random guessing ("drop-worst", Sec. 4);
4. distills that target into each prototype's student, starting from its
   average, with `tff_kd.core.distillation.distill` (Adam, clipping, cosine
   decay, early stopping: FedDF's reference settings are DistillConfig
   options).

How the client models reach the server: they are stacked. Each client's
value is written into row `count` of a fixed-size [M, ...] accumulator (M =
clients per round); `stack_accumulate` / `stack_merge` are the accumulate
and merge functions of a `tff.federated_aggregate` (see
`tff_kd.federated.feddf`), and plain functions here, so the same maths runs
eagerly in tests. Rows past `count` stay zero and are masked out.

Everything in this module is plain TensorFlow: `fuse` runs eagerly and
inside the server's `tff.tensorflow.computation`.
"""

from typing import NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.core import distillation
from tff_kd.core import local_training

ModelWeights = tff.learning.models.ModelWeights

# Per-prototype weights at or below this are treated as "no client".
_EPS = 1e-12


# ---------------------------------------------------------------------------
# The stack: a fixed-size collection of this round's client values.


class Stack(NamedTuple):
  """This round's client values, one row each.

  Attributes:
    values: A structure whose leaves are [M, ...]: row k is the k-th client
      received (in arrival order); rows >= `count` are zero.
    weights: [M] float32 client weights (number of examples).
    count: int32 number of rows filled.
  """

  values: object
  weights: tf.Tensor
  count: tf.Tensor


def empty_stack(value_specs, num_slots: int) -> Stack:
  """A zero `Stack` with `num_slots` rows for values shaped like the specs."""
  if not isinstance(num_slots, (int, np.integer)) or num_slots < 1:
    raise errors.ConfigError(
        f'the teacher stack needs >= 1 slot, got {num_slots!r}')
  values = tf.nest.map_structure(
      lambda s: tf.zeros([num_slots, *s.shape], s.dtype), value_specs)
  return Stack(values, tf.zeros([num_slots], tf.float32),
               tf.constant(0, tf.int32))


def _num_slots(stack: Stack) -> int:
  return int(stack.weights.shape[0])


def stack_accumulate(stack: Stack, value, weight) -> Stack:
  """Writes one client's value and weight into row `stack.count`.

  A client of weight <= 0 is left out: no examples, or excluded for a
  non-finite update (`tff_kd.federated.learning.screen_client`), so it is
  no teacher.

  Raises `tf.errors.InvalidArgumentError` (at run time) if the stack is full,
  i.e. more clients took part than the process was built for.
  """
  slots = _num_slots(stack)
  weight = tf.cast(weight, tf.float32)
  take = weight > 0
  check = tf.debugging.Assert(
      tf.logical_or(tf.logical_not(take), stack.count < slots),
      [f'more clients than the {slots} teacher slots this stacking '
       'process was built for (clients_per_round)'])
  with tf.control_dependencies([check]):
    row = tf.reshape(tf.minimum(stack.count, slots - 1), [1, 1])

  def write(s, v):
    written = tf.tensor_scatter_nd_update(s, row,
                                          tf.cast(v, s.dtype)[tf.newaxis])
    return tf.where(take, written, s)

  values = tf.nest.map_structure(write, stack.values, value)
  weights = write(stack.weights, tf.reshape(weight, []))
  return Stack(values, weights, stack.count + tf.cast(take, stack.count.dtype))


def stack_merge(first: Stack, second: Stack) -> Stack:
  """Concatenates the filled rows of two partial stacks (first, then second).

  Raises `tf.errors.InvalidArgumentError` if together they overflow.
  """
  slots = _num_slots(first)
  check = tf.debugging.assert_less_equal(
      first.count + second.count, slots,
      message=f'more clients than the {slots} teacher slots this FedDF '
      'process was built for (clients_per_round)')
  with tf.control_dependencies([check]):
    keep_first = tf.range(slots) < first.count

  def merge(a, b):
    # Rolling `b` by first.count moves its filled rows behind a's; its zero
    # tail wraps around onto rows that `a` keeps.
    shifted = tf.roll(b, first.count, axis=0)
    mask = tf.reshape(keep_first, [slots] + [1] * (a.shape.rank - 1))
    return tf.where(mask, a, shifted)

  return Stack(tf.nest.map_structure(merge, first.values, second.values),
               merge(first.weights, second.weights),
               first.count + second.count)


# ---------------------------------------------------------------------------
# Averaging within a prototype.


def prototype_alpha(weights: tf.Tensor, valid: tf.Tensor) -> tf.Tensor:
  """Averaging coefficients of the clients of one prototype.

  Args:
    weights: [M] client weights (example counts).
    valid: [M] bool, rows that hold a client of this prototype.

  Returns:
    [M] coefficients summing to 1 over the valid rows (n_k / sum n_k; uniform
    when all valid weights are 0), or all zeros when no row is valid.
  """
  valid_f = tf.cast(valid, tf.float32)
  any_valid = tf.reduce_any(valid)
  # normalize_weights' uniform fallback would divide 0 by 0 with no valid
  # row; give it an all-ones mask then and zero the result instead.
  mask = tf.where(any_valid, valid_f, tf.ones_like(valid_f))
  alpha = distillation.normalize_weights(
      tf.maximum(tf.cast(weights, tf.float32), 0.0)[:, tf.newaxis],
      _EPS, mask=mask)[:, 0]
  return alpha * tf.cast(any_valid, tf.float32)


def average_update(deltas: ModelWeights, alpha: tf.Tensor,
                   fallback_non_trainable: Sequence[tf.Tensor]
                   ) -> ModelWeights:
  """sum_k alpha_k delta_k of stacked deltas; zero delta when alpha is 0.

  Args:
    deltas: Stacked client results: trainable leaves [M, ...] are deltas,
      non-trainable leaves [M, ...] the clients' final values.
    alpha: [M] coefficients from `prototype_alpha`.
    fallback_non_trainable: Non-trainable values to keep when no client of
      the prototype took part (alpha all zero).

  Returns:
    `ModelWeights` of the mean trainable delta and the mean non-trainable
    values (FedAvg's finalizer in `tff_kd.federated.learning`).
  """
  alpha = tf.convert_to_tensor(alpha, tf.float32)
  any_client = tf.reduce_sum(alpha) > 0

  def mean(stacked):
    stacked = tf.convert_to_tensor(stacked)
    a = tf.reshape(alpha, [-1] + [1] * (stacked.shape.rank - 1))
    return tf.reduce_sum(a * stacked, axis=0)

  trainable = [mean(d) for d in deltas.trainable]
  non_trainable = [
      tf.where(any_client, mean(d), f)
      for d, f in zip(deltas.non_trainable, fallback_non_trainable)
  ]
  return ModelWeights(trainable, non_trainable)


# ---------------------------------------------------------------------------
# Teachers and the AVGLOGITS target.


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
  outputs = tf.TensorArray(tf.float32, size=num_slots,
                           element_shape=tf.TensorShape([None, num_classes]))
  bases = (global_weights.trainable if global_weights is not None else
           [None] * len(variables.trainable))
  for k in tf.range(num_slots):
    if valid[k]:
      for v, g, d in zip(variables.trainable, bases, deltas.trainable):
        v.assign(d[k] if g is None else g + d[k])
      for v, d in zip(variables.non_trainable, deltas.non_trainable):
        v.assign(d[k])
      logits = distillation.teacher_logits([model], x, batch_size)[0]
    else:
      logits = tf.zeros([tf.shape(x)[0], num_classes])
    outputs = outputs.write(k, logits)
  return outputs.stack()


class TeacherSelection(NamedTuple):
  """Which teachers enter the ensemble.

  Attributes:
    kept: [K] bool, teachers with weight.
    val_accuracy: [K] validation accuracy of each teacher (0 for rows that
      hold no client, and when there is no validation set).
  """

  kept: tf.Tensor
  val_accuracy: tf.Tensor


def select_teachers(valid: tf.Tensor, val_logits: tf.Tensor | None,
                    val_labels: tf.Tensor | None, *,
                    drop_worst: bool) -> TeacherSelection:
  """Valid teachers, minus FedDF's drop-worst ones if enabled.

  `distillation.drop_worst` judges every row; rows that hold no client are
  then removed, and if no valid teacher survives all valid ones are kept
  (as drop-worst itself does when every teacher would be dropped).

  Args:
    valid: [K] bool, rows that hold a client model.
    val_logits: [K, V, C] teacher logits on the labeled validation set, or
      None (then drop_worst must be False).
    val_labels: [V] labels, or None.
    drop_worst: Whether to drop teachers at or below 1/C accuracy.
  """
  valid = tf.convert_to_tensor(valid, tf.bool)
  if val_logits is None:
    if drop_worst:
      raise errors.ConfigError(
          'drop-worst needs a labeled server validation set '
          '(server_data.val_size > 0)')
    return TeacherSelection(valid, tf.zeros(tf.shape(valid), tf.float32))
  valid_f = tf.cast(valid, tf.float32)
  dropped = distillation.drop_worst(val_logits, val_labels,
                                    tf.ones_like(valid_f)[:, tf.newaxis])
  accuracies = dropped.accuracies * valid_f
  if not drop_worst:
    return TeacherSelection(valid, accuracies)
  kept = tf.logical_and(dropped.kept, valid)
  kept = tf.where(tf.reduce_any(kept), kept, valid)
  return TeacherSelection(kept, accuracies)


def avg_logits_target(teacher_logits: tf.Tensor, kept: tf.Tensor, *,
                      temperature: float = 1.0) -> tf.Tensor:
  """FedDF's AVGLOGITS target softmax(mean over kept teachers of logits / T).

  Args:
    teacher_logits: [K, N, C].
    kept: [K] bool; at least one should be True (all False gives the uniform
      fallback of `normalize_weights` over all K).
    temperature: T > 0 (FedDF: 1).

  Returns:
    [N, C] target probabilities.

  Raises:
    ValueError: the teacher count of the logits and of `kept` differ.
  """
  teacher_logits = tf.convert_to_tensor(teacher_logits, tf.float32)
  kept = tf.convert_to_tensor(kept)
  if (teacher_logits.shape.rank == 3 and kept.shape.rank == 1 and
      not teacher_logits.shape[:1].is_compatible_with(kept.shape)):
    raise errors.ConfigError(
        f'teacher count mismatch: {teacher_logits.shape[0]} teachers\' '
        f'logits but {kept.shape[0]} teacher weights')
  n = tf.shape(teacher_logits)[1]
  raw = tf.ones([tf.shape(kept)[0], n])
  alpha = distillation.normalize_weights(raw, mask=tf.cast(kept, tf.float32))
  return distillation.weighted_ensemble(
      teacher_logits, alpha, temperature=temperature, ensemble='logits')


def accuracy(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
  """Fraction of argmax predictions equal to the labels (0 if empty)."""
  labels = tf.cast(tf.reshape(labels, [-1]), tf.int64)
  correct = tf.reduce_sum(tf.cast(
      tf.equal(tf.argmax(logits, axis=-1), labels), tf.float32))
  return correct / tf.maximum(tf.cast(tf.shape(labels)[0], tf.float32), 1.0)


# ---------------------------------------------------------------------------
# One round of fusion.


class Prototype(NamedTuple):
  """One architecture prototype's inputs to `fuse`.

  Attributes:
    student: Built Keras model, the prototype's student (overwritten).
    teacher: Built Keras model of the same architecture, reused for all
      teacher rows (overwritten).
    global_weights: The prototype's global `ModelWeights` of this round.
    deltas: Stacked client results of this prototype (`average_update`).
    valid: [M] bool, rows holding a client of this prototype.
    start_weights: The student's starting point x_{t,0}^P: the average, or
      the previous global model when no client of P took part.
  """

  student: tf.keras.Model
  teacher: tf.keras.Model
  global_weights: ModelWeights
  deltas: ModelWeights
  valid: tf.Tensor
  start_weights: ModelWeights


class FusionResult(NamedTuple):
  """What one round of `fuse` produces.

  Attributes:
    weights: Per prototype, the distilled `ModelWeights`.
    distill: Per prototype, the `DistillResult`.
    num_teachers: Client models received (all prototypes), int32.
    teachers_kept: Teachers in the ensemble after drop-worst, int32.
    teacher_val_accuracy: Mean validation accuracy of the received teachers.
    ensemble_val_accuracy: Validation accuracy of the AVGLOGITS ensemble.
    student_val_accuracy_before: Per prototype, of the starting student.
    student_val_accuracy_after: Per prototype, of the distilled student.
    teacher_seconds: Wall time of the teachers' forward passes.
    distill_seconds: Wall time of all students' distillation loops.
  """

  weights: tuple
  distill: tuple
  num_teachers: tf.Tensor
  teachers_kept: tf.Tensor
  teacher_val_accuracy: tf.Tensor
  ensemble_val_accuracy: tf.Tensor
  student_val_accuracy_before: tuple
  student_val_accuracy_after: tuple
  teacher_seconds: tf.Tensor
  distill_seconds: tf.Tensor


def check_pool_shape(pool_shape: Sequence[int], input_shape: Sequence[int],
                     what: str = 'proxy dataset') -> None:
  """Raises `errors.DataError` unless per-example shapes match."""
  if tuple(pool_shape) != tuple(input_shape):
    raise errors.DataError(
        f'{what} images have shape {tuple(pool_shape)} but the model expects '
        f'{tuple(input_shape)}; resize it to the training image shape')


@tf.function
def fuse(prototypes: Sequence[Prototype],
         optimizer: tff.learning.optimizers.Optimizer, pool: tf.Tensor,
         config: distillation.DistillConfig, *,
         val_x: tf.Tensor | None = None, val_y: tf.Tensor | None = None,
         drop_worst: bool = False, batch_size: int = 256) -> FusionResult:
  """FedDF's server fusion for one round (Algorithms 1 and 3, lines 6-10).

  Every prototype's client models are teachers of every prototype's
  student; the target is AVGLOGITS over the kept teachers; each student
  starts from `start_weights` and is distilled with the shared
  `distillation.distill`. A `tf.function`, so assignments to the Keras
  variables run in program order also inside a TFF computation's graph.

  Args:
    prototypes: One `Prototype` per architecture.
    optimizer: Distillation optimiser (FedDF: Adam 1e-3), fresh state per
      round and per student.
    pool: Unlabeled proxy pool [N, ...].
    config: A `DistillConfig` (validated by the caller).
    val_x: Optional labeled server validation images [V, ...].
    val_y: Their labels [V].
    drop_worst: Drop teachers at or below random-guess accuracy on the
      validation set.
    batch_size: Forward-pass batch size of the teachers.

  Returns:
    A `FusionResult`.
  """
  t_start = tf.timestamp()
  has_val = val_x is not None
  num_pool = tf.shape(pool)[0]
  inputs = tf.concat([pool, val_x], 0) if has_val else pool
  logits = tf.concat([
      stacked_logits(p.teacher, p.global_weights, p.deltas, p.valid, inputs,
                     batch_size) for p in prototypes
  ], 0)
  valid = tf.concat([p.valid for p in prototypes], 0)
  pool_logits = logits[:, :num_pool]
  val_logits = logits[:, num_pool:] if has_val else None
  selection = select_teachers(valid, val_logits, val_y,
                              drop_worst=drop_worst)
  target = tf.stop_gradient(avg_logits_target(
      pool_logits, selection.kept, temperature=config.temperature))
  t_teachers = tf.timestamp()

  if has_val:
    # argmax of the AVGLOGITS probabilities = argmax of the mean logits.
    ensemble_acc = accuracy(avg_logits_target(val_logits, selection.kept),
                            val_y)
  else:
    ensemble_acc = tf.constant(-1.0)
  num_teachers = tf.reduce_sum(tf.cast(valid, tf.int32))
  teacher_acc = tf.reduce_sum(selection.val_accuracy) / tf.maximum(
      tf.cast(num_teachers, tf.float32), 1.0)

  def student_accuracy(student):
    if not has_val:
      return tf.constant(-1.0)
    return accuracy(distillation.teacher_logits([student], val_x,
                                                batch_size)[0], val_y)

  weights, results, before, after = [], [], [], []
  t_distill = tf.constant(0.0, tf.float64)
  for p in prototypes:
    tf.nest.map_structure(lambda v, w: v.assign(w),
                          local_training.model_weights(p.student),
                          p.start_weights)
    before.append(student_accuracy(p.student))
    t0 = tf.timestamp()
    result = distillation.distill(
        p.student, optimizer, pool, target, config,
        labeled=(val_x, val_y) if has_val else None)
    with tf.control_dependencies(tf.nest.flatten(result.weights)):
      t_distill += tf.timestamp() - t0
    after.append(student_accuracy(p.student))
    weights.append(result.weights)
    results.append(result._replace(optimizer_state=()))
  return FusionResult(
      weights=tuple(weights), distill=tuple(results),
      num_teachers=num_teachers,
      teachers_kept=tf.reduce_sum(tf.cast(selection.kept, tf.int32)),
      teacher_val_accuracy=teacher_acc,
      ensemble_val_accuracy=ensemble_acc,
      student_val_accuracy_before=tuple(before),
      student_val_accuracy_after=tuple(after),
      teacher_seconds=tf.cast(t_teachers - t_start, tf.float32),
      distill_seconds=tf.cast(t_distill, tf.float32))

