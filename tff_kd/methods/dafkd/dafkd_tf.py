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
`server_round` is the algorithm alone: the round's mechanism metrics
(eq. 7's domain awareness, the pool's quality, the uniform-weight twin) are
computed by the one hook it calls (`tff_kd.core.diagnostics`; DaFKD's is
`tff_kd.methods.dafkd.diagnostics.RoundDiagnostics`).

The discriminator state of a client (`discriminator_variables`) is the head
alone when it shares the classifier's extractor (the extractor is part of the
classifier, which is averaged), or the whole separate discriminator
(trainable and BatchNorm statistics) in the "no sharing" ablation.

Seeds are stateless: a client's step seeds come from its data key
(`tff_kd.federated.tff_types.key_seed`), the pool's from (config seed,
round) (`pool_seed`), so clients and server can draw the same pool
(appendix B) and runs are reproducible.
"""

import collections
from typing import NamedTuple, Optional, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import diagnostics as core_diagnostics
from tff_kd.core import distill_hparams
from tff_kd.core import distillation
from tff_kd.core import local_training
from tff_kd.core import loops
from tff_kd.core import stacking as stacking_tf
from tff_kd.core import teachers as teachers_tf
from tff_kd.methods.dafkd import gan
from tff_kd.models import classifiers
from tff_kd.models import generators

ModelWeights = tff.learning.models.ModelWeights


@tf.autograph.experimental.do_not_convert
def step_seed(base: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
  """Shape-[2] stateless seed of local step `step` of a client round."""
  return tf.stack([tf.cast(base, tf.int64), tf.cast(step, tf.int64)])


@tf.autograph.experimental.do_not_convert
def pool_seed(seed: int, round_num: tf.Tensor) -> tf.Tensor:
  """Shape-[2] stateless seed of round `round_num`'s pseudo pool."""
  # The offset keeps pool seeds apart from the client step seeds' streams.
  return tf.stack([tf.constant(seed, tf.int64) + 7_919,
                   tf.cast(round_num, tf.int64)])


@tf.autograph.experimental.do_not_convert
def discriminator_variables(
    discriminator: generators.DiscriminatorHead) -> list:
  """The variables a client keeps between rounds (its store row)."""
  if discriminator.shared:
    return list(discriminator.head.weights)
  return list(discriminator.model.weights)


@tf.autograph.experimental.do_not_convert
def pseudo_pool(generator: tf.keras.Model, size: int, *, noise_dim: int,
                num_classes: int, seed: tf.Tensor,
                with_labels: bool = False,
                batch_statistics: Optional[int] = None):
  """The distillation pool D^g (Algorithm 1, line 11): `size` generated images.

  Uniform pseudo labels, Gaussian noise, generator in inference mode; with
  `batch_statistics` (a batch size) in training mode, each batch of that
  many normalised by its own statistics (DaFKD's code; the generator's
  moving statistics change, so draw from a scratch copy).
  Returns the images, or (images, their pseudo labels y of G(z, y)) with
  `with_labels`.
  """
  images, _, labels = gan.generate(
      generator, size, noise_dim=noise_dim, num_classes=num_classes,
      seed=seed, training=batch_statistics is not None,
      call_batch=batch_statistics)
  return (images, labels) if with_labels else images


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


class Round(NamedTuple):
  """A client round's place in the schedule.

  Attributes:
    learning_rate: The joint optimiser's learning rate this round.
    number: The round (from 0), read by `GanSettings.disc_rounds` and
      `generator_rounds`; None where no setting reads it.
  """

  learning_rate: tf.Tensor
  number: Optional[tf.Tensor] = None


class Scoring(NamedTuple):
  """How the teachers score a pool (`teacher_outputs`).

  Attributes:
    batch_size: Examples per forward pass.
    batch_statistics: The extractor's BatchNorm in training mode, each
      batch normalised by its own statistics (DaFKD's code); else
      inference mode.
  """

  batch_size: int = 256
  batch_statistics: bool = False


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
              step: tf.Tensor, negatives_pool: Optional[tf.Tensor],
              switches: Optional[tuple[tf.Tensor, tf.Tensor]] = None):
  """A local step with the GAN terms (`gan.client_gan_step`).

  `switches` (bool tensors): whether eq. (2) is in eq. (9) and whether the
  generator is updated in this step (`GanSettings.disc_rounds`,
  `generator_rounds`, `gan_passes`); None: both.

  Returns:
    (joint state, generator state, cross-entropy, the step's `MEAN_NAMES`
    values [6], 1 if a GAN term was on, else 0).
  """
  negatives = None
  if negatives_pool is not None:
    idx = tf.random.stateless_uniform(
        tf.shape(batch['y']), step_seed(seed + 1, step), 0,
        tf.shape(negatives_pool)[0], tf.int32)
    negatives = tf.gather(negatives_pool, idx)
  disc_on, generator_on = (None, True) if switches is None else switches
  r = gan.client_gan_step(models, batch, optimizers, states, settings,
                          step_seed(seed, step), negatives=negatives,
                          disc_on=disc_on, train_generator=generator_on)
  joint = r.ce_loss + settings.adv_weight * r.disc_loss
  if settings.gp_weight:
    joint += settings.gp_weight * r.penalty
  means = tf.stack([joint, r.ce_loss, r.disc_loss, r.gen_loss,
                    r.real_accuracy, r.fake_accuracy])
  if switches is None:
    return r.joint_state, r.generator_state, r.ce_loss, means, tf.constant(1)
  # A step whose terms are both off counts as a plain one in the means.
  is_gan = tf.cast(tf.logical_or(*switches), tf.int32)
  return (r.joint_state, r.generator_state, r.ce_loss,
          means * tf.cast(is_gan, tf.float32), is_gan)


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


def _epoch_window_end(dataset: tf.data.Dataset,
                      settings: gan.GanSettings) -> tf.Tensor:
  """The first local step after the first `gan_epochs` epochs (int64).

  A round of `local_epochs` epochs has `cardinality` steps, an epoch
  cardinality / local_epochs of them. An unknown length gives no end.
  """
  steps = dataset.cardinality()
  end = steps * settings.gan_epochs // max(settings.local_epochs, 1)
  return tf.where(steps < 0, tf.int64.max, end)


class Plateau(NamedTuple):
  """The client's learning-rate plateau state (float32 scalars).

  Attributes:
    loss_sum: The sum of the round's epochs' last-batch cross-entropies.
    epochs: Epochs ended so far.
    best: The best mean seen (inf at the start).
    bad: Epochs since it improved.
  """

  loss_sum: tf.Tensor
  epochs: tf.Tensor
  best: tf.Tensor
  bad: tf.Tensor

  @classmethod
  def start(cls) -> 'Plateau':
    zero = tf.constant(0.0)
    return cls(zero, zero, tf.constant(float('inf')), zero)


# torch.optim.lr_scheduler.ReduceLROnPlateau's defaults, as DaFKD's code
# builds it: mode 'min', factor 0.2, patience 2, relative threshold 1e-4,
# no cooldown, eps 1e-8.
PLATEAU_FACTOR, PLATEAU_PATIENCE, PLATEAU_THRESHOLD = 0.2, 2, 1e-4
PLATEAU_EPS = 1e-8


@tf.autograph.experimental.do_not_convert
def plateau_update(optimizer: tff.learning.optimizers.Optimizer, state,
                   plateau: Plateau, last_loss: tf.Tensor):
  """One ReduceLROnPlateau step at the end of a local epoch.

  DaFKD's code steps its clients' scheduler after every epoch with the mean
  over the round's epochs so far of each epoch's last-batch cross-entropy;
  after more than `PLATEAU_PATIENCE` epochs without a relative improvement
  of `PLATEAU_THRESHOLD` it multiplies the learning rate by
  `PLATEAU_FACTOR` (if that changes it by more than `PLATEAU_EPS`) and
  counts again.

  Returns:
    (the optimiser state with the new learning rate, the new `Plateau`).
  """
  loss_sum = plateau.loss_sum + last_loss
  epochs = plateau.epochs + 1.0
  mean = loss_sum / epochs
  better = mean < plateau.best * (1.0 - PLATEAU_THRESHOLD)
  best = tf.where(better, mean, plateau.best)
  bad = tf.where(better, 0.0, plateau.bad + 1.0)
  due = bad > PLATEAU_PATIENCE
  hparams = optimizer.get_hparams(state)
  lr = tf.cast(hparams['learning_rate'], tf.float32)
  reduced = lr * PLATEAU_FACTOR
  hparams['learning_rate'] = tf.where(
      tf.logical_and(due, lr - reduced > PLATEAU_EPS), reduced, lr)
  return (optimizer.set_hparams(state, hparams),
          Plateau(loss_sum, epochs, best, tf.where(due, 0.0, bad)))


def _round_switch(limit: int, round_num: Optional[tf.Tensor]) -> tf.Tensor:
  """Whether round `round_num` (from 0) is before `limit` (0: no limit)."""
  if not limit:
    return tf.constant(True)
  if round_num is None:
    raise ValueError('a GAN term limited to the first rounds needs the '
                     'round number (client_round\'s Round.number)')
  return tf.cast(round_num, tf.int64) < limit


def _switched(settings: gan.GanSettings) -> bool:
  """Whether the GAN terms follow per-step switches (the round and epoch
  limits of DaFKD's code) rather than the plain `gan_steps` window."""
  return bool(settings.gan_epochs or settings.disc_rounds or
              settings.generator_rounds or
              settings.gan_passes == 'every_step')


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


@tf.function(autograph=False)
def client_round(models: gan.GanModels,
                 weights: tuple[ModelWeights, ModelWeights],
                 discriminator_row: Sequence[tf.Tensor],
                 dataset: tf.data.Dataset,
                 optimizers: gan.GanOptimizers,
                 schedule: Round,
                 seed: tf.Tensor,
                 settings: gan.GanSettings,
                 *,
                 private_pool: Optional[PrivatePool] = None,
                 negatives_pool: Optional[tf.Tensor] = None
                 ) -> ClientRoundResult:
  """Algorithm 1, lines 16-25, on one client (models built outside).

  Optimiser states start fresh each round (as in `local_training`); the joint
  optimiser's learning rate is set to `schedule.learning_rate`.

  Args:
    models: The client's `gan.GanModels` (classifier, discriminator and
      generator; overwritten).
    weights: Broadcast (classifier, generator) `ModelWeights`.
    discriminator_row: This client's discriminator values from its last
      round (`discriminator_variables` order).
    dataset: Batches `{'x', 'y'}`.
    optimizers: `gan.GanOptimizers` of eq. (9) and eq. (3).
    schedule: This round's `Round`: its joint learning rate and its number
      (read by `settings.disc_rounds` and `settings.generator_rounds`).
    seed: int64 seed word of this client round
      (`tff_kd.federated.tff_types.key_seed`).
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
                                            variables.joint,
                                            schedule.learning_rate)
  gen_state = gan.initial_optimizer_state(optimizers.generator,
                                          variables.generator)
  first_gan_step = _first_gan_step(dataset, settings)
  switched = _switched(settings)
  if switched:
    window_end = (_epoch_window_end(dataset, settings) if settings.gan_epochs
                  else first_gan_step + settings.gan_steps
                  if settings.gan_steps else tf.constant(tf.int64.max))
    disc_round = _round_switch(settings.disc_rounds, schedule.number)
    generator_round = _round_switch(settings.generator_rounds,
                                    schedule.number)

  if settings.client_plateau:
    steps_per_epoch = tf.maximum(
        dataset.cardinality() // max(settings.local_epochs, 1), 1)

  def local_step(state, batch):
    (joint_state, gen_state, num_examples, ce_sum, sums, steps, gan_count,
     label_counts) = state[:8]
    states = (joint_state, gen_state)

    def gan_step(switches=None):
      return _gan_step(models, batch, optimizers, states, settings, seed,
                       steps, negatives_pool, switches)

    def ce_step():
      return _ce_step(models.classifier, variables.joint, batch,
                      optimizers.joint, states)

    if switched:
      step = tf.cast(steps, tf.int64)
      in_window = tf.logical_and(step >= first_gan_step, step < window_end)
      switches = (tf.logical_and(in_window, disc_round),
                  tf.logical_and(in_window, generator_round))
      if settings.gan_passes == 'every_step':
        joint_state, gen_state, ce, step_means, is_gan = gan_step(switches)
      else:
        joint_state, gen_state, ce, step_means, is_gan = tf.cond(
            tf.logical_or(*switches), lambda: gan_step(switches), ce_step)
    elif settings.gan_steps:
      in_window = tf.logical_and(
          tf.cast(steps, tf.int64) >= first_gan_step,
          tf.cast(steps, tf.int64) < first_gan_step + settings.gan_steps)
      joint_state, gen_state, ce, step_means, is_gan = tf.cond(
          in_window, gan_step, ce_step)
    else:
      joint_state, gen_state, ce, step_means, is_gan = gan_step()
    extra = ()
    if settings.client_plateau:
      # An epoch's last step: the reference code's plateau schedule.
      joint_state, plateau = tf.cond(
          tf.equal((tf.cast(steps, tf.int64) + 1) % steps_per_epoch, 0),
          lambda: plateau_update(optimizers.joint, joint_state, state[8], ce),
          lambda: (joint_state, state[8]))
      extra = (plateau,)
    batch_size = tf.cast(tf.shape(batch['y'])[0], tf.float32)
    return (joint_state, gen_state, num_examples + batch_size,
            ce_sum + ce * batch_size, sums + step_means, steps + 1,
            gan_count + is_gan,
            label_counts + tf.math.bincount(
                tf.cast(batch['y'], tf.int32),
                minlength=settings.num_classes,
                maxlength=settings.num_classes, dtype=tf.float32), *extra)

  (_, _, num_examples, ce_sum, sums, steps, gan_count,
   label_counts) = loops.fold_batches(
       dataset, local_step,
       (joint_state, gen_state, tf.constant(0.0), tf.constant(0.0),
        tf.zeros([len(MEAN_NAMES)]), tf.constant(0), tf.constant(0),
        tf.zeros([settings.num_classes]),
        *((Plateau.start(),) if settings.client_plateau else ())))[:8]
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


@tf.function(autograph=False)
def teacher_outputs(classifier: classifiers.Classifier,
                    discriminator: generators.DiscriminatorHead,
                    global_weights: ModelWeights,
                    deltas: ModelWeights,
                    discriminator_rows: Sequence[tf.Tensor],
                    valid: tf.Tensor,
                    x: tf.Tensor,
                    scoring: Scoring = Scoring(),
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
    scoring: `Scoring`: examples per forward pass and BatchNorm's mode.
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
  n = tf.shape(x)[0]

  # Every row is evaluated (no tf.cond around two nested models: a much
  # smaller graph); rows without a client are zeroed afterwards.
  def write_row(outputs, k):
    logits_out, scores_out = outputs
    teachers_tf.load_row(variables, global_weights, deltas, k)
    for v, d in zip(disc_vars, discriminator_rows):
      v.assign(d[k])
    logits, scores = gan.teacher_outputs(
        classifier, discriminator, x, labels, scoring.batch_size,
        features_in=features_in, batch_statistics=scoring.batch_statistics)
    scores = tf.reshape(scores, [n])
    keep = tf.cast(valid[k], tf.float32)
    return (logits_out.write(k, keep * logits),
            scores_out.write(k, keep * scores))

  logits_out, scores_out = loops.fold_range(num_slots, write_row, (
      tf.TensorArray(tf.float32, size=num_slots,
                     element_shape=tf.TensorShape([None, num_classes])),
      tf.TensorArray(tf.float32, size=num_slots,
                     element_shape=tf.TensorShape([None]))))
  return logits_out.stack(), scores_out.stack()


@tf.autograph.experimental.do_not_convert
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


@tf.autograph.experimental.do_not_convert
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


class ServerSettings(NamedTuple):
  """The server round's settings, fixed for a process.

  Attributes:
    gan: `gan.GanSettings` (the pool's noise size and classes).
    distill: `distill_hparams.DistillConfig`; its temperature also tempers the
      teachers.
    pool_size: N (generated pools).
    pool_from_broadcast: Draw the pool from the broadcast generator theta_t
      (appendix B: clients have no other) instead of theta_{t+1}.
    ensemble: 'probs' (eq. 8) or 'logits' (the reference code).
    correlation: Weights of eq. (7), or uniform (ablation).
    batch_statistics: The generator draws the pool, and the teachers and
      discriminators score it, with BatchNorm in training mode, a batch of
      `distill.batch_size` at a time (the reference code); else inference.
    first_distill_round: Rounds before this one (from 0) keep the average
      of eq. (6) instead of the distilled student (the reference code: 1).
  """

  gan: gan.GanSettings
  distill: distill_hparams.DistillConfig
  pool_size: int
  pool_from_broadcast: bool
  ensemble: str = 'probs'
  correlation: bool = True
  batch_statistics: bool = False
  first_distill_round: int = 0

  @property
  def scoring(self) -> Scoring:
    """How the pool is scored (`batch_statistics`: batches of
    `distill.batch_size`)."""
    return (Scoring(self.distill.batch_size, batch_statistics=True)
            if self.batch_statistics else Scoring())


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


class Teachers(NamedTuple):
  """The round's teachers, as the diagnostics hook sees them.

  Attributes:
    models: The server's `gan.GanModels` (one classifier and discriminator
      serve every teacher row, `teacher_outputs`).
    global_classifier: The broadcast classifier `ModelWeights`.
    uploads: The clients' `Uploads`.
  """

  models: gan.GanModels
  global_classifier: ModelWeights
  uploads: Uploads


class PoolTerms(NamedTuple):
  """What the server computed on the pool (`core_diagnostics.ServerRound.terms`).

  Attributes:
    labels: The generated pool's pseudo labels y of G(z, y) [N], or None
      (a real pool).
    logits: The teachers' logits [M, N, C], or None (appendix B).
    scores: Their discriminator scores f_k [M, N], or None (appendix B).
    private_sums: Appendix B's (sum_k f_k s_k, sum_k f_k), or None.
  """

  labels: Optional[tf.Tensor]
  logits: Optional[tf.Tensor] = None
  scores: Optional[tf.Tensor] = None
  private_sums: Optional[tuple[tf.Tensor, tf.Tensor]] = None


class ServerRoundResult(NamedTuple):
  """The server's round.

  Attributes:
    classifier: New classifier `ModelWeights` w_{t+1} (distilled).
    generator: New generator `ModelWeights` theta_{t+1}^g (eq. 4).
    distill: `distillation.DistillResult` (its weights are the student's:
      the head alone with appendix A's features).
    metrics: The diagnostics hook's named metrics (empty without one).
    seconds: Wall time of the whole server round (pool, teachers,
      distillation and the hook).
    teacher_seconds: Wall time up to eq. (8)'s target: the means, the pool,
      every client's logits and discriminator scores, eq. (7) and (8).
    distill_seconds: Wall time of the distillation (loading the student,
      its steps and labeled checks). The hook takes the rest of `seconds`.
  """

  classifier: ModelWeights
  generator: ModelWeights
  distill: distillation.DistillResult
  metrics: collections.OrderedDict
  seconds: tf.Tensor
  teacher_seconds: tf.Tensor
  distill_seconds: tf.Tensor


def _round_pool(generator: tf.keras.Model,
                generators_: tuple[ModelWeights, ModelWeights],
                settings: ServerSettings, seed: tf.Tensor,
                real_pool: Optional[tf.Tensor]
                ) -> tuple[tf.Tensor, Optional[tf.Tensor]]:
  """The round's pool and its pseudo labels (Algorithm 1, line 11).

  Drawn from the broadcast or the new generator of `generators_`
  (`ServerSettings.pool_from_broadcast`); the oracle pool `real_pool` has
  no labels.
  """
  if real_pool is not None:
    return real_pool, None
  core_diagnostics.load(
      local_training.model_weights(generator),
      generators_[0] if settings.pool_from_broadcast else generators_[1])
  return pseudo_pool(generator, settings.pool_size,
                     noise_dim=settings.gan.noise_dim,
                     num_classes=settings.gan.num_classes, seed=seed,
                     with_labels=True,
                     batch_statistics=(settings.distill.batch_size
                                       if settings.batch_statistics
                                       else None))


@tf.function(autograph=False)
def server_round(models: gan.GanModels,
                 distill_optimizer: tff.learning.optimizers.Optimizer,
                 global_weights: tuple[ModelWeights, ModelWeights],
                 uploads: Uploads,
                 settings: ServerSettings,
                 pool_seed_value: tf.Tensor,
                 *,
                 real_pool: Optional[tf.Tensor] = None,
                 labeled: Optional[tuple[tf.Tensor, tf.Tensor]] = None,
                 diagnostics: Optional[core_diagnostics.Hook] = None,
                 round_num: Optional[tf.Tensor] = None
                 ) -> ServerRoundResult:
  """Algorithm 1, lines 9-13 (models built outside, overwritten here).

  The means of eqs. (4) and (6), the pool, eq. (7)'s weights and eq. (8)'s
  target (or appendix B's secure sums), and the distillation into the
  averaged classifier. The hook `diagnostics` then sees the round once
  (`core_diagnostics.ServerRound`); it cannot change the result.

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
    labeled: The server's labeled images [V, ...] and labels [V], read by
      `settings.distill.validation` / `.accept`.
    diagnostics: A `core_diagnostics.Hook` (DaFKD's:
      `dafkd.diagnostics.RoundDiagnostics`), or None.
    round_num: The round (from 0), read by
      `settings.first_distill_round`.

  Returns:
    A `ServerRoundResult`.
  """
  t_start = tf.timestamp()  # Stateful: ordered before the variable writes.
  classifier, discriminator, generator = models
  feature_space = settings.gan.feature_space
  if feature_space and real_pool is not None:
    raise ValueError('the oracle pool holds real images; the feature-space '
                     'generator (appendix A) distils on features')
  valid = uploads.valid
  new_classifier = mean_update(global_weights[0], uploads.classifier_deltas,
                               valid, uploads.example_weights)
  new_generator = ModelWeights(
      [g + d for g, d in zip(global_weights[1].trainable,
                             uploads.generator_mean.trainable)],
      list(uploads.generator_mean.non_trainable))
  pool, pool_labels = _round_pool(generator,
                                  (global_weights[1], new_generator),
                                  settings, pool_seed_value, real_pool)
  if uploads.private_sums is None:
    logits, scores = teacher_outputs(
        classifier, discriminator, global_weights[0],
        uploads.classifier_deltas, uploads.discriminator_rows, valid, pool,
        settings.scoring, labels=pool_labels, features_in=feature_space)
    alpha = teacher_weights(scores, valid, correlation=settings.correlation)
    target = distillation.weighted_ensemble(
        logits, alpha, temperature=settings.distill.temperature,
        ensemble=settings.ensemble)
  else:
    logits = scores = alpha = None
    target = tf.ensure_shape(gan.private_teacher(*uploads.private_sums),
                             [settings.pool_size, settings.gan.num_classes])
  # The distillation (loading the student, then its steps) starts after
  # the stamp.
  t_target, distill_pool = distillation.timed_pool([target], pool)
  # Appendix A distils the head on generated features; the averaged
  # extractor stays as it is.
  student = gan.pool_classifier(classifier, settings.gan)
  student_vars = local_training.model_weights(classifier.model)
  with tf.control_dependencies([t_target]):
    core_diagnostics.load(student_vars, new_classifier)
  if labeled is not None and feature_space:
    # The head's labeled inputs: the averaged extractor's features, which
    # head-only distillation leaves unchanged.
    labeled = (distillation.teacher_logits([classifier.features],
                                           labeled[0])[0], labeled[1])
  result = distillation.distill(student, distill_optimizer, distill_pool,
                                target, settings.distill, labeled=labeled)
  # The round's classifier is the whole model as distillation left it (the
  # student may be its head alone).
  with tf.control_dependencies(tf.nest.flatten(result.weights)):
    new_weights = tf.nest.map_structure(tf.identity, student_vars)
    t_distilled = tf.timestamp()
  if settings.first_distill_round:
    if round_num is None:
      raise ValueError('first_distill_round needs the round number '
                       '(server_round(..., round_num=))')
    # Before that round the distilled student is discarded: the round's
    # classifier is the average of eq. (6) (its statistics included).
    distilled = tf.cast(round_num, tf.int64) >= settings.first_distill_round
    new_weights = tf.nest.map_structure(
        lambda d, a: tf.where(distilled, d, a), new_weights, new_classifier)
    result = result._replace(
        labeled_accuracy_after=tf.where(
            distilled, tf.cast(result.labeled_accuracy_after, tf.float32),
            tf.cast(result.labeled_accuracy_before, tf.float32)),
        accepted=tf.cast(distilled, tf.float32) * result.accepted)
  metrics = core_diagnostics.run(diagnostics, core_diagnostics.ServerRound(
      Teachers(models, global_weights[0], uploads), alpha, pool, target,
      student, student_vars, new_classifier, new_weights, labeled,
      PoolTerms(pool_labels, logits, scores, uploads.private_sums)))
  with tf.control_dependencies([*tf.nest.flatten(metrics),
                                *tf.nest.flatten(new_weights)]):
    seconds = tf.cast(tf.timestamp() - t_start, tf.float32)
  return ServerRoundResult(
      new_weights, new_generator, result, metrics, seconds,
      tf.cast(t_target - t_start, tf.float32),
      tf.cast(t_distilled - t_target, tf.float32))
