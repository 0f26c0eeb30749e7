"""DaFKD's pure-TF GAN pieces: losses, one client step, correlation weights.

DaFKD (Wang et al., "DaFKD: Domain-aware Federated Knowledge Distillation",
CVPR 2023). Each client k keeps a domain discriminator f(theta_k^d; x) that
shares the classifier's extractor (Sec. 3.4, `models.generators.
build_discriminator_head`), and all clients train one global generator
g(theta^g; z) by FedAvg (eq. 4). Data flow of one client round (Algorithm 1,
lines 19-25), one `client_gan_step` per minibatch:

  1. real batch x_k (local data, positive), pseudo batch x_hat = g(z, y)
     (negative, generator frozen);
  2. classifier and discriminator update on the joint loss, eq. (9):
         L_J = L_adv(theta_d) + L_k(w),
     L_adv the BCE of eq. (2), L_k the cross-entropy of eq. (1);
  3. a fresh noise batch, and one generator update on eq. (3).

At the server (eq. 7) the discriminators score each distillation sample and
`correlation_weights` normalises the scores into alpha[k, i]; the target of
eq. (8) is `distillation.weighted_ensemble(..., ensemble='probs')`.
Appendix B keeps the discriminators private: client k uploads f_k(x_i) s_k(x_i)
and f_k(x_i) (`private_teacher_terms`), the server sums them (securely) and
divides (`private_teacher`), which equals the eq. (7)-(8) target.
Appendix A (Fig. 7, `GanSettings.feature_space`) generates features of the
classifier's extractor instead of images: the discriminator's head scores
them directly (real images still go through the shared extractor), and so
do the teachers' classifier heads (`teacher_outputs(..., features_in=True)`).

Choices (each selectable):

* Eq. (2) is the mean over the union of real and pseudo samples,
  -1/(D_k + D_hat_k) [sum log f(x) + sum log(1 - f(x_hat))]; with equal batch
  sizes it is the mean of the two BCE means.
* Eq. (3) maximises -E log(1 - f(g(z))), i.e. the generator minimises
  E log(1 - f(g(z))) (Goodfellow et al.'s minimax form; `form='minimax'`, the
  default, as printed). It saturates when the discriminator rejects the
  samples confidently; `form='non_saturating'` minimises -E log f(g(z))
  (the same fixed point, strong early gradients; what BCE-with-ones GAN code,
  DaFKD's included, usually does).
* The reference code adds a WGAN-GP-style gradient penalty (Gulrajani et al.,
  2017) to the discriminator loss with lambda = 0.3: on x_tilde = e x +
  (1 - e) x_hat, e ~ U[0, 1] per sample, lambda E (||grad_x f(x_tilde)||_2 -
  1)^2, computed on the discriminator's probability output f. The paper has
  no penalty, so `gp_weight` defaults to 0.
* Logits are used inside the losses (`from_logits=True`) for stability; the
  probability form is the paper's and is what tests pin.

Nothing here depends on a TFF placement. `client_gan_step` builds no
variables, so it can be called from a `tf.function` (e.g. a loop over
`iter(dataset)`) inside a `tff.tensorflow.computation`.
"""

import functools
from typing import Callable, NamedTuple, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import distillation
from tff_kd.core import loops
from tff_kd.methods.dafkd import hparams as hparams_lib
from tff_kd.models import classifiers
from tff_kd.models import generators

# The choice lists live with the settings, which import no TensorFlow.
GENERATOR_FORMS = hparams_lib.GENERATOR_FORMS
GENERATOR_LABELS = hparams_lib.GENERATOR_LABELS
DISCRIMINATOR_MODES = hparams_lib.DISCRIMINATOR_MODES
_TINY = float(np.finfo(np.float32).tiny)


def _flat(x) -> tf.Tensor:
  return tf.reshape(tf.cast(x, tf.float32), [-1])


def _log_d(d: tf.Tensor, from_logits: bool) -> tuple[tf.Tensor, tf.Tensor]:
  """(log f, log(1 - f)) of discriminator outputs (probs or logits)."""
  if from_logits:
    return tf.math.log_sigmoid(d), tf.math.log_sigmoid(-d)
  d = tf.clip_by_value(d, 0.0, 1.0)
  return (tf.math.log(tf.maximum(d, _TINY)),
          tf.math.log(tf.maximum(1.0 - d, _TINY)))


def discriminator_loss(d_real: tf.Tensor,
                       d_fake: tf.Tensor,
                       *,
                       from_logits: bool = False) -> tf.Tensor:
  """DaFKD eq. (2): BCE with local data positive, pseudo data negative.

  L_adv = -1/(D + D_hat) [sum_real log f(x) + sum_fake log(1 - f(x_hat))].

  Args:
    d_real: f(x) on the real (local) batch, any shape ([B] or [B, 1]).
    d_fake: f(x_hat) on the pseudo batch.
    from_logits: The inputs are pre-sigmoid logits instead of f.

  Returns:
    Scalar float32 loss.
  """
  d_real, d_fake = _flat(d_real), _flat(d_fake)
  log_real, _ = _log_d(d_real, from_logits)
  _, log_not_fake = _log_d(d_fake, from_logits)
  count = tf.cast(tf.size(d_real) + tf.size(d_fake), tf.float32)
  return -(tf.reduce_sum(log_real) + tf.reduce_sum(log_not_fake)) / count


def generator_loss(d_fake: tf.Tensor,
                   *,
                   form: str = 'minimax',
                   from_logits: bool = False) -> tf.Tensor:
  """DaFKD eq. (3), written as a loss the generator minimises.

  Args:
    d_fake: f(g(z)) on a generated batch.
    form: 'minimax' for mean log(1 - f(g(z))) (eq. 3 as printed: maximising
      -E log(1 - f)); 'non_saturating' for -mean log f(g(z)).
    from_logits: `d_fake` holds logits.

  Returns:
    Scalar float32 loss (minimax form: <= 0).

  Raises:
    ValueError: Unknown `form`.
  """
  if form not in GENERATOR_FORMS:
    raise ValueError(f'generator loss form {form!r} is unknown; choose one of '
                     f"{', '.join(GENERATOR_FORMS)}")
  log_d, log_not_d = _log_d(_flat(d_fake), from_logits)
  if form == 'minimax':
    return tf.reduce_mean(log_not_d)
  return -tf.reduce_mean(log_d)


def gradient_penalty(disc_fn: Callable[[tf.Tensor], tf.Tensor],
                     real: tf.Tensor,
                     fake: tf.Tensor,
                     seed,
                     norm: str = 'image') -> tf.Tensor:
  """WGAN-GP penalty E (||grad_x disc_fn(x_tilde)||_2 - 1)^2 (unweighted).

  x_tilde = e * real + (1 - e) * fake with one e ~ U[0, 1) per sample
  (stateless, from `seed`). DaFKD's code adds 0.3 times this (with disc_fn =
  the sigmoid output) to the discriminator loss.

  With `norm='pixel'` the norm is taken over the channels of each pixel
  (the last axis) and the mean runs over samples and pixels, as DaFKD's
  code computes it (`gradients.norm(2, dim=1)` of an NCHW gradient): every
  pixel's gradient is pushed to norm 1, not each sample's.

  Args:
    disc_fn: Maps a batch [B, ...] to [B] or [B, 1] outputs.
    real: [B, ...] real samples.
    fake: [B, ...] generated samples (same shape).
    seed: int or shape-[2] stateless seed.
    norm: 'image' (WGAN-GP) or 'pixel' (DaFKD's code).

  Returns:
    Scalar float32 penalty (differentiable with respect to disc_fn's
    variables).
  """
  real = tf.cast(real, tf.float32)
  fake = tf.cast(tf.stop_gradient(fake), tf.float32)
  batch = tf.shape(real)[0]
  mix_shape = tf.concat(
      [[batch], tf.ones([tf.rank(real) - 1], tf.int32)], axis=0)
  mix = generators.sample_noise(mix_shape, 'uniform', seed)
  interpolated = mix * real + (1.0 - mix) * fake
  with tf.GradientTape() as tape:
    tape.watch(interpolated)
    out = tf.reduce_sum(disc_fn(interpolated))
  grads = tape.gradient(out, interpolated)
  if norm == 'pixel':
    squares = tf.reduce_sum(tf.square(grads), axis=-1)
  elif norm == 'image':
    squares = tf.reduce_sum(tf.square(tf.reshape(grads, [batch, -1])), axis=1)
  else:
    raise ValueError(f"gradient penalty norm {norm!r} is unknown; choose "
                     "'image' or 'pixel'")
  # The small constant keeps the norm's gradient finite at grads = 0.
  norms = tf.sqrt(squares + 1e-12)
  return tf.reduce_mean(tf.square(norms - 1.0))


def joint_loss(logits: tf.Tensor,
               labels: tf.Tensor,
               d_real: tf.Tensor,
               d_fake: tf.Tensor,
               *,
               adv_weight: float = 1.0,
               from_logits: bool = False) -> tf.Tensor:
  """DaFKD eq. (9): L_J = L_k(w) + adv_weight * L_adv(theta_d).

  Args:
    logits: Classifier logits on the real batch [B, C].
    labels: Int labels [B].
    d_real: Discriminator outputs on the real batch.
    d_fake: Discriminator outputs on the pseudo batch.
    adv_weight: Weight of eq. (2) (1 in the paper).
    from_logits: `d_real` and `d_fake` are logits.

  Returns:
    Scalar float32 loss.
  """
  ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=tf.cast(labels, tf.int32), logits=tf.cast(logits, tf.float32)))
  return ce + adv_weight * discriminator_loss(
      d_real, d_fake, from_logits=from_logits)


def correlation_weights(disc_probs: tf.Tensor,
                        eps: float = 1e-12) -> tf.Tensor:
  """DaFKD eq. (7): alpha[k, i] = f_k(x_i) / sum_j f_j(x_i).

  `distillation.normalize_weights`: a sample every discriminator scores at
  most `eps` in total gets uniform weights 1/K (the reference divides by 0).

  Args:
    disc_probs: [K, N] discriminator probabilities f_k(x_i) >= 0.
    eps: Degeneracy threshold for the column sums.

  Returns:
    [K, N] float32, columns summing to 1.
  """
  return distillation.normalize_weights(disc_probs, eps)


def private_teacher_terms(disc_probs_k: tf.Tensor,
                          logits_k: tf.Tensor,
                          temperature: float = 1.0
                          ) -> tuple[tf.Tensor, tf.Tensor]:
  """What client k uploads in DaFKD's appendix B (discriminator private).

  Args:
    disc_probs_k: f_k(x_i) on the shared pseudo pool, [N] or [N, 1].
    logits_k: Client k's classifier logits on the pool, [N, C].
    temperature: Softmax temperature of the soft predictions s_k.

  Returns:
    (f_k s_k [N, C], f_k [N]) with s_k = softmax(logits_k / T).
  """
  f = _flat(disc_probs_k)
  probs = tf.nn.softmax(tf.cast(logits_k, tf.float32) / temperature, axis=-1)
  return f[:, None] * probs, f


def private_teacher(sum_fs: tf.Tensor,
                    sum_f: tf.Tensor,
                    eps: float = 1e-12,
                    *,
                    fallback: tf.Tensor | None = None) -> tf.Tensor:
  """Server side of appendix B: sum_k f_k s_k / sum_k f_k per sample.

  Equals `weighted_ensemble(logits, correlation_weights(f), ensemble='probs')`
  without the server seeing any f_k or s_k alone.

  Args:
    sum_fs: [N, C], the sum over clients of f_k(x_i) s_k(x_i).
    sum_f: [N], the sum over clients of f_k(x_i).
    eps: Samples with sum_f <= eps use the fallback.
    fallback: [N, C] target for those samples, e.g. the plain mean of the
      clients' soft predictions if they upload it too (then the result equals
      `correlation_weights`' uniform fallback exactly); default uniform 1/C.

  Returns:
    [N, C] float32 target probabilities.
  """
  sum_fs = tf.cast(sum_fs, tf.float32)
  sum_f = _flat(sum_f)[:, None]
  if fallback is None:
    num_classes = tf.cast(tf.shape(sum_fs)[-1], tf.float32)
    fallback = tf.ones_like(sum_fs) / num_classes
  degenerate = sum_f <= eps
  safe = tf.where(degenerate, tf.ones_like(sum_f), sum_f)
  return tf.where(degenerate, tf.cast(fallback, tf.float32) + 0.0 * sum_fs,
                  sum_fs / safe)


def discriminator_scores(discriminator: generators.DiscriminatorHead,
                         x: tf.Tensor,
                         labels: tf.Tensor | None = None,
                         batch_size: int = 256) -> tf.Tensor:
  """f_k(x_i) in inference mode (the server's eq. 7 scores), [N], batched.

  A projection discriminator scores f_k(x_i, y_i) with the samples'
  `labels` (a generated pool's pseudo labels y of G(z, y)).
  """
  if not discriminator.conditional:
    return tf.reshape(distillation.teacher_logits(
        [discriminator.model], x, batch_size)[0], [-1])
  features = tf.reshape(
      distillation.teacher_logits([discriminator.extractor], x, batch_size)[0],
      [-1, int(discriminator.extractor.output_shape[-1])])
  return tf.reshape(tf.sigmoid(discriminator.head_logits(features, labels)),
                    [-1])


def teacher_outputs(classifier: classifiers.Classifier,
                    discriminator: generators.DiscriminatorHead,
                    x: tf.Tensor,
                    labels: tf.Tensor | None = None,
                    batch_size: int = 256,
                    *,
                    features_in: bool = False,
                    batch_statistics: bool = False
                    ) -> tuple[tf.Tensor, tf.Tensor]:
  """One teacher's logits s_k(x) [N, C] and scores f_k(x) [N], batched.

  Both in inference mode, as `distillation.teacher_logits` and
  `discriminator_scores` compute them. When the discriminator shares the
  classifier's extractor, each batch goes through the extractor once and
  feeds both heads (the same ops on the same batches as the two separate
  passes, so the same numbers); a separate discriminator needs its own pass.

  With `batch_statistics` (DaFKD's code; the shared extractor only) both
  heads read features of the extractor in training mode: BatchNorm
  normalises each batch of `batch_size` by its own statistics. The moving
  statistics are restored afterwards.

  Args:
    classifier: The teacher's `Classifier`.
    discriminator: Its `DiscriminatorHead`.
    x: Images [N, ...], or features [N, d] with `features_in`.
    labels: [N] labels of x for a projection discriminator, else None.
    batch_size: Examples per forward pass.
    features_in: `x` are extracted features (appendix A's generated pool):
      both heads read them directly.

  Returns:
    (logits [N, C], scores [N]) float32.
  """
  if not (discriminator.shared or features_in):
    return (distillation.teacher_logits([classifier.model], x, batch_size)[0],
            discriminator_scores(discriminator, x, labels, batch_size))
  if discriminator.conditional and labels is None:
    raise ValueError('a projection discriminator needs the labels of the '
                     'samples it scores')

  if batch_statistics and features_in:
    raise ValueError('batch statistics normalise images in the extractor; '
                     'appendix A\'s generated features skip it')
  statistics = list(classifier.features.non_trainable_weights)
  saved = ([tf.identity(v) for v in statistics] if batch_statistics
           else [])

  def both_heads(batch):
    x_batch, labels_batch = batch
    features = (x_batch if features_in
                else classifier.features(x_batch, training=batch_statistics))
    logits = classifier.head(features, training=False)
    scores = tf.sigmoid(discriminator.head_logits(features, labels_batch))
    return logits, tf.reshape(scores, [-1])

  outputs = loops.map_batches(both_heads, (x, labels), batch_size,
                              num_outputs=2)
  if not saved:
    return outputs
  with tf.control_dependencies(tf.nest.flatten(outputs)):
    restores = [v.assign(value) for v, value in zip(statistics, saved)]
  with tf.control_dependencies(restores):
    return tuple(tf.identity(t) for t in outputs)


def _unique(variables) -> list:
  seen, out = set(), []
  for v in variables:
    if v.ref() not in seen:
      seen.add(v.ref())
      out.append(v)
  return out


class GanVariables(NamedTuple):
  """The two variable groups `client_gan_step` updates, in a fixed order.

  Attributes:
    joint: Classifier trainable variables, then the discriminator's that are
      not the classifier's (only the head when the extractor is shared).
    generator: The generator's trainable variables.
  """

  joint: list
  generator: list


def gan_variables(classifier: classifiers.Classifier,
                  discriminator: generators.DiscriminatorHead,
                  generator: tf.keras.Model) -> GanVariables:
  """The variable groups (and order) of `client_gan_step`'s two updates."""
  joint = _unique(list(classifier.model.trainable_weights) +
                  list(discriminator.model.trainable_weights))
  return GanVariables(joint, list(generator.trainable_weights))


def initial_optimizer_state(optimizer: tff.learning.optimizers.Optimizer,
                            variables: Sequence[tf.Variable],
                            learning_rate: float | tf.Tensor | None = None):
  """`optimizer.initialize` for `variables` (optionally setting the lr)."""
  state = optimizer.initialize(
      tuple(tf.TensorSpec(v.shape, v.dtype) for v in variables))
  if learning_rate is not None:
    hparams = optimizer.get_hparams(state)
    hparams['learning_rate'] = tf.cast(learning_rate, tf.float32)
    state = optimizer.set_hparams(state, hparams)
  return state


class GanStepResult(NamedTuple):
  """What one `client_gan_step` returns (all scalars float32).

  Attributes:
    joint_state: Optimiser state of the classifier+discriminator update.
    generator_state: Optimiser state of the generator update.
    ce_loss: L_k(w), the classifier's cross-entropy on the real batch.
    disc_loss: L_adv(theta_d), eq. (2), before the update.
    penalty: The unweighted gradient penalty (0 when `gp_weight` is 0).
    gen_loss: Eq. (3) loss of the generator step, before its update.
    real_accuracy: Fraction of the real batch with f(x) > 0.5.
    fake_accuracy: Fraction of the pseudo batch with f(x_hat) < 0.5.
  """

  joint_state: object
  generator_state: object
  ce_loss: tf.Tensor
  disc_loss: tf.Tensor
  penalty: tf.Tensor
  gen_loss: tf.Tensor
  real_accuracy: tf.Tensor
  fake_accuracy: tf.Tensor


def _sample_labels(label_probs, num_classes, batch, seed) -> tf.Tensor:
  if label_probs is None:
    logits = tf.zeros([1, num_classes])
  else:
    probs = tf.reshape(tf.cast(label_probs, tf.float32), [1, -1])
    logits = tf.math.log(tf.maximum(probs, _TINY))
  return tf.cast(tf.random.stateless_categorical(
      logits, batch, seed=seed)[0], tf.int32)


def generate(generator: tf.keras.Model,
             batch_size,
             *,
             noise_dim: int,
             num_classes: int,
             seed,
             noise: str = 'gaussian',
             label_probs: tf.Tensor | None = None,
             labels: tf.Tensor | None = None,
             training: bool = False,
             call_batch: int | None = None
             ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """A seeded batch from a conditional generator `[noise, labels] -> x`.

  The same seed gives the same (noise, labels), so clients and the server can
  regenerate the same pseudo pool (DaFKD appendix B).

  Args:
    generator: A conditional generator with int label input.
    batch_size: Number of samples (int or scalar tensor).
    noise_dim: Noise size.
    num_classes: C.
    seed: int or shape-[2] stateless seed.
    noise: 'gaussian' or 'uniform' (`generators.sample_noise`).
    label_probs: [C] label distribution (default uniform).
    labels: [B] int labels to generate instead of drawn ones (then
      `label_probs` is ignored).
    training: Generator mode (BatchNorm batch statistics when True).
    call_batch: Run the generator on consecutive batches of this many
      samples (with `training`, each normalised by its own statistics, as
      DaFKD's code draws its pool); None: one call.

  Returns:
    (samples, noise [B, noise_dim], labels [B] int32).
  """
  seeds = tf.random.experimental.stateless_split(
      generators._as_seed(seed), 2)  # pylint: disable=protected-access
  z = generators.sample_noise([batch_size, noise_dim], noise, seeds[0])
  if labels is None:
    y = _sample_labels(label_probs, num_classes, batch_size, seeds[1])
  else:
    y = tf.cast(labels, tf.int32)
  if call_batch is None:
    return generator([z, y], training=training), z, y
  samples = loops.map_batches(
      lambda b: generator([b[0], b[1]], training=training), (z, y),
      call_batch)
  # The loop's concatenation has no static shape; the samples' is known.
  return tf.ensure_shape(samples, z.shape[:1].concatenate(
      generator.output_shape[1:])), z, y


class GanSettings(NamedTuple):
  """A client's GAN settings (`client_gan_step`, `dafkd_tf.client_round`).

  Attributes:
    noise_dim: Generator noise size.
    num_classes: C.
    adv_weight: Weight of eq. (2) inside eq. (9).
    gp_weight: Gradient-penalty weight, a Python float (reference code 0.3;
      paper 0).
    generator_form: 'minimax' (eq. 3) or 'non_saturating'.
    discriminator_mode: BatchNorm mode of everything the discriminator
      scores in training, one of `DISCRIMINATOR_MODES` ('inference': the
      server's mode; 'batch_update': the reference code's; see
      `client_gan_step`).
    gan_steps: The GAN terms (eq. 2 in eq. 9, and the eq. 3 generator step)
      are active in `gan_steps` local steps of every round (where:
      `gan_window`); the other steps are plain cross-entropy steps of the
      classifier. 0: every step (the paper's Algorithm 1).
    gan_window: 'first' (the first `gan_steps` steps; the reference code
      keeps the GAN terms to its first epochs) or 'last' (the last
      `gan_steps` steps of the round, so the discriminator head ends the
      round trained on the extractor it is uploaded with; needs a dataset
      of known length, else it falls back to 'first').
    noise: 'gaussian' or 'uniform' generator noise.
    label_probs: [C] distribution of the pseudo labels (None: uniform).
    fake_batch_size: Pseudo samples per step (None: the real batch size).
    generator_labels: The labels y of g(z, y) in the generator step:
      'uniform' (the paper: nothing conditions the generator on y) or
      'local' (drawn from the labels of the client's real batch, i.e. from
      its own label distribution, so that client k only trains g(., y) for
      the classes it holds). The discriminator's negatives keep uniform
      labels either way: client k learns to reject every class.
    aux_weight: Weight of an auxiliary classification term in the
      generator step, `aux_weight * CE(classifier_k(g(z, y)), y)` with the
      client's classifier in inference mode (ACGAN, Odena et al., 2017);
      it makes g respect its label. 0: the paper's eq. (3) alone.
    feature_space: Appendix A (Fig. 7): the generator makes features of
      the classifier's extractor instead of images, so the discriminator
      reads them through its head alone (real images still go through the
      extractor) and the auxiliary term through the classifier's head.
    detach_extractor: Eq. (2)'s real term trains the discriminator's head
      only, not the extractor it shares with the classifier (which then
      learns from the cross-entropy alone). With feature-space negatives the
      extractor otherwise moves the real features away from wherever the
      generator puts its features.
    gan_epochs: The GAN window is the first `gan_epochs` of the round's
      `local_epochs` epochs (DaFKD's code: 5 of 20); 0: `gan_steps`'.
    local_epochs: The local epochs of a client round (read by
      `gan_epochs`).
    disc_rounds: Eq. (2) and the penalty are in eq. (9) only in rounds <
      disc_rounds (counted from 0; DaFKD's code: 3); 0: every round.
    generator_rounds: The eq. (3) step only in rounds < generator_rounds
      (DaFKD's code: 5); 0: every round.
    gan_passes: 'window' (outside the window a step is plain cross-entropy)
      or 'every_step' (every step runs the GAN step's forward passes, whose
      training-mode BatchNorm updates stay in 'batch_update' mode; only
      eq. 2's weight and the generator's update follow the windows, as in
      DaFKD's code).
    gp_norm: The gradient penalty's norm ('image' or 'pixel',
      `gradient_penalty`).
    client_plateau: The joint optimiser's learning rate follows DaFKD's
      code's ReduceLROnPlateau over the round's `local_epochs` epochs
      (`dafkd_tf.plateau_update`).
  """

  noise_dim: int
  num_classes: int
  adv_weight: float = 1.0
  gp_weight: float = 0.0
  generator_form: str = 'minimax'
  discriminator_mode: str = 'inference'
  gan_steps: int = 0
  gan_window: str = 'last'
  noise: str = 'gaussian'
  label_probs: tf.Tensor | None = None
  fake_batch_size: int | None = None
  generator_labels: str = 'uniform'
  aux_weight: float = 0.0
  feature_space: bool = False
  detach_extractor: bool = False
  gan_epochs: int = 0
  local_epochs: int = 0
  disc_rounds: int = 0
  generator_rounds: int = 0
  gan_passes: str = 'window'
  gp_norm: str = 'image'
  client_plateau: bool = False


class GanModels(NamedTuple):
  """A client's three models (built outside the TF functions)."""

  classifier: classifiers.Classifier
  discriminator: generators.DiscriminatorHead
  generator: tf.keras.Model


class GanOptimizers(NamedTuple):
  """The client's optimisers: `joint` for eq. (9), `generator` for eq. (3)."""

  joint: tff.learning.optimizers.Optimizer
  generator: tff.learning.optimizers.Optimizer


def client_gan_step(models: GanModels,
                    real_batch: dict,
                    optimizers: GanOptimizers,
                    states: tuple,
                    settings: GanSettings,
                    seed,
                    *,
                    train_generator: bool | tf.Tensor = True,
                    disc_on: tf.Tensor | None = None,
                    negatives: tf.Tensor | None = None) -> GanStepResult:
  """One DaFKD client step: Algorithm 1, lines 20-24.

  1. x_hat = g(z, y) (generator in training mode, no gradient to it);
  2. one `optimizers.joint` step on `GanVariables.joint` with eq. (9) (plus
     `gp_weight` times the gradient penalty); the real batch goes through the
     extractor once, feeding both the classifier's head and the
     discriminator's when they share it;
  3. a fresh (z, y) and one `optimizers.generator` step on the generator's
     variables with eq. (3) (skipped when `train_generator` is False, e.g.
     after the rounds in which the GAN terms are active).

  The classifier's cross-entropy always sees the real batch in training
  mode (BatchNorm normalises it with its own statistics and updates the
  moving ones). What the discriminator sees is `discriminator_mode`:

  * 'inference' (default): the real batch, the pseudo batch, the generator
    step's batch and the penalty's interpolates all go through the
    discriminator in inference mode, i.e. normalised with the moving
    statistics that only real batches update. This is the mode in which the
    server scores samples (eq. 7), so the discriminator is trained on
    exactly the function the server evaluates. With a shared extractor the
    real batch then goes through the extractor twice (training mode for the
    cross-entropy, inference mode for eq. 2).
  * 'real_train': the real batch through the discriminator in training
    mode (the classifier's own pass), pseudo batches in inference mode.
    The discriminator can then separate the two by the BatchNorm mode alone
    instead of by content: after one round on digits (two clients with
    disjoint classes) the server-mode score of a client's own training
    images was 0.05 (0.57 with 'inference'), i.e. at the server every
    discriminator rejected its own data.
  * 'batch': as 'real_train', but pseudo batches in training mode, each
    normalised by its own statistics; their moving-statistics updates are
    undone. A batch of pure pseudo samples normalised by its own mean and
    variance hides exactly the first-order difference from the real data
    (e.g. the mean intensity).
  * 'batch_update': as 'batch', but the pseudo batches' moving-statistics
    updates stay (Keras training mode; the reference code's PyTorch
    behaviour): two thirds of the updates then come from generated images,
    and the classifier evaluated in inference mode (tests, teachers,
    student) normalises real images with the generator's statistics. One
    client, IID, 300 steps with adv_weight 0: the classifier tested at 0.59
    in inference mode against 0.91 in training mode.

  GroupNorm (`norm='group'`) has no moving statistics, and the four
  settings then coincide.

  Optimiser states are passed in and returned (TFF style); create them with
  `initial_optimizer_state(opt, gan_variables(*models).joint)` and
  `.generator`.

  Args:
    models: The client's `GanModels`: its `Classifier`, its
      `DiscriminatorHead` (shared or not) and the conditional generator
      `[noise, labels] -> images`.
    real_batch: `{'x': images [B, ...], 'y': int labels [B]}`.
    optimizers: `GanOptimizers` of eq. (9) and eq. (3).
    states: Their states (joint over `gan_variables(...).joint`, generator
      over the generator's trainable variables).
    settings: `GanSettings` (noise, pseudo labels, loss weights and forms,
      `discriminator_mode`; `gan_steps` and `gan_window` are the round's).
    seed: Shape-[2] (or int) stateless seed of this step; vary it per step.
    train_generator: Run step 3; a bool tensor runs its forward passes
      either way (their BatchNorm updates, `GanSettings.gan_passes`) and
      updates the generator only where it is True.
    disc_on: A bool tensor: eq. (2) and the penalty enter eq. (9) only
      where it is True (their forward passes run either way); None: always.
    negatives: Instead of generated samples, this batch [B', ...] is the
      discriminator's negative batch (e.g. real images of the global
      distribution: the oracle-pool ablation, where p_g = p holds by
      construction); step 3 is then skipped.

  Returns:
    A `GanStepResult`.

  Raises:
    ValueError: Unknown `discriminator_mode`.
  """
  joint_state, generator_state = states
  if settings.discriminator_mode not in DISCRIMINATOR_MODES:
    raise ValueError(
        f'discriminator_mode {settings.discriminator_mode!r} is unknown; '
        f"choose one of {', '.join(DISCRIMINATOR_MODES)}")
  variables = gan_variables(*models)
  seeds = tf.random.experimental.stateless_split(
      generators._as_seed(seed), 3)  # pylint: disable=protected-access
  fake_batch = (tf.shape(real_batch['x'])[0]
                if settings.fake_batch_size is None
                else settings.fake_batch_size)
  if negatives is None:
    x_fake, _, y_fake = generate(models.generator, fake_batch, seed=seeds[0],
                                 **_generator_kwargs(settings))
    x_fake = tf.stop_gradient(x_fake)
  else:
    if settings.feature_space:
      raise ValueError('the oracle pool holds real images; the '
                       'feature-space generator (appendix A) has none')
    if models.discriminator.conditional:
      raise ValueError('the real negatives of the oracle pool are '
                       'unlabeled: a projection discriminator cannot score '
                       'them')
    x_fake, y_fake = tf.convert_to_tensor(negatives, tf.float32), None
    train_generator = False

  with tf.GradientTape() as tape:
    terms = _joint_terms(models, real_batch, x_fake, y_fake, settings,
                         seeds[2], disc_on)
  grads = tape.gradient(terms.loss, variables.joint)
  joint_state = _apply(optimizers.joint, joint_state, variables.joint, grads)

  gen_loss = tf.constant(0.0)
  if isinstance(train_generator, tf.Tensor) or train_generator:
    if settings.generator_labels not in GENERATOR_LABELS:
      raise ValueError(
          f'generator_labels {settings.generator_labels!r} is unknown; '
          f"choose one of {', '.join(GENERATOR_LABELS)}")
    step = functools.partial(
        _generator_step, models, optimizers.generator, generator_state,
        fake_batch, settings, seeds[1], real_batch['y'])
    if isinstance(train_generator, tf.Tensor):
      generator_state, gen_loss = tf.cond(
          train_generator, step, functools.partial(step, update=False))
    else:
      generator_state, gen_loss = step()

  for variable, value in zip(terms.statistics, terms.real_statistics):
    variable.assign(value)
  real_accuracy = tf.reduce_mean(tf.cast(_flat(terms.d_real) > 0.0,
                                         tf.float32))
  fake_accuracy = tf.reduce_mean(tf.cast(_flat(terms.d_fake) < 0.0,
                                         tf.float32))
  return GanStepResult(joint_state, generator_state, terms.ce, terms.disc,
                       terms.penalty, gen_loss, real_accuracy, fake_accuracy)


def _generator_kwargs(settings: GanSettings) -> dict:
  """`generate`'s keyword arguments in training (generator training mode)."""
  return dict(noise_dim=settings.noise_dim, num_classes=settings.num_classes,
              noise=settings.noise, label_probs=settings.label_probs,
              training=True)


def _apply(optimizer: tff.learning.optimizers.Optimizer, state,
           variables: Sequence[tf.Variable], grads):
  """One optimiser step on `variables`; returns the new state."""
  state, updated = optimizer.next(state, tuple(variables), tuple(grads))
  for variable, value in zip(variables, updated):
    variable.assign(value)
  return state


class _JointTerms(NamedTuple):
  """The forward pass of eq. (9) (`_joint_terms`)."""

  loss: tf.Tensor
  ce: tf.Tensor
  disc: tf.Tensor
  penalty: tf.Tensor
  d_real: tf.Tensor
  d_fake: tf.Tensor
  statistics: list
  real_statistics: list


def _joint_terms(models: GanModels, real_batch: dict, x_fake: tf.Tensor,
                 y_fake: tf.Tensor | None, settings: GanSettings,
                 penalty_seed, disc_on: tf.Tensor | None = None
                 ) -> _JointTerms:
  """Eq. (9) on a real and a pseudo batch (inside the joint step's tape).

  `y_fake` are the pseudo batch's labels (read by a projection
  discriminator only). With `disc_on` (a bool tensor) eq. (2) and the
  penalty are weighted by it.

  The BatchNorm modes follow `settings.discriminator_mode` (see
  `client_gan_step`); `statistics` are the moving statistics to reset to
  `real_statistics` after the step ('batch' mode; none otherwise).
  """
  classifier, discriminator, _ = models
  mode = settings.discriminator_mode
  pseudo_training = mode in ('batch', 'batch_update')
  x_real = real_batch['x']
  features = classifier.features(x_real, training=True)
  logits = classifier.head(features, training=True)
  y_real = real_batch['y']
  if settings.detach_extractor:
    if not discriminator.shared:
      raise ValueError('detach_extractor needs the extractor shared')
    real_features = (features if mode != 'inference' else
                     classifier.features(x_real, training=False))
    d_real = discriminator.head_logits(tf.stop_gradient(real_features),
                                       y_real, training=mode != 'inference')
  elif mode == 'inference':
    if discriminator.extractor is not classifier.features:
      # A separate extractor's moving statistics follow the real data too
      # (this training-mode pass only updates them).
      discriminator.extractor(x_real, training=True)
    d_real = discriminator.logits(x_real, y_real, training=False)
  elif discriminator.extractor is classifier.features:
    d_real = discriminator.head_logits(features, y_real, training=True)
  else:
    d_real = discriminator.logits(x_real, y_real, training=True)
  # Read after the real pass's moving-statistics updates (tf.function
  # orders the reads and assigns of a variable as written).
  statistics = _unique(list(classifier.model.non_trainable_weights) +
                       list(discriminator.model.non_trainable_weights))
  real_statistics = ([tf.identity(v) for v in statistics]
                     if mode == 'batch' else [])
  d_fake = _pseudo_logits(discriminator, x_fake, y_fake, settings,
                          training=pseudo_training)
  ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=tf.cast(real_batch['y'], tf.int32), logits=logits))
  disc = discriminator_loss(d_real, d_fake, from_logits=True)
  on = 1.0 if disc_on is None else tf.cast(disc_on, tf.float32)
  loss = ce + on * settings.adv_weight * disc
  if settings.gp_weight:
    if settings.feature_space:
      raise ValueError('the gradient penalty interpolates images; the '
                       'feature-space generator (appendix A) has none')
    if discriminator.conditional:
      raise ValueError('the gradient penalty interpolates samples of '
                       'different labels: a projection discriminator has '
                       'none')
    if settings.fake_batch_size is not None:
      raise ValueError('the gradient penalty pairs real and pseudo samples; '
                       'leave fake_batch_size unset')
    penalty = gradient_penalty(
        lambda x: discriminator.model(x, training=pseudo_training), x_real,
        x_fake, penalty_seed, settings.gp_norm)
    loss += on * settings.gp_weight * penalty
  else:
    penalty = tf.constant(0.0)
  return _JointTerms(loss, ce, disc, penalty, d_real, d_fake, statistics,
                     real_statistics)


def pool_classifier(classifier: classifiers.Classifier,
                    settings: GanSettings) -> tf.keras.Model:
  """What classifies generated samples: the whole classifier on images, or
  its head on appendix A's generated features (`GanSettings.feature_space`).
  """
  return classifier.head if settings.feature_space else classifier.model


def _pseudo_logits(discriminator: generators.DiscriminatorHead,
                   x: tf.Tensor, labels: tf.Tensor | None,
                   settings: GanSettings, *, training: bool) -> tf.Tensor:
  """Discriminator logits of generated samples: images, or appendix A's
  features, which only the discriminator's head reads."""
  if settings.feature_space:
    return discriminator.head_logits(x, labels, training=training)
  return discriminator.logits(x, labels, training=training)


def _local_labels(real_labels: tf.Tensor, batch, seed) -> tf.Tensor:
  """`batch` labels drawn with replacement from a real batch's labels."""
  index = tf.random.stateless_uniform(
      [batch], seed, 0, tf.shape(real_labels)[0], tf.int32)
  return tf.gather(tf.cast(real_labels, tf.int32), index)


def _generator_step(models: GanModels,
                    optimizer: tff.learning.optimizers.Optimizer, state,
                    fake_batch, settings: GanSettings, seed,
                    real_labels: tf.Tensor, update: bool = True):
  """Step 3: one generator update on eq. (3); (state, loss before it).

  With `settings.generator_labels='local'` the labels of g(z, y) are drawn
  from `real_labels`; with `settings.aux_weight` the loss adds the
  client classifier's cross-entropy on (g(z, y), y) (inference mode, the
  gradient reaches only the generator). With `update=False` only the
  forward passes run (their BatchNorm updates) and `state` is returned.
  """
  variables = list(models.generator.trainable_weights)
  seeds = tf.random.experimental.stateless_split(seed, 2)
  labels = (_local_labels(real_labels, fake_batch, seeds[1])
            if settings.generator_labels == 'local' else None)
  with tf.GradientTape() as tape:
    x_gen, _, y_gen = generate(models.generator, fake_batch, seed=seed,
                               labels=labels, **_generator_kwargs(settings))
    d_gen = _pseudo_logits(
        models.discriminator, x_gen, y_gen, settings,
        training=settings.discriminator_mode in ('batch', 'batch_update'))
    gen_loss = generator_loss(d_gen, form=settings.generator_form,
                              from_logits=True)
    if settings.aux_weight:
      logits = pool_classifier(models.classifier, settings)(
          x_gen, training=False)
      gen_loss += settings.aux_weight * tf.reduce_mean(
          tf.nn.sparse_softmax_cross_entropy_with_logits(
              labels=y_gen, logits=logits))
  if not update:
    return state, gen_loss
  grads = tape.gradient(gen_loss, variables)
  return _apply(optimizer, state, variables, grads), gen_loss
