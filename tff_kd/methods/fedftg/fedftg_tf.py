"""FedFTG's pure-TF pieces: class-wise teacher, label sampling, hard samples.

FedFTG (Zhang, Shen, Ding, Tao and Duan, "Fine-tuning Global Model via
Data-Free Knowledge Distillation for Non-IID Federated Learning", CVPR 2022).
After FedAvg, the server fine-tunes the averaged model (the student) without
data: a conditional generator G(z, y) (`models.generators.
build_image_generator`) and the student play a game against the ensemble of
the K uploaded client models. One server iteration (10 per round in the
reference): one generator step on `hard_sample_generator_loss`, then 5
student steps distilling the class-wise ensemble (`distillation.kd_loss` on
`class_weighted_teacher`).

No text of the paper is available in this repository; what follows is the
CVPR 2022 paper's method as this module's author understands it, and every
coefficient is configurable:

* Customized label sampling: y ~ p(y) with p(c) proportional to the global
  count n_c = sum_k n_{k,c} (`customized_label_sampling`), so the generator
  visits classes as often as the federation holds them.
* Class-level ensemble: client k's weight for a sample of conditional class
  c is alpha_{k,c} = n_{k,c} / sum_j n_{j,c} (`class_ensemble_weights`;
  uniform 1/K for a class nobody holds); the teacher is
      D_T(x) = softmax(sum_k alpha_{k,y} z_k(x))          (ensemble='logits')
  or sum_k alpha_{k,y} softmax(z_k(x)) (ensemble='probs').
* Generator objective, minimised over G:
      L_G = L_fid - beta_tran * L_tran + beta_div * L_div,
      L_fid  = 1/B sum_i -log D_T(x_i)[y_i]          (fidelity: the teacher
               recognises the conditional label),
      L_tran = 1/B sum_i w_i KL(D_T(x_i) || softmax(s(x_i) / T)) * T^2
               (hard-sample mining: make the student disagree with the
               teacher), w_i = 1[argmax s(x_i) = argmax D_T(x_i)] with
               `mask='agree'` (only samples the student still agrees on are
               pushed towards the decision boundary, as in the adversarial
               data-free KD FedFTG builds on) or w_i = 1 with `mask='none'`,
      L_div  = `data_free.diversity_loss(z, x)` (exp(-mean pairwise l1 sample
               distance x squared noise distance), Mao et al., CVPR 2019).
  beta_tran = beta_div = 1 by default.

One server round (`fine_tune`, ZhangLin-PKU/FedFTG's structure): starting
from the FedAvg model, `iterations` times (reference: 10)
  1. `generator_steps` generator steps on L_G for one (z, y) (student and
     teachers frozen, inference mode); the reference code takes one step per
     client, the default here;
  2. a fresh batch x' = G(z', y') (y' by customised label sampling) and its
     class-level ensemble target D_T(x') at temperature T; 5 student steps
     (reference) on it through the shared `distillation.distill`, whose
     optimiser state carries on across the iterations.

The K teachers are either K built Keras models, each called in turn, or
one `StackedTeachers`: their weights stacked [K, ...] and run as one
stacked model (`tff_kd.core.fused.StackedModel`, grouped convolutions and
batched matmuls) in inference mode. Both give the same logits up to float
round-off; the stacked form builds one model instead of K and a graph whose
size does not grow with K.
"""

from typing import NamedTuple, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.core import data_free
from tff_kd.core import distill_hparams
from tff_kd.core import distillation
from tff_kd.core import fused
from tff_kd.core import loops
from tff_kd.methods.fedftg import hparams as hparams_lib
from tff_kd.models import generators

# The config's choices (`hparams` imports no TensorFlow).
MASKS = hparams_lib.MASKS
_TINY = float(np.finfo(np.float32).tiny)


# FedFTG's class-level ensemble weights n_{k,c} / sum_j n_{j,c} (uniform 1/K
# where no client holds class c) are FedGen's label-count weights.
class_ensemble_weights = data_free.label_weights


@tf.autograph.experimental.do_not_convert
def customized_label_sampling(label_counts: tf.Tensor, batch_size,
                              seed) -> tf.Tensor:
  """[batch_size] int32 labels with p(c) = sum_k n_{k,c} / sum n.

  Uniform over classes if every count is 0. Stateless: the same seed gives
  the same labels.

  Args:
    label_counts: [K, C] (or [C]) non-negative counts.
    batch_size: Number of labels (int or scalar tensor).
    seed: int or shape-[2] stateless seed.
  """
  counts = tf.cast(label_counts, tf.float32)
  if counts.shape.rank == 2:
    counts = tf.reduce_sum(counts, axis=0)
  total = tf.reduce_sum(counts)
  probs = tf.where(total > 0, counts, tf.ones_like(counts))
  return data_free.sample_labels(probs, batch_size, seed)


@tf.autograph.experimental.do_not_convert
def class_weighted_teacher(teacher_logits: tf.Tensor,
                           labels: tf.Tensor,
                           label_counts: tf.Tensor,
                           *,
                           temperature: float = 1.0,
                           ensemble: str = 'logits') -> tf.Tensor:
  """The class-level ensemble D_T on samples generated for `labels`.

  Args:
    teacher_logits: [K, B, C] client logits on the generated batch.
    labels: [B] conditional labels of the batch.
    label_counts: [K, C] per-client label counts.
    temperature: Softmax temperature.
    ensemble: 'logits' (weighted logits, then softmax) or 'probs'.

  Returns:
    [B, C] teacher probabilities (`distillation.weighted_ensemble`).
  """
  alpha = tf.gather(class_ensemble_weights(label_counts),
                    tf.cast(labels, tf.int32), axis=1)
  return distillation.weighted_ensemble(
      teacher_logits, alpha, temperature=temperature, ensemble=ensemble)


class HardSampleLoss(NamedTuple):
  """`hard_sample_generator_loss` and its unweighted terms (float32)."""

  loss: tf.Tensor
  fidelity: tf.Tensor
  transfer: tf.Tensor
  diversity: tf.Tensor


@tf.autograph.experimental.do_not_convert
def hard_sample_generator_loss(student_logits: tf.Tensor,
                               teacher_probs: tf.Tensor,
                               labels: tf.Tensor,
                               *,
                               noise: tf.Tensor | None = None,
                               samples: tf.Tensor | None = None,
                               transfer_weight: float = 1.0,
                               diversity_weight: float = 1.0,
                               temperature: float = 1.0,
                               mask: str = 'agree') -> HardSampleLoss:
  """FedFTG's generator loss L_G (see module docstring), minimised over G.

  loss = fidelity - transfer_weight * transfer + diversity_weight * diversity.

  Args:
    student_logits: [B, C] student (global model) logits on the samples.
    teacher_probs: [B, C] class-level ensemble D_T (e.g.
      `class_weighted_teacher` at temperature 1; gradients flow through it
      into the generator).
    labels: [B] conditional labels.
    noise: [B, noise_dim] the generator's noise (for the diversity term).
    samples: [B, ...] the generated samples (for the diversity term).
      Without `noise` and `samples` the diversity term is 0.
    transfer_weight: beta_tran.
    diversity_weight: beta_div.
    temperature: T of the KL in the transfer term.
    mask: 'agree' (only samples where student and teacher argmaxes agree)
      or 'none'.

  Returns:
    A `HardSampleLoss`.

  Raises:
    ValueError: Unknown `mask`, or only one of `noise` / `samples`.
  """
  if mask not in MASKS:
    raise ValueError(
        f"mask {mask!r} is unknown; choose one of {', '.join(MASKS)}")
  if (noise is None) != (samples is None):
    raise ValueError('the diversity term needs both noise and samples')
  student_logits = tf.cast(student_logits, tf.float32)
  teacher_probs = tf.cast(teacher_probs, tf.float32)
  labels = tf.cast(labels, tf.int32)
  picked = tf.gather(teacher_probs, labels, axis=1, batch_dims=1)
  fidelity = -tf.reduce_mean(tf.math.log(tf.maximum(picked, _TINY)))
  # Tempered teacher for the KL: re-normalised p^(1/T) equals softmax(z/T)
  # for the logit ensemble; T = 1 (the default) leaves it unchanged.
  if temperature == 1.0:
    tempered = teacher_probs
  else:
    tempered = tf.nn.softmax(
        tf.math.log(tf.maximum(teacher_probs, _TINY)) / temperature, axis=-1)
  # pylint: disable-next=protected-access
  kl = distillation.kl_per_example(student_logits, tempered, temperature)
  if mask == 'agree':
    weights = tf.cast(tf.equal(
        tf.argmax(student_logits, axis=-1), tf.argmax(teacher_probs, axis=-1)),
                      tf.float32)
  else:
    weights = tf.ones_like(kl)
  transfer = tf.reduce_mean(weights * kl) * temperature * temperature
  if noise is None:
    diversity = tf.constant(0.0)
  else:
    diversity = data_free.diversity_loss(noise, samples)
  loss = fidelity - transfer_weight * transfer + diversity_weight * diversity
  return HardSampleLoss(loss, fidelity, transfer, diversity)


class FineTuneResult(NamedTuple):
  """One `fine_tune` round (metrics are float32 means over iterations).

  Attributes:
    generator_state: The generator optimiser's state after the round.
    student_state: The student optimiser's state after the round.
    generator_loss: Mean L_G.
    fidelity: Mean L_fid.
    transfer: Mean L_tran (student-teacher disagreement on generated data).
    diversity: Mean L_div.
    teacher_accuracy: Mean accuracy of D_T on the generator's labels (the
      generator-step batches).
    distill_loss: Mean KD loss of the student steps.
    distill_first_loss: KD loss of the first iteration's student steps.
    distill_last_loss: KD loss of the last iteration's student steps.
    agreement_before: On 4 x batch fresh samples of the round's final
      generator, the fraction where the initial (FedAvg) student's argmax
      equals the class-level teacher's.
    agreement_after: The same samples and teacher, for the fine-tuned
      student: what the fine-tuning transferred.
  """

  generator_state: object
  student_state: object
  generator_loss: tf.Tensor
  fidelity: tf.Tensor
  transfer: tf.Tensor
  diversity: tf.Tensor
  teacher_accuracy: tf.Tensor
  distill_loss: tf.Tensor
  distill_first_loss: tf.Tensor
  distill_last_loss: tf.Tensor
  agreement_before: tf.Tensor | float = -1.0
  agreement_after: tf.Tensor | float = -1.0


class StackedTeachers(NamedTuple):
  """K teachers of one architecture as one stacked model.

  Attributes:
    model: `fused.StackedModel` of the architecture (its Keras variables
      are only keys; they are never assigned).
    trainable: The K teachers' trainable weights, [K, ...] each, in Keras
      order.
    non_trainable: Their non-trainable weights (BatchNorm's moving
      statistics), [K, ...] each.
  """

  model: fused.StackedModel
  trainable: Sequence[tf.Tensor]
  non_trainable: Sequence[tf.Tensor]

  @property
  def num_teachers(self) -> int:
    return int(self.trainable[0].shape[0])

  def logits(self, x: tf.Tensor) -> tf.Tensor:
    """[K, B, C] inference-mode logits of every teacher on the batch x
    (`fused.StackedModel.infer_shared`: x is read once, not copied K
    times)."""
    return tf.cast(self.model.infer_shared(self.trainable,
                                           self.non_trainable, x),
                   tf.float32)


Teachers = Union[Sequence[tf.keras.Model], StackedTeachers]


@tf.autograph.experimental.do_not_convert
def num_teachers(teachers: Teachers) -> int:
  """K, of built models or of `StackedTeachers`."""
  if isinstance(teachers, StackedTeachers):
    return teachers.num_teachers
  return len(teachers)


def _ensemble_logits(teachers: Teachers, x: tf.Tensor,
                     teacher_mask: tf.Tensor | None) -> tf.Tensor:
  """[K, B, C] inference-mode logits; rows of masked-out teachers are 0."""
  if isinstance(teachers, StackedTeachers):
    return _masked(teachers.logits(x), teacher_mask)
  return _masked(tf.stack([tf.cast(t(x, training=False), tf.float32)
                           for t in teachers]), teacher_mask)


def _masked(logits: tf.Tensor, teacher_mask: tf.Tensor | None) -> tf.Tensor:
  """[K, N, C] `logits` with the rows of masked-out teachers set to 0."""
  if teacher_mask is None:
    return logits
  return logits * tf.reshape(tf.cast(teacher_mask, tf.float32), [-1, 1, 1])


@tf.autograph.experimental.do_not_convert
def teacher_logits(teachers: Teachers, x: tf.Tensor,
                   teacher_mask: tf.Tensor | None = None,
                   batch_size: int = 256) -> tf.Tensor:
  """[K, N, C] inference-mode logits on `x` in batches, masked rows 0.

  The teachers `_ensemble_logits` reads on a generated batch, on a set of
  any size (the server's labeled images, `fedftg_tff.link_table`).

  Args:
    teachers: K built Keras classifiers, or `StackedTeachers`.
    x: Inputs [N, ...].
    teacher_mask: Optional [K] bool/0-1, teachers taking part; the rows of
      the others are 0.
    batch_size: Examples per forward pass.
  """
  if isinstance(teachers, StackedTeachers):
    # [N, K, C] batch by batch, then teacher-major.
    logits = tf.transpose(loops.map_batches(
        lambda b: tf.transpose(teachers.logits(b), [1, 0, 2]), x,
        batch_size), [1, 0, 2])
  else:
    logits = distillation.teacher_logits(list(teachers), x, batch_size)
  return _masked(logits, teacher_mask)


class FineTuneSettings(NamedTuple):
  """The settings of `fine_tune`, fixed for a process.

  Attributes:
    distill_config: The student steps: `steps` per iteration (reference 5),
      `batch_size` generated samples, temperature; `val_fraction` must be 0.
    iterations: Generator/student iterations, >= 1 (reference 10).
    noise_dim: Generator noise size.
    noise: 'gaussian' or 'uniform'.
    transfer_weight: beta_tran.
    diversity_weight: beta_div.
    mask: `hard_sample_generator_loss` mask.
    ensemble: `class_weighted_teacher` ensemble.
    generator_steps: Generator steps per iteration, all on the iteration's
      (z, y); 0: one per teacher taking part (the reference code takes one
      step per client).
  """

  distill_config: distill_hparams.DistillConfig
  iterations: int
  noise_dim: int
  noise: str = 'gaussian'
  transfer_weight: float = 1.0
  diversity_weight: float = 1.0
  mask: str = 'agree'
  ensemble: str = 'logits'
  generator_steps: int = 0


class FineTuneModels(NamedTuple):
  """The server's models (built Keras models, their weights already set).

  Attributes:
    student: The FedAvg model (classifier, logits).
    teachers: K client models, or `StackedTeachers`.
    generator: Conditional generator `[noise, labels] -> images` of the
      student's input shape (trained in training mode).
  """

  student: tf.keras.Model
  teachers: Teachers
  generator: tf.keras.Model


class FineTuneOptimizers(NamedTuple):
  """Reference: generator Adam lr 0.01, student SGD lr 0.1 (x 0.998/round)."""

  generator: tff.learning.optimizers.Optimizer
  student: tff.learning.optimizers.Optimizer


@tf.autograph.experimental.do_not_convert
def fine_tune(models: FineTuneModels,
              label_counts: tf.Tensor,
              optimizers: FineTuneOptimizers,
              states: tuple,
              settings: FineTuneSettings,
              seed,
              *,
              teacher_mask: tf.Tensor | None = None,
              student_learning_rate: tf.Tensor | float | None = None
              ) -> FineTuneResult:
  """FedFTG's server fine-tuning of `student` (see module docstring).

  The student's and the generator's variables change in place. Batch size
  and number of student steps per iteration are `distill_config.batch_size`
  and `.steps`; its temperature T is also the transfer term's.

  Args:
    models: `FineTuneModels` (student, teachers, generator).
    label_counts: [K, C] per-client label counts n_{k,c}.
    optimizers: `FineTuneOptimizers` (generator, student).
    states: Their states (generator over `generator.trainable_weights`,
      student over `student.trainable_weights`).
    settings: `FineTuneSettings`.
    seed: int or shape-[2] stateless seed of the round.
    teacher_mask: Optional [K] bool/0-1, teachers that take part (e.g. the
      filled rows of a fixed-size stack); masked rows must have zero counts.
    student_learning_rate: Overrides the student optimiser's learning rate.

  Returns:
    A `FineTuneResult`.

  Raises:
    ConfigError: iterations < 1, val_fraction > 0, a bad `DistillConfig`,
      or no teacher.
  """
  iterations, generator_steps = settings.iterations, settings.generator_steps
  distill_config, mask = settings.distill_config, settings.mask
  ensemble = settings.ensemble
  if not isinstance(iterations, int) or iterations < 1:
    raise errors.ConfigError(
        f'fedftg iterations must be an integer >= 1, got {iterations!r}')
  if (not isinstance(generator_steps, int) or
      isinstance(generator_steps, bool) or generator_steps < 0):
    raise errors.ConfigError('fedftg generator_steps must be an integer >= 0 '
                             f'(0: one per teacher), got {generator_steps!r}')
  if distill_config.val_fraction:
    raise errors.ConfigError(
        'fedftg distills each generated batch for a fixed number of steps; '
        f'val_fraction must be 0, got {distill_config.val_fraction}')
  if not num_teachers(models.teachers):
    raise errors.ConfigError('fedftg needs at least one teacher model')
  if mask not in MASKS:
    raise errors.ConfigError(
        f"fedftg mask {mask!r} is unknown; choose one of {', '.join(MASKS)}")
  if ensemble not in ('logits', 'probs'):
    raise errors.ConfigError(
        f"fedftg ensemble {ensemble!r} is unknown; choose logits or probs")
  if student_learning_rate is not None:
    student_learning_rate = tf.cast(student_learning_rate, tf.float32)
  return _fine_tune(
      models._replace(teachers=models.teachers if isinstance(
          models.teachers, StackedTeachers) else tuple(models.teachers)),
      tf.cast(label_counts, tf.float32), optimizers, states,
      settings._replace(transfer_weight=float(settings.transfer_weight),
                        diversity_weight=float(settings.diversity_weight)),
      generators._as_seed(seed),  # pylint: disable=protected-access
      teacher_mask, student_learning_rate)


@tf.function(autograph=False)
def _fine_tune(models, counts, optimizers, states, settings, seed,
               teacher_mask, student_learning_rate) -> FineTuneResult:
  """The graph of `fine_tune` (arguments checked), built without AutoGraph
  (`tff_kd.core.loops`)."""
  student, teachers, generator = models
  generator_optimizer, student_optimizer = optimizers
  generator_state, student_state = states
  config, iterations = settings.distill_config, settings.iterations
  noise_dim, noise = settings.noise_dim, settings.noise
  ensemble = settings.ensemble
  generator_steps = settings.generator_steps or None
  batch = config.batch_size
  temperature = config.temperature
  gen_vars = generator.trainable_weights
  gen_state = tf.nest.map_structure(tf.convert_to_tensor, generator_state)
  # The state `distill` returns: hyper-parameters as float32 tensors.
  s_state = tf.nest.map_structure(tf.convert_to_tensor, student_state)
  hparams = student_optimizer.get_hparams(s_state)
  if student_learning_rate is not None:
    hparams['learning_rate'] = student_learning_rate
  hparams['learning_rate'] = tf.cast(hparams['learning_rate'], tf.float32)
  s_state = student_optimizer.set_hparams(s_state, hparams)

  if generator_steps is None:
    # One step per teacher of the round (the reference code's loop).
    generator_steps = (num_teachers(teachers) if teacher_mask is None else
                       tf.reduce_sum(tf.cast(tf.cast(teacher_mask, tf.bool),
                                             tf.int32)))
  generator_steps = tf.maximum(tf.cast(generator_steps, tf.int32), 1)
  start_weights = [tf.identity(v) for v in student.weights]

  def generator_step(state, labels, z):
    gen_state, sums_g = state
    with tf.GradientTape() as tape:
      x = generator([z, labels], training=True)
      teacher = class_weighted_teacher(
          _ensemble_logits(teachers, x, teacher_mask), labels, counts,
          ensemble=ensemble)
      terms = hard_sample_generator_loss(
          student(x, training=False), teacher, labels, noise=z, samples=x,
          transfer_weight=settings.transfer_weight,
          diversity_weight=settings.diversity_weight,
          temperature=temperature, mask=settings.mask)
    grads = tape.gradient(terms.loss, gen_vars)
    gen_state, updated = generator_optimizer.next(
        gen_state, tuple(gen_vars), tuple(grads))
    for variable, value in zip(gen_vars, updated):
      variable.assign(value)
    accuracy = tf.reduce_mean(tf.cast(tf.equal(
        tf.argmax(teacher, axis=-1, output_type=tf.int32), labels),
                                      tf.float32))
    return gen_state, sums_g + tf.stack([terms.loss, terms.fidelity,
                                         terms.transfer, terms.diversity,
                                         accuracy])

  def iteration(state, it):
    gen_state, s_state, sums, first_loss, _ = state
    seeds = tf.random.experimental.stateless_split(
        tf.random.experimental.stateless_fold_in(seed, it), 4)
    # 1. Generator steps: hard samples the teachers still recognise.
    labels = customized_label_sampling(counts, batch, seeds[0])
    z = generators.sample_noise([batch, noise_dim], noise, seeds[1])
    gen_state, sums_g = loops.fold_range(
        generator_steps, lambda g, _: generator_step(g, labels, z),
        (gen_state, tf.zeros([5])))
    means_g = sums_g / tf.cast(generator_steps, tf.float32)
    # 2. Student steps on a fresh batch from the updated generator.
    labels = customized_label_sampling(counts, batch, seeds[2])
    z = generators.sample_noise([batch, noise_dim], noise, seeds[3])
    x = tf.stop_gradient(generator([z, labels], training=True))
    targets = class_weighted_teacher(
        _ensemble_logits(teachers, x, teacher_mask), labels, counts,
        temperature=temperature, ensemble=ensemble)
    result = distillation.distill(student, student_optimizer, x,
                                  tf.stop_gradient(targets), config,
                                  optimizer_state=s_state)
    first_loss = tf.cond(tf.equal(it, 0), lambda: result.first_loss,
                         lambda: first_loss)
    return (gen_state, result.optimizer_state,
            sums + tf.concat([means_g, [result.last_loss]], 0), first_loss,
            result.last_loss)

  gen_state, s_state, sums, first_loss, last_loss = loops.fold_range(
      iterations, iteration,
      (gen_state, s_state, tf.zeros([6]), tf.constant(0.0),
       tf.constant(0.0)))
  means = tf.unstack(sums / float(iterations))
  before, after = _agreement(models, start_weights, counts, teacher_mask,
                             settings, 4 * batch, seed)
  return FineTuneResult(gen_state, s_state, *means[:5],
                        distill_loss=means[5], distill_first_loss=first_loss,
                        distill_last_loss=last_loss, agreement_before=before,
                        agreement_after=after)


def _agreement(models, start_weights, counts, teacher_mask, settings, size,
               seed):
  """The (initial, final) student's argmax agreement with the class-level
  teacher on `size` fresh samples of the round's final generator (drawn as
  the student's training batches are); the student keeps its final
  weights."""
  student, teachers, generator = models
  ensemble, noise, noise_dim = (settings.ensemble, settings.noise,
                                settings.noise_dim)
  seeds = tf.random.experimental.stateless_split(
      tf.random.experimental.stateless_fold_in(seed, -1), 2)
  labels = customized_label_sampling(counts, size, seeds[0])
  statistics = [tf.identity(v) for v in generator.non_trainable_weights]
  x = generator([generators.sample_noise([size, noise_dim], noise, seeds[1]),
                 labels], training=True)
  with tf.control_dependencies([x]):
    # This pass must not move the generator's BatchNorm statistics.
    for v, value in zip(generator.non_trainable_weights, statistics):
      v.assign(value)
  teacher = tf.argmax(class_weighted_teacher(
      _ensemble_logits(teachers, x, teacher_mask), labels, counts,
      ensemble=ensemble), axis=-1, output_type=tf.int32)

  def agreement():
    return tf.reduce_mean(tf.cast(tf.equal(tf.argmax(
        student(x, training=False), axis=-1, output_type=tf.int32), teacher),
                                  tf.float32))

  after = agreement()
  final_weights = [tf.identity(v) for v in student.weights]
  with tf.control_dependencies([after]):
    for v, w in zip(student.weights, start_weights):
      v.assign(w)
  before = agreement()
  with tf.control_dependencies([before]):
    for v, w in zip(student.weights, final_weights):
      v.assign(w)
  return before, after
