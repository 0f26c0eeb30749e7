"""Server-side weighted ensemble distillation shared by every KD method.

FedDF, DaFKD, FedD3A and FedFTG all end a round the same way: K teacher
models label a distillation pool (unlabeled real data or generated samples),
their predictions are combined per sample with weights alpha[k, i], and a
student (usually initialised from the averaged model) is trained to match the
combined target with a temperature-scaled KL loss. They differ only in where
the weights come from; this module owns everything else.

* Per-sample weights (DaFKD, Wang et al., CVPR 2023, eq. 7, with an epsilon
  guard the reference code lacks): `normalize_weights` turns non-negative
  scores (discriminator outputs, FedD3A's softmax scores, FedFTG's label
  shares) into alpha with sum_k alpha[k, i] = 1.
* The target (`weighted_ensemble`): either the weighted mean of tempered
  soft predictions, sum_k alpha[k, i] softmax(z_k(x_i) / T) (DaFKD eq. 8,
  FedD3A, Su et al., AAAI 2023, eq. 7), or the softmax of the weighted
  mean of logits, softmax(sum_k alpha[k, i] z_k(x_i) / T) (FedDF's AVGLOGITS,
  Lin et al., NeurIPS 2020, with uniform alpha; DaFKD's released code).
* FedDF's drop-worst (`drop_worst`): teachers at or below random-guess
  accuracy on a server validation set get weight 0.
* The loss (`kd_loss`): T^2 * mean_i KL(target_i || softmax(s(x_i) / T))
  (Hinton et al., 2015; FedD3A eq. 8; FedDF with T = 1).
* The loop (`distill`): seeded minibatches of the pool, one
  `tff.learning.optimizers` step per batch, optional global-norm clipping
  (FedDF clips at 5), optional cosine learning-rate decay (FedDF's code) and
  FedDF's early stopping on a held-out part of the pool, restoring the best
  student seen.

Data flow of one `distill` call: the pool `x` [N, ...] is split (seeded) into
a training part and, if `val_fraction > 0`, a validation part; the targets are
either a precomputed [N, C] tensor (gathered with the same indices) or a
callable evaluated per batch. The student's variables are updated in place
and also returned as `ModelWeights` values, so a TFF computation that builds
the student inside can return them.

Everything is pure TensorFlow with no TFF placement: `distill` runs eagerly
(notebooks, tests) and inside a `tff.tensorflow.computation` body; its loop
is a `tf.function` written with explicit graph loops and conditionals
(`tff_kd.core.loops`, `tf.cond`), traced without AutoGraph, and the public
functions are marked unconverted (a user's converted code may call them):
a KD method's process build converts no Python function (BUILD_NOTES.md,
"Start-up of the KD methods").
"""

import math
from typing import Any, Callable, NamedTuple, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import distill_hparams
from tff_kd.core import local_training
from tff_kd.core import loops

TargetFn = Callable[[tf.Tensor], tf.Tensor]
Targets = Union[tf.Tensor, np.ndarray, TargetFn]

# Second word of the stateless seeds: the validation split and each epoch's
# batch order draw from disjoint streams of the same `DistillConfig.seed`.
_SPLIT_STREAM = 0
_EPOCH_STREAM_OFFSET = 1

# Reported as `best_val_loss` when there is no validation split; a KL loss is
# never negative, and a finite sentinel keeps non-finite-metric guards quiet.
NO_VALIDATION = -1.0

_ENSEMBLES = ('probs', 'logits')
KL_REDUCTIONS = distill_hparams.KL_REDUCTIONS


class Distillation(NamedTuple):
  """The server's distillation: its optimiser and its settings.

  What a KD method's builder takes to distil into its student (FedDF,
  FedD3A, FedFTG's student steps); `distill` receives both.

  Attributes:
    optimizer: The student's `tff.learning.optimizers` optimizer.
    config: The distillation settings (`distill_hparams.DistillConfig`:
      steps, batch size, temperature, clipping, early stopping, ...).
  """

  optimizer: tff.learning.optimizers.Optimizer
  config: distill_hparams.DistillConfig


@tf.autograph.experimental.do_not_convert
def normalize_weights(raw: tf.Tensor,
                      eps: float = 1e-12,
                      *,
                      mask: tf.Tensor | None = None) -> tf.Tensor:
  """Per-sample teacher weights alpha[k, i] = raw[k, i] / sum_j raw[j, i].

  DaFKD's eq. 7 with a guard: a sample whose scores sum to at most `eps`
  (e.g. every discriminator says 0) gets uniform weights instead of 0/0.

  Args:
    raw: [K, N] non-negative, finite scores (teacher k, sample i). Negative
      entries raise `tf.errors.InvalidArgumentError`.
    eps: Column sums at or below this are treated as all zero.
    mask: Optional [K] 0/1 vector of teachers that may get weight; the others
      get exactly 0, and the uniform fallback is 1/(number kept) over the kept
      teachers. Must keep at least one teacher.

  Returns:
    [K, N] float32 weights, each column summing to 1; never NaN or inf.
  """
  raw = tf.convert_to_tensor(raw, tf.float32)
  if raw.shape.rank is not None and raw.shape.rank != 2:
    raise ValueError(f'raw weights must have shape [K, N], got {raw.shape}')
  check = tf.debugging.assert_non_negative(
      raw, message='teacher weight scores must be non-negative')
  with tf.control_dependencies([check]):
    raw = tf.identity(raw)
  if mask is None:
    keep = tf.ones_like(raw[:, :1])
  else:
    keep = tf.reshape(tf.cast(mask, tf.float32), [-1, 1])
    raw = raw * keep
  total = tf.reduce_sum(raw, axis=0, keepdims=True)
  uniform = keep / tf.reduce_sum(keep)
  degenerate = total <= eps
  # Dividing by 1 in degenerate columns keeps the unused branch finite.
  safe_total = tf.where(degenerate, tf.ones_like(total), total)
  return tf.where(degenerate, uniform + tf.zeros_like(raw), raw / safe_total)


@tf.autograph.experimental.do_not_convert
def _check_teacher_shapes(logits: tf.Tensor, weights: tf.Tensor) -> None:
  if logits.shape.rank is not None and logits.shape.rank != 3:
    raise ValueError(
        f'teacher logits must have shape [K, N, C], got {logits.shape}')
  if weights.shape.rank is not None and weights.shape.rank != 2:
    raise ValueError(f'weights must have shape [K, N], got {weights.shape}')
  if logits.shape.rank is None or weights.shape.rank is None:
    return
  if not logits.shape[:1].is_compatible_with(weights.shape[:1]):
    raise ValueError(
        f'teacher count of logits {logits.shape} ([K, N, C]) does not match '
        f'weights {weights.shape} ([K, N])')
  if not logits.shape[1:2].is_compatible_with(weights.shape[1:]):
    raise ValueError(
        f'pool size of logits {logits.shape} ([K, N, C]) does not match '
        f'weights {weights.shape} ([K, N])')


@tf.autograph.experimental.do_not_convert
def mean_entropy(probs: tf.Tensor, axis: int) -> tf.Tensor:
  """Mean entropy (nats) of the distributions along `axis`, 0 log 0 = 0.

  For [K, N] teacher weights (`axis=0`): 0 when every sample trusts one
  teacher, log K when the weights are uniform. For [N, C] distillation
  targets (`axis=-1`): 0 for one-hot targets, log C for uniform ones. A
  per-round diagnostic of DaFKD and FedD3A.

  Args:
    probs: Non-negative values summing to 1 along `axis`.
    axis: The axis each distribution lies along; the mean is over the rest.

  Returns:
    Scalar float32.
  """
  p = tf.convert_to_tensor(probs, tf.float32)
  logs = tf.math.log(tf.where(p > 0, p, tf.ones_like(p)))
  return tf.reduce_mean(-tf.reduce_sum(p * logs, axis=axis))


@tf.autograph.experimental.do_not_convert
def weighted_ensemble(teacher_logits: tf.Tensor,
                      weights: tf.Tensor,
                      *,
                      temperature: float = 1.0,
                      ensemble: str = 'probs') -> tf.Tensor:
  """Combines K teachers' predictions into per-sample target probabilities.

  The weights are used as given; pass them through `normalize_weights` (or use
  uniform 1/K) so that each column sums to 1.

  Args:
    teacher_logits: [K, N, C] logits of teacher k on sample i.
    weights: [K, N] weights alpha[k, i].
    temperature: Softmax temperature T (> 0). Use the same T in `kd_loss`.
    ensemble: 'probs' for sum_k alpha softmax(z_k / T) (DaFKD eq. 8, FedD3A
      eq. 7); 'logits' for softmax(sum_k alpha z_k / T) (FedDF AVGLOGITS with
      uniform alpha; DaFKD's released code).

  Returns:
    [N, C] float32 target probabilities.

  Raises:
    ValueError: Mismatched shapes, an unknown `ensemble` or T <= 0.
  """
  if ensemble not in _ENSEMBLES:
    raise ValueError(
        f'unknown ensemble {ensemble!r}; expected one of {_ENSEMBLES}')
  _check_temperature(temperature)
  teacher_logits = tf.convert_to_tensor(teacher_logits, tf.float32)
  weights = tf.convert_to_tensor(weights, tf.float32)
  _check_teacher_shapes(teacher_logits, weights)
  if ensemble == 'probs':
    probs = tf.nn.softmax(teacher_logits / temperature, axis=-1)
    return tf.einsum('kn,knc->nc', weights, probs)
  mixed = tf.einsum('kn,knc->nc', weights, teacher_logits)
  return tf.nn.softmax(mixed / temperature, axis=-1)


@tf.autograph.experimental.do_not_convert
def _check_temperature(temperature: float) -> None:
  if isinstance(temperature, (int, float)) and not temperature > 0:
    raise ValueError(f'temperature must be > 0, got {temperature}')


@tf.autograph.experimental.do_not_convert
def kl_per_example(student_logits: tf.Tensor, target_probs: tf.Tensor,
                    temperature: float) -> tf.Tensor:
  """KL(target || softmax(student / T)) per example (no T^2)."""
  target_probs = tf.cast(target_probs, tf.float32)
  log_q = tf.nn.log_softmax(
      tf.cast(student_logits, tf.float32) / temperature, axis=-1)
  # p log p with 0 log 0 = 0. Clamping inside the log (not tf.where) keeps the
  # gradient with respect to p finite at p = 0, which generator training
  # (FedFTG's hard-sample mining) differentiates through.
  tiny = np.finfo(np.float32).tiny
  log_p = tf.math.log(tf.maximum(target_probs, tiny))
  return tf.reduce_sum(target_probs * (log_p - log_q), axis=-1)


@tf.autograph.experimental.do_not_convert
def kd_loss(student_logits: tf.Tensor, target_probs: tf.Tensor,
            temperature: float, reduction: str = 'batchmean') -> tf.Tensor:
  """Hinton's distillation loss: T^2 * mean_i KL(p_i || softmax(s_i / T)).

  With `reduction='batchmean'` this is PyTorch's
  `KLDivLoss(reduction='batchmean')` scaled by T^2. DaFKD's and FedFTG's
  code reduce with 'mean' (over batch x classes), which also divides by the
  number of classes C: for SGD that is a C times smaller step.

  Args:
    student_logits: [B, C] student logits (untempered).
    target_probs: [B, C] target probabilities (already tempered, e.g. by
      `weighted_ensemble`). Zeros are fine. Gradients flow into them too; stop
      them yourself where the targets are constants.
    temperature: T > 0.
    reduction: 'batchmean' or 'mean' (`KL_REDUCTIONS`).

  Returns:
    Scalar float32 loss.
  """
  _check_temperature(temperature)
  if reduction not in KL_REDUCTIONS:
    raise ValueError(f'unknown KL reduction {reduction!r}; expected one of '
                     f'{KL_REDUCTIONS}')
  t = tf.cast(temperature, tf.float32)
  loss = tf.reduce_mean(
      kl_per_example(student_logits, target_probs, temperature)) * t * t
  if reduction == 'mean':
    loss /= tf.cast(tf.shape(student_logits)[-1], tf.float32)
  return loss


class DropWorstResult(NamedTuple):
  """What `drop_worst` produces.

  Attributes:
    weights: [K, N] renormalised weights (dropped teachers get exactly 0).
    accuracies: [K] validation accuracy of each teacher.
    kept: [K] bool, the teachers that keep weight.
  """

  weights: tf.Tensor
  accuracies: tf.Tensor
  kept: tf.Tensor


def drop_worst(teacher_val_logits: tf.Tensor, val_labels: tf.Tensor,
               weights: tf.Tensor) -> DropWorstResult:
  """FedDF's drop-worst: zero teachers no better than random guessing.

  A teacher is dropped when its accuracy on the server validation set is at
  or below 1/C (FedDF section 4, "dropping learners with random
  predictions"). The remaining weights are renormalised per sample with
  `normalize_weights` (uniform over the kept teachers where they all score
  0). If every teacher would be dropped, all are kept.

  Args:
    teacher_val_logits: [K, M, C] teacher logits on M validation examples.
    val_labels: [M] integer labels.
    weights: [K, N] non-negative per-sample weights (or scores).

  Returns:
    A `DropWorstResult`.
  """
  logits = tf.convert_to_tensor(teacher_val_logits, tf.float32)
  weights = tf.convert_to_tensor(weights, tf.float32)
  if logits.shape.rank is not None and logits.shape.rank != 3:
    raise ValueError(
        f'teacher validation logits must have shape [K, M, C], got '
        f'{logits.shape}')
  if (logits.shape.rank is not None and weights.shape.rank is not None and
      not logits.shape[:1].is_compatible_with(weights.shape[:1])):
    raise ValueError(
        f'teacher count of validation logits {logits.shape} does not match '
        f'weights {weights.shape}')
  labels = tf.cast(tf.reshape(val_labels, [-1]), tf.int64)
  correct = tf.reduce_sum(
      tf.cast(tf.equal(tf.argmax(logits, axis=-1), labels[tf.newaxis]),
              tf.int64), axis=1)
  num_val = tf.cast(tf.shape(labels)[0], tf.int64)
  num_classes = tf.cast(tf.shape(logits)[-1], tf.int64)
  # correct / M <= 1 / C in exact integer arithmetic.
  kept = correct * num_classes > num_val
  kept = tf.cond(tf.reduce_any(kept), lambda: kept,
                 lambda: tf.ones_like(kept))
  accuracies = tf.cast(correct, tf.float32) / tf.cast(
      tf.maximum(num_val, 1), tf.float32)
  return DropWorstResult(
      weights=normalize_weights(weights, mask=kept),
      accuracies=accuracies, kept=kept)


class DistillResult(NamedTuple):
  """What `distill` produces (the student is also updated in place).

  Attributes:
    weights: `ModelWeights` values of the final (best, with early stopping)
      student, in Keras order.
    steps_run: Optimiser steps taken, int32 (< `steps` if stopped early).
    first_loss: Mean training KD loss over the first `eval_every` steps (or
      all steps, if fewer ran).
    last_loss: Mean training KD loss over the last `eval_every` steps run.
    best_val_loss: Lowest validation KD loss seen, including the initial
      student's; `NO_VALIDATION` (-1) when `val_fraction` is 0.
    best_step: Steps taken by the returned student (0: the initial one was
      best); -1 when `val_fraction` is 0.
    optimizer_state: The optimiser state after the last step, to continue
      with (`distill(..., optimizer_state=...)`).
    labeled_accuracy_before: Accuracy of the initial student on the labeled
      validation set; -1 without one.
    labeled_accuracy_after: The same for the returned student.
    accepted: 1.0 if the distilled student was kept, 0.0 if `accept`
      returned the initial one.
  """

  weights: tff.learning.models.ModelWeights
  steps_run: tf.Tensor
  first_loss: tf.Tensor
  last_loss: tf.Tensor
  best_val_loss: tf.Tensor
  best_step: tf.Tensor
  optimizer_state: object
  labeled_accuracy_before: tf.Tensor | float = -1.0
  labeled_accuracy_after: tf.Tensor | float = -1.0
  accepted: tf.Tensor | float = 1.0


@tf.autograph.experimental.do_not_convert
def validation_split(num_examples: tf.Tensor, val_fraction: float,
                     seed: int) -> tuple[tf.Tensor, tf.Tensor]:
  """Seeded split of pool indices into (train, validation) index vectors.

  The validation part is max(1, floor(val_fraction * N)) examples chosen by a
  seeded permutation (a pool may be ordered, e.g. generated class by class),
  or empty when `val_fraction` is 0 (then train is 0..N-1 in order).

  Args:
    num_examples: N, the pool size (Python int or scalar int32 tensor).
    val_fraction: In [0, 1).
    seed: The `distill_hparams.DistillConfig.seed`.

  Returns:
    (train_idx, val_idx), int32 vectors.
  """
  n = tf.cast(num_examples, tf.int32)
  if not val_fraction:
    return tf.range(n), tf.zeros([0], tf.int32)
  perm = _permutation(n, [seed, _SPLIT_STREAM])
  n_val = tf.maximum(
      1, tf.cast(tf.floor(val_fraction * tf.cast(n, tf.float64)), tf.int32))
  n_train = n - n_val
  return perm[:n_train], perm[n_train:]


def _permutation(n: tf.Tensor, seed) -> tf.Tensor:
  # Full-range int64 keys make ties (and so any order bias) negligible.
  keys = tf.random.stateless_uniform(
      [n], seed=tf.cast(tf.stack(seed), tf.int64), minval=None, maxval=None,
      dtype=tf.int64)
  return tf.cast(tf.argsort(keys, stable=True), tf.int32)


def _static_input_shape(model: tf.keras.Model) -> tf.TensorShape | None:
  try:
    shape = model.input_shape
  except (AttributeError, RuntimeError):
    return None  # A subclassed model that has not been built.
  if not isinstance(shape, tuple) or any(
      isinstance(s, (tuple, list)) for s in shape):
    return None  # Several inputs: not a pool of single tensors.
  return tf.TensorShape(shape[1:])


def _num_classes(model: tf.keras.Model) -> int | None:
  try:
    shape = model.output_shape
  except (AttributeError, RuntimeError):
    return None
  if isinstance(shape, tuple) and shape and isinstance(shape[-1], int):
    return shape[-1]
  return None


def _check_pool(student: tf.keras.Model, x: tf.Tensor, targets: Targets,
                config: distill_hparams.DistillConfig) -> None:
  """Static shape checks, before any compute."""
  expected = _static_input_shape(student)
  if x.shape.rank is None or x.shape.rank < 1:
    raise ValueError(
        f'distillation pool must have shape [N, ...], got {x.shape}')
  if expected is not None and not x.shape[1:].is_compatible_with(expected):
    raise ValueError(
        f'distillation pool per-example shape {x.shape[1:]} does not match '
        f"the student's input shape {expected}")
  n = x.shape[0]
  if n is not None:
    if n < 1:
      raise ValueError(f'distillation pool is empty: shape {x.shape}')
    if config.val_fraction > 0 and n < 2:
      raise ValueError(
          f'val_fraction {config.val_fraction} needs a pool of at least 2 '
          f'examples, got shape {x.shape}')
  if callable(targets):
    return
  t_shape = targets.shape
  if t_shape.rank != 2:
    raise ValueError(f'targets must have shape [N, C], got {t_shape}')
  if not t_shape[:1].is_compatible_with(x.shape[:1]):
    raise ValueError(
        f'targets {t_shape} do not match the pool size of {x.shape}')
  classes = _num_classes(student)
  if classes is not None and t_shape[1] is not None and t_shape[1] != classes:
    raise ValueError(
        f'targets {t_shape} do not match the student\'s {classes} outputs')


def timed_pool(after: Sequence[Any], pool: tf.Tensor
               ) -> tuple[tf.Tensor, tf.Tensor]:
  """A timestamp taken after `after`, and `pool` tied behind it (graph code).

  A timestamp follows no data flow: without the tie, the runtime may take
  it once the distillation has run. Every distillation step reads the
  pool, so passing the returned pool to `distill` starts the steps after
  the stamp (the pool's values are unchanged).

  Returns:
    (the timestamp, float64 seconds; the pool, to distil on).
  """
  with tf.control_dependencies(list(after)):
    stamp = tf.timestamp()
  with tf.control_dependencies([stamp]):
    return stamp, tf.identity(pool)


@tf.autograph.experimental.do_not_convert
def distill(student: tf.keras.Model,
            optimizer: tff.learning.optimizers.Optimizer,
            x: tf.Tensor,
            targets: Targets,
            config: distill_hparams.DistillConfig,
            *,
            learning_rate: tf.Tensor | float | None = None,
            optimizer_state=None,
            labeled: tuple[tf.Tensor, tf.Tensor] | None = None
            ) -> DistillResult:
  """Distills targets on a pool into `student` (its variables change).

  Every step draws a minibatch of the training part of the pool and takes
  one optimiser step on `kd_loss`. Batches are drawn without replacement:
  each epoch is a fresh permutation seeded by (seed, epoch), cut into
  floor(n_train / batch_size) batches (the remainder of an epoch is skipped,
  so every batch has the same size and every example the same chance). The
  batch order therefore depends only on `config.seed`, in eager and graph
  mode alike.

  The student runs in inference mode by default (BatchNorm normalises with
  the averaged model's moving statistics and leaves them unchanged);
  `config.student_training=True` trains it in training mode, as FedDF's
  server does, and the pool's statistics then replace the moving ones.
  Validation runs it in inference mode.

  Early stopping: with `validation='pool'` and `val_fraction > 0`, the mean
  KD loss on the held-out part of the pool (`validation_split`); with
  `validation='labeled'`, the mean cross-entropy on `labeled`
  (`validation='auto'`: on `labeled` when given, else on the pool). It is
  measured before training, every `eval_every` steps and after the last
  step; training stops after `patience` validations without a strict
  improvement, and the best student seen (trainable and non-trainable
  variables) is restored at the end. With `accept='no_worse'` the initial
  student is returned instead when the result is less accurate on
  `labeled` than it.

  The loss is `kd_loss` alone: the student's `losses` (Keras weight
  regularisers) are not added, as in `local_training.train_locally`.

  Build `student` and `optimizer` outside; call inside a
  `tff.tensorflow.computation` body or eagerly.

  Args:
    student: Keras classifier producing logits, already built (e.g. the
      averaged model).
    optimizer: A `tff.learning.optimizers` optimizer; its state is created
      here unless `optimizer_state` is given.
    x: The distillation pool [N, ...] (real unlabeled or generated samples).
    targets: Either [N, C] target probabilities (e.g. `weighted_ensemble`
      output, tempered with `config.temperature`), or a callable mapping a
      batch [B, ...] to [B, C] target probabilities, evaluated per batch
      (e.g. teachers run on the fly). Targets are treated as constants.
    config: A `distill_hparams.DistillConfig`.
    learning_rate: Overrides the optimiser's learning rate (e.g. a per-round
      decayed one); the cosine schedule, if on, starts from it.
    optimizer_state: State to continue from (`DistillResult.optimizer_state`).
    labeled: The server's labeled validation set (images [V, ...], int
      labels [V]); needed by `validation='labeled'` and `accept='no_worse'`,
      and when given, its accuracy before and after is reported.

  Returns:
    A `DistillResult`.

  Raises:
    ValueError: A bad config (`errors.ConfigError`), an empty pool, shapes
      of the pool or targets that do not match the student, or a config that
      needs `labeled` without it.
  """
  config.check_labeled(0 if labeled is None else 1)
  if labeled is not None:
    labeled = (tf.convert_to_tensor(labeled[0], tf.float32),
               tf.cast(tf.convert_to_tensor(labeled[1]), tf.int32))
  if not isinstance(x, tf.Tensor):
    x = tf.convert_to_tensor(x)
  if not callable(targets) and not isinstance(targets, tf.Tensor):
    targets = tf.convert_to_tensor(targets, tf.float32)
  _check_pool(student, x, targets, config)
  if learning_rate is not None:
    learning_rate = tf.cast(learning_rate, tf.float32)
  return _distill(student, optimizer, x, targets, config, learning_rate,
                  optimizer_state, labeled)


def _values(weights: tff.learning.models.ModelWeights):
  return tf.nest.map_structure(tf.identity, weights)


def _labeled_metrics(student: tf.keras.Model, labeled, batch_size
                     ) -> tuple[tf.Tensor, tf.Tensor]:
  """(mean cross-entropy, accuracy) of `student` on `labeled`, inference."""
  x, y = labeled
  logits = loops.map_batches(lambda b: student(b, training=False), x,
                             batch_size)
  loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=y, logits=logits))
  accuracy = tf.reduce_mean(tf.cast(tf.equal(
      tf.argmax(logits, axis=-1, output_type=tf.int32), y), tf.float32))
  return loss, accuracy


def _start_optimizer(optimizer, trainable, optimizer_state, learning_rate):
  """(optimizer state of tensors, base learning rate) at the first step."""
  if optimizer_state is None:
    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
    optimizer_state = optimizer.initialize(specs)
  # Python-number hparams become tensors, so the loop carries a fixed
  # structure of tensors.
  opt_state = tf.nest.map_structure(tf.convert_to_tensor, optimizer_state)
  hparams = optimizer.get_hparams(opt_state)
  if learning_rate is not None:
    hparams['learning_rate'] = learning_rate
  base_lr = tf.cast(hparams['learning_rate'], tf.float32)
  hparams['learning_rate'] = base_lr
  return optimizer.set_hparams(opt_state, hparams), base_lr


def _student_step(student, optimizer, opt_state, x_batch, target_batch, step,
                  base_lr, config):
  """One optimiser step of the student on eq. (KD); (state, loss)."""
  trainable = local_training.model_weights(student).trainable
  with tf.GradientTape() as tape:
    logits = student(x_batch, training=config.student_training)
    loss = kd_loss(logits, target_batch, config.temperature,
                   config.kl_reduction)
  grads = tape.gradient(loss, trainable)
  if config.clip_norm > 0:
    grads, _ = tf.clip_by_global_norm(grads, config.clip_norm)
  if config.cosine_decay:
    hparams = optimizer.get_hparams(opt_state)
    progress = tf.cast(step, tf.float32) / float(config.steps)
    hparams['learning_rate'] = base_lr * 0.5 * (
        1.0 + tf.cos(math.pi * progress))
    opt_state = optimizer.set_hparams(opt_state, hparams)
  opt_state, updated = optimizer.next(opt_state, tuple(trainable),
                                      tuple(grads))
  for variable, value in zip(trainable, updated):
    variable.assign(value)
  return opt_state, loss


def _accept_or_restore(student, labeled, batch_size, config, initial_weights,
                       accuracy_before):
  """`config.accept` on the labeled set: (accuracy after, accepted 0/1)."""
  if labeled is None:
    return accuracy_before, tf.constant(1.0)
  accuracy_after = _labeled_metrics(student, labeled, batch_size)[1]
  if config.accept != 'no_worse':
    return accuracy_after, tf.constant(1.0)

  def restore():
    tf.nest.map_structure(lambda v, b: v.assign(b),
                          local_training.model_weights(student),
                          initial_weights)
    return accuracy_before, tf.constant(0.0)

  return tf.cond(accuracy_after < accuracy_before, restore,
                 lambda: (accuracy_after, tf.constant(1.0)))


class _Loop(NamedTuple):
  """The variables of `_distill`'s step loop."""

  step: tf.Tensor
  perm: tf.Tensor
  opt_state: Any
  first_sum: tf.Tensor
  recent: tf.Tensor
  steps_run: tf.Tensor
  best_val: tf.Tensor
  best_weights: tff.learning.models.ModelWeights
  best_step: tf.Tensor
  bad_evals: tf.Tensor
  stop: tf.Tensor


@tf.function(autograph=False)
def _distill(student, optimizer, x, targets, config, learning_rate,
             optimizer_state, labeled) -> DistillResult:
  """The graph of `distill` (arguments already checked).

  Steps: the optimiser's start (`_start_optimizer`), the split and the
  initial validation, the loop of `_student_step`s with early stopping on
  the validation loss, the best weights back, and `_accept_or_restore`.
  Written as explicit graph loops and conditionals (`tff_kd.core.loops`),
  so it traces without AutoGraph: the graph AutoGraph made of the Python
  loop (`for step in tf.range(...)` with a `break`) is the same loop.
  """
  variables = local_training.model_weights(student)
  opt_state, base_lr = _start_optimizer(optimizer, variables.trainable,
                                        optimizer_state, learning_rate)

  temperature = config.temperature
  on_labeled = config.validation == 'labeled' or (
      config.validation == 'auto' and labeled is not None)
  use_val = on_labeled or config.val_fraction > 0
  window = config.eval_every
  train_idx, val_idx = validation_split(
      tf.shape(x)[0], 0.0 if on_labeled else config.val_fraction,
      config.seed)
  n_train = tf.shape(train_idx)[0]
  batch_size = tf.minimum(config.batch_size, n_train)
  batches_per_epoch = n_train // batch_size

  def targets_for(idx, x_batch):
    if callable(targets):
      return tf.stop_gradient(tf.cast(targets(x_batch), tf.float32))
    return tf.gather(targets, idx)

  def val_loss_fn(val_targets):
    if on_labeled:
      return _labeled_metrics(student, labeled, batch_size)[0]
    num_val = tf.shape(val_idx)[0]

    def add_batch(total, i):
      start = i * batch_size
      idx = val_idx[start:start + batch_size]
      logits = student(tf.gather(x, idx), training=False)
      return total + tf.reduce_sum(kl_per_example(
          logits, val_targets[start:start + batch_size], temperature))

    total = loops.fold_range((num_val + batch_size - 1) // batch_size,
                             add_batch, tf.constant(0.0))
    return total / tf.cast(num_val, tf.float32) * temperature * temperature

  initial_weights = _values(variables)
  if labeled is not None:
    accuracy_before = _labeled_metrics(student, labeled, batch_size)[1]
  else:
    accuracy_before = tf.constant(-1.0)
  if use_val:
    if on_labeled:
      val_targets = tf.zeros([0, 0])  # Unused.
    elif callable(targets):
      val_targets = tf.stop_gradient(
          loops.map_batches(targets, tf.gather(x, val_idx), batch_size))
    else:
      val_targets = tf.gather(targets, val_idx)
    best_val = val_loss_fn(val_targets)
    best_weights = _values(variables)
  else:
    best_val = tf.constant(NO_VALIDATION)
    best_weights = tff.learning.models.ModelWeights([], [])  # Never updated.

  def validate(s: _Loop) -> _Loop:
    """A validation after step `s.steps_run`; the best student kept."""
    val_loss = val_loss_fn(val_targets)
    best_val, best_weights, best_step, bad_evals = tf.cond(
        val_loss < s.best_val,
        lambda: (val_loss, _values(variables), s.steps_run, tf.constant(0)),
        lambda: (s.best_val, s.best_weights, s.best_step, s.bad_evals + 1))
    return s._replace(best_val=best_val, best_weights=best_weights,
                      best_step=best_step, bad_evals=bad_evals,
                      stop=bad_evals >= config.patience)

  def body(s: _Loop) -> tuple[_Loop]:
    step = s.step
    position = step % batches_per_epoch
    # tf.equal, not `==`: in a TFF computation's graph `tensor == 0` is
    # Python identity (always False).
    perm = tf.cond(
        tf.equal(position, 0),
        lambda: _permutation(n_train, [
            config.seed, _EPOCH_STREAM_OFFSET + step // batches_per_epoch]),
        lambda: s.perm)
    idx = tf.gather(
        train_idx, perm[position * batch_size:(position + 1) * batch_size])
    x_batch = tf.gather(x, idx)
    target_batch = targets_for(idx, x_batch)
    opt_state, loss = _student_step(student, optimizer, s.opt_state, x_batch,
                                    target_batch, step, base_lr, config)
    steps_run = step + 1
    s = s._replace(
        step=steps_run, perm=perm, opt_state=opt_state,
        first_sum=tf.cond(step < window, lambda: s.first_sum + loss,
                          lambda: s.first_sum),
        recent=tf.tensor_scatter_nd_update(s.recent, [[step % window]],
                                           [loss]),
        steps_run=steps_run)
    if use_val:
      # The last step validates too: otherwise the steps after the last
      # full window would always be dropped (all of them when steps <
      # eval_every).
      s = tf.cond(tf.logical_or(tf.equal(steps_run % config.eval_every, 0),
                                tf.equal(steps_run, config.steps)),
                  lambda: validate(s), lambda: s)
    return (s,)

  start = _Loop(
      step=tf.constant(0), perm=tf.range(n_train), opt_state=opt_state,
      first_sum=tf.constant(0.0),
      recent=tf.zeros([window]),  # Ring buffer of the last `window` losses.
      steps_run=tf.constant(0), best_val=best_val, best_weights=best_weights,
      best_step=tf.constant(0 if use_val else -1),
      bad_evals=tf.constant(0), stop=tf.constant(False))
  invariants = tf.nest.map_structure(lambda t: t.shape, start)._replace(
      perm=tf.TensorShape([None]))
  (s,) = tf.while_loop(
      lambda s: tf.logical_and(s.step < config.steps,
                               tf.logical_not(s.stop)),
      body, (start,), shape_invariants=(invariants,),
      maximum_iterations=config.steps)

  if use_val:
    tf.nest.map_structure(lambda v, b: v.assign(b), variables,
                          s.best_weights)
  accuracy_after, accepted = _accept_or_restore(
      student, labeled, batch_size, config, initial_weights, accuracy_before)
  filled = tf.cast(tf.minimum(s.steps_run, window), tf.float32)
  return DistillResult(
      weights=_values(local_training.model_weights(student)),
      steps_run=s.steps_run,
      first_loss=s.first_sum / filled,
      last_loss=tf.reduce_sum(s.recent) / filled,
      best_val_loss=s.best_val,
      best_step=s.best_step,
      optimizer_state=s.opt_state,
      labeled_accuracy_before=accuracy_before,
      labeled_accuracy_after=accuracy_after,
      accepted=accepted)


@tf.autograph.experimental.do_not_convert
def teacher_logits(models: Sequence[tf.keras.Model], x: tf.Tensor,
                   batch_size: int = 256) -> tf.Tensor:
  """Logits of several teachers on a pool, in inference mode, batched.

  Args:
    models: K built Keras classifiers with the same number of outputs C.
    x: Pool [N, ...].
    batch_size: Examples per forward pass (>= 1).

  Returns:
    [K, N, C] float32 logits.
  """
  if not models:
    raise ValueError('teacher_logits needs at least one teacher model')
  if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(f'batch_size must be an integer >= 1, got {batch_size!r}')
  x = tf.convert_to_tensor(x)
  if x.shape.rank is not None and x.shape[0] == 0:
    raise ValueError(f'teacher_logits got an empty pool: shape {x.shape}')
  for i, model in enumerate(models):
    expected = _static_input_shape(model)
    if expected is not None and not x.shape[1:].is_compatible_with(expected):
      raise ValueError(
          f'pool per-example shape {x.shape[1:]} does not match teacher {i}\'s '
          f'input shape {expected}')
  return _teacher_logits(tuple(models), x, int(batch_size))


@tf.function(autograph=False)
def _teacher_logits(models, x, batch_size):
  return tf.stack([
      loops.map_batches(lambda b, m=m: m(b, training=False), x, batch_size)
      for m in models
  ])
