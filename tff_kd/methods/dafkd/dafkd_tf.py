"""DaFKD's client round and server round in pure TensorFlow.

DaFKD (Wang et al., "DaFKD: Domain-aware Federated Knowledge Distillation",
CVPR 2023, Algorithm 1). The single-step maths (eqs. 2, 3, 7, 9, appendix B)
is `tff_kd.methods.dafkd.gan`; this module loops it over a client's data
and runs the server's distillation. `tff_kd.methods.dafkd.dafkd_tff` places
both.

Client k, one round (Algorithm 1, lines 16-26; `client_round`): copy the
broadcast classifier w_t and generator theta_t^g, and its own discriminator
theta_k^d from the previous round (line 18); for every minibatch one
`gan.client_gan_step` (eq. 9 on classifier + discriminator, then eq. 3 on
the generator); return the classifier and generator deltas and the new
discriminator row.

Server, one round (lines 9-13; `server_round`): the mean classifier (eq. 6)
and generator (eq. 4); a seeded pseudo pool from a generator
(`pseudo_pool`); every client's classifier logits and discriminator scores
on it (`teacher_outputs`); alpha of eq. (7) (`teacher_weights`, with the
epsilon guard of `distillation.normalize_weights`), the target of eq. (8)
(`distillation.weighted_ensemble`) and `distillation.distill` into the mean
classifier. With appendix B's private discriminators the clients compute
`gan.private_teacher_terms` on the same pool (`client_round` with a
`PrivatePool`) and the server
only sees their (secure) sums (`gan.private_teacher`). With appendix A's
feature generator (`gan.GanSettings.feature_space`) the pool holds features
of the extractor, the teachers read them with their heads, and only the
averaged classifier's head is distilled (`gan.pool_classifier`); its extractor
stays the average of eq. (6).

The discriminator state of a client (`discriminator_variables`) is the head
alone when it shares the classifier's extractor (the extractor is part of the
classifier, which is averaged), or the whole separate discriminator
(trainable and BatchNorm statistics) in the "no sharing" ablation.

Seeds are stateless: a client's step seeds come from its data key
(`key_seed`), the pool's from (config seed, round) (`pool_seed`), so clients
and server can draw the same pool (appendix B) and runs are reproducible.
"""

from typing import NamedTuple, Optional, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import distillation
from tff_kd.methods.dafkd import gan
from tff_kd.core import local_training
from tff_kd.core import stacking as stacking_tf
from tff_kd.methods.dafkd import weight_diagnostics
from tff_kd.models import classifiers
from tff_kd.models import generators

ModelWeights = tff.learning.models.ModelWeights
GAN_WINDOWS = ('first', 'last')
_HASH_BUCKETS = 2**62


def key_seed(key: tf.Tensor) -> tf.Tensor:
  """An int64 seed word from a client's data key (unique per client/round)."""
  return tf.strings.to_hash_bucket_fast(key, _HASH_BUCKETS)


def step_seed(base: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
  """Shape-[2] stateless seed of local step `step` of a client round."""
  return tf.stack([tf.cast(base, tf.int64), tf.cast(step, tf.int64)])


def pool_seed(seed: int, round_num: tf.Tensor) -> tf.Tensor:
  """Shape-[2] stateless seed of round `round_num`'s pseudo pool."""
  # The offset keeps pool seeds apart from the client step seeds' streams.
  return tf.stack([tf.constant(seed, tf.int64) + 7_919,
                   tf.cast(round_num, tf.int64)])


def discriminator_variables(
    discriminator: generators.DiscriminatorHead) -> list:
  """The variables a client keeps between rounds (its store row)."""
  if discriminator.shared:
    return list(discriminator.head.weights)
  return list(discriminator.model.weights)


def pseudo_pool(generator: tf.keras.Model, size: int, *, noise_dim: int,
                num_classes: int, seed: tf.Tensor,
                with_labels: bool = False):
  """The distillation pool D^g (Algorithm 1, line 11): `size` generated images.

  Uniform pseudo labels, Gaussian noise, generator in inference mode.
  Returns the images, or (images, their pseudo labels y of G(z, y)) with
  `with_labels`.
  """
  images, _, labels = gan.generate(generator, size, noise_dim=noise_dim,
                                   num_classes=num_classes, seed=seed,
                                   training=False)
  return (images, labels) if with_labels else images


def argmax_agreement(logits_or_probs: tf.Tensor, reference) -> tf.Tensor:
  """Fraction of rows whose argmax equals `reference`'s (argmax or labels)."""
  reference = tf.convert_to_tensor(reference)
  if reference.shape.rank == 2:
    reference = tf.argmax(reference, axis=-1)
  return tf.reduce_mean(tf.cast(tf.equal(
      tf.argmax(logits_or_probs, axis=-1, output_type=tf.int32),
      tf.cast(reference, tf.int32)), tf.float32))


class ClientRoundResult(NamedTuple):
  """One client's round.

  Attributes:
    classifier_delta: `ModelWeights`: trainable local - global, and the final
      non-trainable values.
    generator_delta: The same for the generator.
    discriminator: Final values of `discriminator_variables`.
    local: `local_training.LocalResult` (no delta) for the standard stats:
      examples, summed cross-entropy, steps.
    means: float32 [6]: means over steps of (joint loss eq. 9, cross-entropy,
      eq. 2 loss, eq. 3 loss, real accuracy, fake accuracy); zeros if no step.
    private_terms: Appendix B's (f_k s_k [N, C], f_k [N]) on the round's pool
      (drawn from the broadcast generator), or None.
    label_counts: float32 [C], labels of the examples trained on this round
      (for the simulation-only diagnostics of `weight_diagnostics`).
  """

  classifier_delta: ModelWeights
  generator_delta: ModelWeights
  discriminator: list
  local: local_training.LocalResult
  means: tf.Tensor
  private_terms: Optional[tuple[tf.Tensor, tf.Tensor]] = None
  label_counts: Optional[tf.Tensor] = None


class PrivatePool(NamedTuple):
  """Appendix B: the pool every client regenerates, and its teacher terms.

  Attributes:
    size: N.
    seed: `pool_seed` of the round (the server uses the same).
    temperature: T of the soft predictions s_k.
    correlation: f_k from the discriminator, or 1 (uniform ablation).
  """

  size: int
  seed: tf.Tensor
  temperature: float
  correlation: bool = True


MEAN_NAMES = ('joint_loss', 'ce_loss', 'disc_loss', 'generator_loss',
              'disc_real_accuracy', 'disc_fake_accuracy')


def _assign(variables, values) -> None:
  for v, x in zip(variables, values):
    v.assign(x)


def _delta(variables: ModelWeights, start: Sequence[tf.Tensor]) -> ModelWeights:
  return ModelWeights(
      [v - s for v, s in zip(variables.trainable, start)],
      [tf.identity(v) for v in variables.non_trainable])


def _cross_entropy_step(classifier: classifiers.Classifier, joint_variables,
                        batch, optimizer: tff.learning.optimizers.Optimizer,
                        state) -> tuple[tf.Tensor, object]:
  """A plain CE step of the classifier with the joint optimiser (after the
  GAN steps of a round); the discriminator's own variables get no gradient.
  """
  with tf.GradientTape() as tape:
    logits = classifier.model(batch['x'], training=True)
    ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(batch['y'], tf.int32), logits=logits))
  grads = tape.gradient(ce, joint_variables)
  grads = [tf.zeros_like(v) if g is None else g
           for g, v in zip(grads, joint_variables)]
  state, updated = optimizer.next(state, tuple(joint_variables), tuple(grads))
  for variable, value in zip(joint_variables, updated):
    variable.assign(value)
  return ce, state


def _start_round(models: gan.GanModels,
                 weights: tuple[ModelWeights, ModelWeights],
                 discriminator_row: Sequence[tf.Tensor]):
  """Loads the broadcast models and the client's discriminator row.

  Returns:
    (classifier variables, generator variables, their trainable values at
    the start) as `ModelWeights`, `ModelWeights`, list, list.
  """
  clf_vars = local_training.model_weights(models.classifier.model)
  gen_vars = local_training.model_weights(models.generator)
  tf.nest.map_structure(lambda v, t: v.assign(t), clf_vars, weights[0])
  tf.nest.map_structure(lambda v, t: v.assign(t), gen_vars, weights[1])
  _assign(discriminator_variables(models.discriminator), discriminator_row)
  clf_start = [tf.identity(v) for v in clf_vars.trainable]
  gen_start = [tf.identity(v) for v in gen_vars.trainable]
  return clf_vars, gen_vars, clf_start, gen_start


def _gan_step(models: gan.GanModels, batch, optimizers: gan.GanOptimizers,
              states: tuple, settings: gan.GanSettings, seed: tf.Tensor,
              step: tf.Tensor, negatives_pool: Optional[tf.Tensor]):
  """A local step with the GAN terms (`gan.client_gan_step`).

  Returns:
    (joint state, generator state, cross-entropy, the step's `MEAN_NAMES`
    values [6], 1).
  """
  negatives = None
  if negatives_pool is not None:
    idx = tf.random.stateless_uniform(
        tf.shape(batch['y']), step_seed(seed + 1, step), 0,
        tf.shape(negatives_pool)[0], tf.int32)
    negatives = tf.gather(negatives_pool, idx)
  r = gan.client_gan_step(models, batch, optimizers, states, settings,
                          step_seed(seed, step), negatives=negatives)
  joint = r.ce_loss + settings.adv_weight * r.disc_loss
  if settings.gp_weight:
    joint += settings.gp_weight * r.penalty
  return r.joint_state, r.generator_state, r.ce_loss, tf.stack(
      [joint, r.ce_loss, r.disc_loss, r.gen_loss, r.real_accuracy,
       r.fake_accuracy]), tf.constant(1)


def _ce_step(classifier: classifiers.Classifier, joint_variables, batch,
             optimizer: tff.learning.optimizers.Optimizer, states: tuple):
  """A plain cross-entropy step, with `_gan_step`'s outputs (0 for 1)."""
  joint_state, gen_state = states
  ce, joint_state = _cross_entropy_step(classifier, joint_variables, batch,
                                        optimizer, joint_state)
  return joint_state, gen_state, ce, tf.zeros([len(MEAN_NAMES)]), (
      tf.constant(0))


def _first_gan_step(dataset: tf.data.Dataset,
                    settings: gan.GanSettings) -> tf.Tensor:
  """The first local step of the GAN window (int64)."""
  first_gan_step = tf.constant(0, tf.int64)
  if settings.gan_steps and settings.gan_window == 'last':
    # Unknown (-2) or infinite (-1) cardinality: the first steps instead.
    first_gan_step = tf.maximum(
        dataset.cardinality() - settings.gan_steps, 0)
  return first_gan_step


def _private_terms(models: gan.GanModels, gen_vars: ModelWeights,
                   broadcast_generator: ModelWeights, pool: PrivatePool,
                   settings: gan.GanSettings) -> tuple[tf.Tensor, tf.Tensor]:
  """Appendix B's (f_k s_k, f_k) on the pool of the broadcast generator."""
  tf.nest.map_structure(lambda v, t: v.assign(t), gen_vars,
                        broadcast_generator)
  images, labels = pseudo_pool(models.generator, pool.size,
                               noise_dim=settings.noise_dim,
                               num_classes=settings.num_classes,
                               seed=pool.seed, with_labels=True)
  if pool.correlation:
    logits, scores = gan.teacher_outputs(
        models.classifier, models.discriminator, images, labels,
        features_in=settings.feature_space)
  else:
    logits = distillation.teacher_logits(
        [gan.pool_classifier(models.classifier, settings)], images)[0]
    scores = tf.ones([pool.size, 1])
  fs, f = gan.private_teacher_terms(scores, logits, pool.temperature)
  # Static shapes: TFF's (secure) aggregation needs fully defined types.
  return (tf.ensure_shape(fs, [pool.size, settings.num_classes]),
          tf.ensure_shape(f, [pool.size]))


@tf.function
def client_round(models: gan.GanModels,
                 weights: tuple[ModelWeights, ModelWeights],
                 discriminator_row: Sequence[tf.Tensor],
                 dataset: tf.data.Dataset,
                 optimizers: gan.GanOptimizers,
                 learning_rate: tf.Tensor,
                 seed: tf.Tensor,
                 settings: gan.GanSettings,
                 *,
                 private_pool: Optional[PrivatePool] = None,
                 negatives_pool: Optional[tf.Tensor] = None
                 ) -> ClientRoundResult:
  """Algorithm 1, lines 16-25, on one client (models built outside).

  Optimiser states start fresh each round (as in `local_training`); the joint
  optimiser's learning rate is set to `learning_rate`.

  Args:
    models: The client's `gan.GanModels` (classifier, discriminator and
      generator; overwritten).
    weights: Broadcast (classifier, generator) `ModelWeights`.
    discriminator_row: This client's discriminator values from its last
      round (`discriminator_variables` order).
    dataset: Batches `{'x', 'y'}`.
    optimizers: `gan.GanOptimizers` of eq. (9) and eq. (3).
    learning_rate: This round's joint learning rate.
    seed: int64 seed word of this client round (`key_seed`).
    settings: `gan.GanSettings`.
    private_pool: Appendix B: after training, draw the round's pool with the
      broadcast generator and compute `gan.private_teacher_terms` with the
      trained classifier and discriminator (inference mode).
    negatives_pool: The oracle-pool ablation: real images [P, ...] of the
      global distribution that replace the generated negatives of eq. (2)
      (a seeded batch of them per GAN step); the generator is not trained.

  Returns:
    A `ClientRoundResult`.
  """
  clf_vars, gen_vars, clf_start, gen_start = _start_round(
      models, weights, discriminator_row)
  variables = gan.gan_variables(*models)
  joint_state = gan.initial_optimizer_state(optimizers.joint,
                                            variables.joint, learning_rate)
  gen_state = gan.initial_optimizer_state(optimizers.generator,
                                          variables.generator)
  num_examples = tf.constant(0.0)
  ce_sum = tf.constant(0.0)
  sums = tf.zeros([len(MEAN_NAMES)])
  steps = tf.constant(0)
  gan_count = tf.constant(0)
  label_counts = tf.zeros([settings.num_classes])


  def gan_step(batch, joint_state, gen_state):
    return _gan_step(models, batch, optimizers, (joint_state, gen_state),
                     settings, seed, steps, negatives_pool)

  def ce_step(batch, joint_state, gen_state):
    return _ce_step(models.classifier, variables.joint, batch,
                    optimizers.joint, (joint_state, gen_state))

  first_gan_step = _first_gan_step(dataset, settings)
  for batch in iter(dataset):
    if settings.gan_steps:
      in_window = tf.logical_and(
          tf.cast(steps, tf.int64) >= first_gan_step,
          tf.cast(steps, tf.int64) < first_gan_step + settings.gan_steps)
      joint_state, gen_state, ce, step_means, is_gan = tf.cond(
          in_window,
          lambda b=batch, j=joint_state, g=gen_state: gan_step(b, j, g),
          lambda b=batch, j=joint_state, g=gen_state: ce_step(b, j, g))
    else:
      joint_state, gen_state, ce, step_means, is_gan = gan_step(
          batch, joint_state, gen_state)
    batch_size = tf.cast(tf.shape(batch['y'])[0], tf.float32)
    sums += step_means
    num_examples += batch_size
    ce_sum += ce * batch_size
    steps += 1
    gan_count += is_gan
    label_counts += tf.math.bincount(
        tf.cast(batch['y'], tf.int32), minlength=settings.num_classes,
        maxlength=settings.num_classes, dtype=tf.float32)
  # The GAN metrics are means over the steps that had GAN terms.
  means = sums / tf.maximum(tf.cast(gan_count, tf.float32), 1.0)
  clf_delta = _delta(clf_vars, clf_start)
  gen_delta = _delta(gen_vars, gen_start)
  disc_row = [tf.identity(v)
              for v in discriminator_variables(models.discriminator)]
  terms = None
  if private_pool is not None:
    # The delta is read first (tf.function orders stateful ops).
    terms = _private_terms(models, gen_vars, weights[1], private_pool,
                           settings)
  return ClientRoundResult(
      clf_delta, gen_delta, disc_row,
      local_training.LocalResult(None, num_examples, ce_sum, steps), means,
      terms, label_counts)


@tf.function
def teacher_outputs(classifier: classifiers.Classifier,
                    discriminator: generators.DiscriminatorHead,
                    global_weights: ModelWeights,
                    deltas: ModelWeights,
                    discriminator_rows: Sequence[tf.Tensor],
                    valid: tf.Tensor,
                    x: tf.Tensor,
                    batch_size: int = 256,
                    labels: Optional[tf.Tensor] = None,
                    features_in: bool = False
                    ) -> tuple[tf.Tensor, tf.Tensor]:
  """Every received client's logits s_k and discriminator score f_k on x.

  Row k's classifier is `global + delta_k` with its own non-trainable values,
  its discriminator `discriminator_rows[..][k]` (on that classifier's
  extractor when shared: one extractor pass per batch feeds both heads,
  `gan.teacher_outputs`). One set of Keras models serves all rows.

  Args:
    classifier: A built classifier (overwritten).
    discriminator: Its discriminator (overwritten).
    global_weights: The broadcast classifier `ModelWeights`.
    deltas: Stacked [M, ...] classifier deltas (as `ClientRoundResult`).
    discriminator_rows: Stacked [M, ...] discriminator values.
    valid: [M] bool, rows that hold a client.
    x: Pool [N, ...].
    batch_size: Examples per forward pass.
    labels: [N] labels of x, read by a projection discriminator (f_k(x_i,
      y_i)); None for DaFKD's.
    features_in: x are generated features (appendix A), which both heads
      read directly.

  Returns:
    (logits [M, N, C], scores f_k(x_i) [M, N] in [0, 1]); zeros in invalid
    rows.
  """
  variables = local_training.model_weights(classifier.model)
  disc_vars = discriminator_variables(discriminator)
  num_slots = int(valid.shape[0])
  num_classes = int(classifier.model.output_shape[-1])
  logits_out = tf.TensorArray(tf.float32, size=num_slots,
                              element_shape=tf.TensorShape([None, num_classes]))
  scores_out = tf.TensorArray(tf.float32, size=num_slots,
                              element_shape=tf.TensorShape([None]))
  n = tf.shape(x)[0]
  # Every row is evaluated (no tf.cond around two nested models: a much
  # smaller graph); rows without a client are zeroed afterwards.
  for k in tf.range(num_slots):
    for v, g, d in zip(variables.trainable, global_weights.trainable,
                       deltas.trainable):
      v.assign(g + d[k])
    for v, d in zip(variables.non_trainable, deltas.non_trainable):
      v.assign(d[k])
    for v, d in zip(disc_vars, discriminator_rows):
      v.assign(d[k])
    logits, scores = gan.teacher_outputs(classifier, discriminator, x,
                                         labels, batch_size,
                                         features_in=features_in)
    scores = tf.reshape(scores, [n])
    keep = tf.cast(valid[k], tf.float32)
    logits_out = logits_out.write(k, keep * logits)
    scores_out = scores_out.write(k, keep * scores)
  return logits_out.stack(), scores_out.stack()


def teacher_weights(scores: tf.Tensor, valid: tf.Tensor, *,
                    correlation: bool = True,
                    eps: float = 1e-12) -> tf.Tensor:
  """alpha[k, i] of eq. (7) over the received clients ([M, N], columns sum 1).

  Rows that hold no client get 0. A sample every discriminator rejects
  (scores summing to <= eps) gets uniform weights. `correlation=False` is
  the "no correlation" ablation: uniform 1/K_t (FedDF's plain average).
  """
  scores = tf.convert_to_tensor(scores, tf.float32)
  raw = scores if correlation else tf.ones_like(scores)
  return distillation.normalize_weights(raw, eps,
                                        mask=tf.cast(valid, tf.float32))


def mean_update(global_weights: ModelWeights, deltas: ModelWeights,
                valid: tf.Tensor,
                example_weights: Optional[tf.Tensor] = None) -> ModelWeights:
  """Eqs. (4) and (6): the mean of the received models.

  The paper's plain mean 1/K_t sum_k, or, with `example_weights` ([M]
  example counts), FedAvg's n_k / sum_j n_j. Non-trainable values
  (BatchNorm statistics) are averaged the same way; with no client, the
  global model is returned unchanged.
  """
  weights = (tf.ones(tf.shape(valid), tf.float32) if example_weights is None
             else example_weights)
  alpha = stacking_tf.example_weights(weights, valid)
  mean = stacking_tf.average_update(deltas, alpha, global_weights.non_trainable)
  return ModelWeights(
      [g + d for g, d in zip(global_weights.trainable, mean.trainable)],
      mean.non_trainable)


class Validation(NamedTuple):
  """The server's labeled images and the round's label counts (diagnostics).

  Attributes:
    x: Labeled validation images [V, ...] (real data, held out).
    y: Their int labels [V].
    label_counts: Stacked [M, C] label counts of the received clients.
    holder_share: A client holds a label with at least this share of its
      examples (`weight_diagnostics.holders`).
  """

  x: tf.Tensor
  y: tf.Tensor
  label_counts: tf.Tensor
  holder_share: float


class Diagnostics(NamedTuple):
  """Whether eq. (7) knows who knows, measured every round.

  Attributes:
    weights: `weight_diagnostics.WeightDiagnostics` of eq. (7)'s alpha on the
      labeled validation images (the mechanism's domain awareness and the
      weighted / uniform / oracle ensemble accuracies).
    pool: `weight_diagnostics.PoolQuality` of the teachers on the pool.
    score_real: Mean server-mode discriminator score f_k on the validation
      images (received clients).
    score_pool: The same on the distillation pool.
    pool_weights: `weight_diagnostics.WeightDiagnostics` of eq. (7)'s alpha
      on the generated pool, with each sample's pseudo label y of G(z, y)
      as its class (the holders of y are the teachers that should get the
      weight; the "accuracies" are agreements with y), or None for a real
      pool, whose labels the server does not have.
  """

  weights: weight_diagnostics.WeightDiagnostics
  pool: weight_diagnostics.PoolQuality
  score_real: tf.Tensor
  score_pool: tf.Tensor
  pool_weights: Optional[weight_diagnostics.WeightDiagnostics] = None


class ServerRoundResult(NamedTuple):
  """The server's round.

  Attributes:
    classifier: New classifier `ModelWeights` w_{t+1} (distilled).
    generator: New generator `ModelWeights` theta_{t+1}^g (eq. 4).
    distill: `distillation.DistillResult` (its weights are the student's:
      the head alone with appendix A's features).
    alpha_entropy: Mean entropy (nats) of alpha; -1 in private mode.
    alpha_sum_error: max_i |sum_k alpha[k, i] - 1|; 0 in private mode.
    mean_score: Mean discriminator score f_k(x_i) over received clients and
      the pool (private mode: sum_k f_k / K_t).
    agreement_before: Fraction of the pool where the averaged classifier's
      argmax (inference mode) equals the target's, before distillation.
    agreement_after: The same for the distilled student.
    label_fidelity: Fraction of the generated pool G(z, y) that the averaged
      classifier (before distillation) classifies as its pseudo label y;
      -1 for a real pool. About 1/C when the generator ignores its label.
    diagnostics: `Diagnostics`, or None (private mode, or no validation).
    target_entropy: Mean entropy (nats) of the distillation targets over
      the pool: ln C for uniform targets, 0 for one-hot ones.
    seconds: Wall time of the whole server round (pool, teachers,
      diagnostics and distillation).
    twin_accuracy_after: With `ServerSettings.twin_student`, the labeled
      accuracy of the averaged classifier distilled on the uniform
      ensemble instead (same teachers, pool and start); else None.
  """

  classifier: ModelWeights
  generator: ModelWeights
  distill: distillation.DistillResult
  alpha_entropy: tf.Tensor
  alpha_sum_error: tf.Tensor
  mean_score: tf.Tensor
  agreement_before: tf.Tensor
  agreement_after: tf.Tensor
  label_fidelity: tf.Tensor
  diagnostics: Optional[Diagnostics] = None
  target_entropy: Optional[tf.Tensor] = None
  seconds: Optional[tf.Tensor] = None
  twin_accuracy_after: Optional[tf.Tensor] = None


class ServerSettings(NamedTuple):
  """The server round's settings, fixed for a process.

  Attributes:
    gan: `gan.GanSettings` (the pool's noise size and classes).
    distill: `distillation.DistillConfig`; its temperature also tempers the
      teachers.
    pool_size: N (generated pools).
    pool_from_broadcast: Draw the pool from the broadcast generator theta_t
      (appendix B: clients have no other) instead of theta_{t+1}.
    ensemble: 'probs' (eq. 8) or 'logits' (the reference code).
    correlation: Weights of eq. (7), or uniform (ablation).
    pool_candidates: m: draw m x pool_size generated images and distil on
      the pool_size hardest (`select_hardest`); 1: the paper's pool.
    twin_student: A diagnostic: before the round's distillation, also
      distil the averaged classifier on the uniform ensemble of the same
      teachers on the same pool (`_twin_student`) and report its labeled
      accuracy; the round's result is unchanged. Needs a labeled set and
      plain (non-private) mode.
  """

  gan: gan.GanSettings
  distill: distillation.DistillConfig
  pool_size: int
  pool_from_broadcast: bool
  ensemble: str = 'probs'
  correlation: bool = True
  pool_candidates: int = 1
  twin_student: bool = False


class PoolTerms(NamedTuple):
  """The pool and what the server computed on it, sample by sample."""

  images: tf.Tensor
  labels: Optional[tf.Tensor]
  logits: tf.Tensor
  scores: tf.Tensor
  alpha: tf.Tensor
  target: tf.Tensor
  student_logits: tf.Tensor


def select_hardest(terms: PoolTerms, count: int,
                   temperature: float) -> PoolTerms:
  """The `count` samples where the student matches eq. (8)'s target worst.

  A variant, not the paper's: a generated pool that the averaged classifier
  already labels as the target does gives distillation nothing to move
  (`distillation.hardest_samples`).
  """
  idx = distillation.hardest_samples(terms.student_logits, terms.target,
                                     temperature, count)
  sample_axis = {'logits': 1, 'scores': 1, 'alpha': 1}
  return PoolTerms(**{
      name: None if value is None else tf.gather(
          value, idx, axis=sample_axis.get(name, 0))
      for name, value in terms._asdict().items()})


class Uploads(NamedTuple):
  """What the server received this round, stacked in [M, ...] rows.

  Exactly one of `discriminator_rows` (the discriminators were uploaded)
  and `private_sums` ((sum_k f_k s_k, sum_k f_k) of appendix B) is given.

  Attributes:
    classifier_deltas: Stacked classifier deltas (as `ClientRoundResult`).
    generator_mean: The mean of the clients' generator deltas (trainable)
      and final values (non-trainable), by examples or plainly (eq. 4); the
      aggregator averages them without stacking them.
    valid: [M] bool, rows that hold a client.
    discriminator_rows: Stacked discriminator values, or None.
    private_sums: Appendix B sums ([N, C], [N]), or None.
    example_weights: [M] example counts: average the classifiers by them
      (FedAvg's weighting) instead of the paper's plain mean; None: plain
      mean.
  """

  classifier_deltas: ModelWeights
  generator_mean: ModelWeights
  valid: tf.Tensor
  discriminator_rows: Optional[Sequence[tf.Tensor]] = None
  private_sums: Optional[tuple[tf.Tensor, tf.Tensor]] = None
  example_weights: Optional[tf.Tensor] = None


def _diagnose(models: gan.GanModels, global_weights: ModelWeights,
              uploads: Uploads, pool_outputs: tuple[tf.Tensor, tf.Tensor],
              target: tf.Tensor, validation: Validation,
              correlation: bool,
              pool_labels: Optional[tf.Tensor] = None) -> Diagnostics:
  """`Diagnostics` of this round's teachers (scored as on the pool).

  `pool_outputs` are the teachers' (logits, scores) on the pool;
  `pool_labels` the generated pool's pseudo labels (None: a real pool).
  """
  valid = uploads.valid
  pool_logits, pool_scores = pool_outputs
  logits, scores = teacher_outputs(models.classifier, models.discriminator,
                                   global_weights, uploads.classifier_deltas,
                                   uploads.discriminator_rows, valid,
                                   validation.x, labels=validation.y)
  shares = weight_diagnostics.label_shares(validation.label_counts)

  def weights_on(alpha_scores, sample_logits, labels):
    holder = weight_diagnostics.holders(shares, labels, valid,
                                        validation.holder_share)
    return weight_diagnostics.weight_diagnostics(
        teacher_weights(alpha_scores, valid, correlation=correlation),
        sample_logits, labels, holder, valid)

  num_clients = tf.maximum(tf.reduce_sum(tf.cast(valid, tf.float32)), 1.0)

  def mean_score(s):
    return tf.reduce_sum(tf.reduce_mean(s, axis=1)) / num_clients

  return Diagnostics(
      weights_on(scores, logits, validation.y),
      weight_diagnostics.pool_quality(pool_logits, valid, target),
      mean_score(scores), mean_score(pool_scores),
      None if pool_labels is None else weights_on(pool_scores, pool_logits,
                                                  pool_labels))


def skipped_diagnostics(pool_labels: bool) -> Diagnostics:
  """NaN `Diagnostics` for a round that skips them (`server_round`).

  Args:
    pool_labels: The pool has pseudo labels (a generated pool), so the
      diagnostics have `pool_weights`.
  """

  def nan(cls):
    return cls(*[tf.constant(float('nan'))] * len(cls._fields))

  return Diagnostics(
      nan(weight_diagnostics.WeightDiagnostics),
      nan(weight_diagnostics.PoolQuality), tf.constant(float('nan')),
      tf.constant(float('nan')),
      nan(weight_diagnostics.WeightDiagnostics) if pool_labels else None)


def _twin_student(student: tf.keras.Model,
                  optimizer: tff.learning.optimizers.Optimizer,
                  pool: tf.Tensor, teachers: tuple, settings: 'ServerSettings',
                  labeled: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
  """The uniform-weight twin's student, from the same start and pool.

  Distils `student` (the averaged classifier, overwritten) on the uniform
  ensemble of the same teachers and returns its labeled accuracy after.

  Args:
    student: The model distillation trains (classifier or head).
    optimizer: The distillation optimiser (fresh state).
    pool: The round's (selected) pool.
    teachers: (logits [M, N, C], scores [M, N], valid [M]) on the pool.
    settings: `ServerSettings` (its distillation config and ensemble).
    labeled: The labeled set as the student reads it.

  Returns:
    The twin student's labeled accuracy (float32 scalar).
  """
  logits, scores, valid = teachers
  uniform = distillation.weighted_ensemble(
      logits, teacher_weights(scores, valid, correlation=False),
      temperature=settings.distill.temperature, ensemble=settings.ensemble)
  return distillation.distill(student, optimizer, pool, uniform,
                              settings.distill,
                              labeled=labeled).labeled_accuracy_after


@tf.function
def server_round(models: gan.GanModels,
                 distill_optimizer: tff.learning.optimizers.Optimizer,
                 global_weights: tuple[ModelWeights, ModelWeights],
                 uploads: Uploads,
                 settings: ServerSettings,
                 pool_seed_value: tf.Tensor,
                 *,
                 real_pool: Optional[tf.Tensor] = None,
                 validation: Optional[Validation] = None,
                 diagnose: Optional[tf.Tensor] = None
                 ) -> ServerRoundResult:
  """Algorithm 1, lines 9-13 (models built outside, overwritten here).

  Args:
    models: `gan.GanModels`: a classifier (teacher slot, then the student),
      its discriminator (teacher slots) and a generator (draws the pool).
    distill_optimizer: The student's optimiser (fresh state every round).
    global_weights: Broadcast (classifier, generator) `ModelWeights`.
    uploads: The received clients' `Uploads`.
    settings: `ServerSettings`.
    pool_seed_value: `pool_seed` of this round.
    real_pool: The oracle-pool ablation: distil on these real images
      [N, ...] instead of a generated pool.
    validation: Labeled images and label counts: `Diagnostics`, and the
      labeled set of `settings.distill.validation` / `.accept`.
    diagnose: With `validation`, a bool scalar: compute the `Diagnostics`
      this round, or return `skipped_diagnostics` (NaN); None: every round.

  Returns:
    A `ServerRoundResult`.
  """
  t_start = tf.timestamp()  # Stateful: ordered before the variable writes.
  classifier, discriminator, generator = models
  feature_space = settings.gan.feature_space
  if feature_space and real_pool is not None:
    raise ValueError('the oracle pool holds real images; the feature-space '
                     'generator (appendix A) distils on features')
  # Appendix A distils the head on generated features; the averaged
  # extractor stays as it is.
  student = gan.pool_classifier(classifier, settings.gan)
  valid = uploads.valid
  config = settings.distill
  new_classifier = mean_update(global_weights[0], uploads.classifier_deltas,
                               valid, uploads.example_weights)
  new_generator = ModelWeights(
      [g + d for g, d in zip(global_weights[1].trainable,
                             uploads.generator_mean.trainable)],
      list(uploads.generator_mean.non_trainable))
  if real_pool is None:
    gen_vars = local_training.model_weights(generator)
    tf.nest.map_structure(
        lambda v, t: v.assign(t), gen_vars,
        global_weights[1] if settings.pool_from_broadcast else new_generator)
    pool, pool_labels = pseudo_pool(
        generator, settings.pool_size * settings.pool_candidates,
        noise_dim=settings.gan.noise_dim,
        num_classes=settings.gan.num_classes, seed=pool_seed_value,
        with_labels=True)
  else:
    pool, pool_labels = real_pool, None
  num_clients = tf.maximum(tf.reduce_sum(tf.cast(valid, tf.float32)), 1.0)
  student_vars = local_training.model_weights(classifier.model)

  def load_average():
    tf.nest.map_structure(lambda v, t: v.assign(t), student_vars,
                          new_classifier)

  def student_logits():
    return distillation.teacher_logits([student], pool)[0]

  diagnostics = None
  fidelity = logits_before = None
  if uploads.private_sums is None:
    logits, scores = teacher_outputs(
        classifier, discriminator, global_weights[0],
        uploads.classifier_deltas, uploads.discriminator_rows, valid, pool,
        labels=pool_labels, features_in=feature_space)
    alpha = teacher_weights(scores, valid, correlation=settings.correlation)
    target = distillation.weighted_ensemble(
        logits, alpha, temperature=config.temperature,
        ensemble=settings.ensemble)
    if settings.pool_candidates > 1:
      load_average()
      candidates = PoolTerms(pool, pool_labels, logits, scores, alpha,
                              target, student_logits())
      # Label fidelity is the generator's: measured on every candidate.
      fidelity = argmax_agreement(candidates.student_logits, pool_labels)
      (pool, pool_labels, logits, scores, alpha, target,
       logits_before) = select_hardest(candidates, settings.pool_size,
                                       config.temperature)
    entropy = distillation.mean_entropy(alpha, axis=0)
    sum_error = tf.reduce_max(tf.abs(tf.reduce_sum(alpha, axis=0) - 1.0))
    mean_score = tf.reduce_sum(tf.reduce_mean(scores, axis=1)) / num_clients
    if validation is not None:

      def run_diagnostics():
        return _diagnose(models, global_weights[0], uploads,
                         (logits, scores), target, validation,
                         settings.correlation, pool_labels)

      diagnostics = (run_diagnostics() if diagnose is None else tf.cond(
          diagnose, run_diagnostics,
          lambda: skipped_diagnostics(pool_labels is not None)))
  else:
    sum_fs, sum_f = uploads.private_sums
    target = tf.ensure_shape(gan.private_teacher(sum_fs, sum_f),
                             [settings.pool_size, settings.gan.num_classes])
    entropy = tf.constant(-1.0)
    sum_error = tf.constant(0.0)
    mean_score = tf.reduce_mean(sum_f) / num_clients
  load_average()
  if logits_before is None:  # Else the selection has them.
    logits_before = student_logits()
  before = argmax_agreement(logits_before, target)
  if fidelity is None:
    fidelity = (tf.constant(-1.0) if pool_labels is None else
                argmax_agreement(logits_before, pool_labels))
  labeled = None
  if validation is not None:
    # The head's labeled inputs: the averaged extractor's features, which
    # head-only distillation leaves unchanged.
    labeled = (distillation.teacher_logits([classifier.features],
                                           validation.x)[0]
               if feature_space else validation.x, validation.y)
  twin_after = None
  if (settings.twin_student and labeled is not None
      and uploads.private_sums is None):
    twin_after = _twin_student(student, distill_optimizer, pool, (
        logits, scores, valid), settings, labeled)
    load_average()
  result = distillation.distill(student, distill_optimizer, pool, target,
                                config, labeled=labeled)
  # The round's classifier is the whole model as distillation left it (the
  # student may be its head alone).
  with tf.control_dependencies(tf.nest.flatten(result.weights)):
    new_weights = tf.nest.map_structure(tf.identity, student_vars)
  after = argmax_agreement(student_logits(), target)
  with tf.control_dependencies([after, *tf.nest.flatten(new_weights)]):
    seconds = tf.cast(tf.timestamp() - t_start, tf.float32)
  return ServerRoundResult(new_weights, new_generator, result, entropy,
                           sum_error, mean_score, before, after, fidelity,
                           diagnostics,
                           distillation.mean_entropy(target, axis=-1),
                           seconds, twin_after)
