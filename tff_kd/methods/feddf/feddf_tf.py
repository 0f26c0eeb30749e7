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

The client models reach the server stacked (`tff_kd.core.stacking`); the
teachers are evaluated with `tff_kd.core.teachers`.

Everything in this module is plain TensorFlow: `fuse` runs eagerly and
inside the server's `tff.tensorflow.computation`.
"""

from typing import NamedTuple, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.core import diagnostics as core_diagnostics
from tff_kd.core import distill_hparams
from tff_kd.core import distillation
from tff_kd.core import links
from tff_kd.core import local_training
from tff_kd.core import teachers as teachers_tf

ModelWeights = tff.learning.models.ModelWeights

# ---------------------------------------------------------------------------
# Teachers and the AVGLOGITS target.


class TeacherSelection(NamedTuple):
  """Which teachers enter the ensemble.

  Attributes:
    kept: [K] bool, teachers with weight.
    val_accuracy: [K] validation accuracy of each teacher (0 for rows that
      hold no client, and when there is no validation set).
  """

  kept: tf.Tensor
  val_accuracy: tf.Tensor


@tf.autograph.experimental.do_not_convert
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


@tf.autograph.experimental.do_not_convert
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


# ---------------------------------------------------------------------------
# One round of fusion.


class Prototype(NamedTuple):
  """One architecture prototype's inputs to `fuse`.

  Attributes:
    student: Built Keras model, the prototype's student (overwritten).
    teacher: Built Keras model of the same architecture, reused for all
      teacher rows (overwritten).
    global_weights: The prototype's global `ModelWeights` of this round.
    deltas: Stacked client results of this prototype
      (`tff_kd.core.stacking.average_update`).
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
    links: Per prototype, the round's link table on the labeled images
      (`tff_kd.core.links.NAMES`; the teacher and ensemble links are the
      same for every prototype, the student's are its own).
    teacher_seconds: Wall time of the teachers' forward passes.
    distill_seconds: Wall time of all students' distillation loops.
  """

  weights: tuple
  distill: tuple
  num_teachers: tf.Tensor
  teachers_kept: tf.Tensor
  links: tuple
  teacher_seconds: tf.Tensor
  distill_seconds: tf.Tensor


@tf.autograph.experimental.do_not_convert
def _all_teachers(prototypes: Sequence[Prototype], x: tf.Tensor,
                  batch_size: int) -> tf.Tensor:
  """[K, N, C] logits of every prototype's stacked teachers on `x`."""
  return tf.concat([
      teachers_tf.stacked_logits(p.teacher, p.global_weights, p.deltas,
                                 p.valid, x, batch_size)
      for p in prototypes
  ], 0)


@tf.function(autograph=False)
def fuse(prototypes: Sequence[Prototype],
         optimizer: tff.learning.optimizers.Optimizer, pool: tf.Tensor,
         config: distill_hparams.DistillConfig, *,
         val_x: tf.Tensor | None = None, val_y: tf.Tensor | None = None,
         drop_worst: bool = False, batch_size: int = 256) -> FusionResult:
  """FedDF's server fusion for one round (Algorithms 1 and 3, lines 6-10).

  Every prototype's client models are teachers of every prototype's
  student; the target is AVGLOGITS over the kept teachers; each student
  starts from `start_weights` and is distilled with the shared
  `distillation.distill`. A `tf.function`, so assignments to the Keras
  variables run in program order also inside a TFF computation's graph.
  After each student's result is fixed, the link hook
  (`tff_kd.core.links.LinkHook`) measures the round on the labeled images.

  Args:
    prototypes: One `Prototype` per architecture.
    optimizer: Distillation optimiser (FedDF: Adam 1e-3), fresh state per
      round and per student.
    pool: Unlabeled proxy pool [N, ...].
    config: A `DistillConfig` (validated by the caller).
    val_x: Optional labeled server validation images [V, ...] (drop-worst,
      the distillation's early stopping and the link table).
    val_y: Their labels [V].
    drop_worst: Drop teachers at or below random-guess accuracy on the
      validation set.
    batch_size: Forward-pass batch size of the teachers.

  Returns:
    A `FusionResult`.
  """
  t_start = tf.timestamp()
  has_val = val_x is not None
  with tf.control_dependencies([t_start]):
    pool = tf.identity(pool)
  num_pool = tf.shape(pool)[0]
  # Drop-worst judges the teachers on the labeled images: one pass scores
  # both.
  inputs = tf.concat([pool, val_x], 0) if drop_worst else pool
  logits = _all_teachers(prototypes, inputs, batch_size)
  valid = tf.concat([p.valid for p in prototypes], 0)
  pool_logits = logits[:, :num_pool]
  val_logits = logits[:, num_pool:] if drop_worst else None
  selection = select_teachers(valid, val_logits, val_y,
                              drop_worst=drop_worst)
  target = tf.stop_gradient(avg_logits_target(
      pool_logits, selection.kept, temperature=config.temperature))
  with tf.control_dependencies([target]):
    t_teachers = tf.timestamp()
  num_teachers = tf.reduce_sum(tf.cast(valid, tf.int32))

  weights, results, rounds = [], [], []
  t_distill = tf.constant(0.0, tf.float64)
  for p in prototypes:
    variables = local_training.model_weights(p.student)
    assigned = tf.nest.map_structure(lambda v, w: v.assign(w), variables,
                                     p.start_weights)
    # Timed from after the set-up; the loop starts after the stamp.
    t0, distill_pool = distillation.timed_pool(tf.nest.flatten(assigned),
                                               pool)
    result = distillation.distill(
        p.student, optimizer, distill_pool, target, config,
        labeled=(val_x, val_y) if has_val else None)
    with tf.control_dependencies(tf.nest.flatten(result.weights)):
      t_distill += tf.timestamp() - t0
    weights.append(result.weights)
    results.append(result._replace(optimizer_state=()))
    rounds.append((p, variables, result.weights))

  teachers = links.Teachers(
      logits_fn=lambda x: _all_teachers(prototypes, x, batch_size),
      valid=valid,
      ensemble_fn=lambda z, _, __: avg_logits_target(z, selection.kept))
  # The results are fixed above (`distill` returns copies); the hook may
  # overwrite the students and teachers.
  with tf.control_dependencies(tf.nest.flatten(weights)):
    table = tuple(
        core_diagnostics.run(links.LinkHook(batch_size),
                             core_diagnostics.ServerRound(
                                 teachers=teachers, weights=None, pool=pool,
                                 target=target, student=p.student,
                                 student_variables=variables,
                                 before=p.start_weights, after=after,
                                 labeled=(val_x, val_y) if has_val else None))
        for p, variables, after in rounds)
  return FusionResult(
      weights=tuple(weights), distill=tuple(results),
      num_teachers=num_teachers,
      teachers_kept=tf.reduce_sum(tf.cast(selection.kept, tf.int32)),
      links=table,
      teacher_seconds=tf.cast(t_teachers - t_start, tf.float32),
      distill_seconds=tf.cast(t_distill, tf.float32))
