"""FedGen's pure-TF pieces: generator objective, diversity, local regulariser.

FedGen (Zhu, Hong and Zhou, "Data-Free Knowledge Distillation for
Heterogeneous Federated Learning", ICML 2021; supplement Sec. 9). A
lightweight generator G_w(eps, y) -> z produces *features* (the input of the
classifier's last layer, `Classifier.head`); clients upload their models
and per-label counts n_{k,y}. Data flow of one round:

  server: `generator_step` x (50 per round in the reference): labels
          y ~ qualified labels, eps ~ noise, z = G(eps, y); loss
              alpha_t * teacher_loss + eta * diversity_loss
          with the K received heads h_k frozen; only G moves.
  client: local steps on `regularized_local_loss` with the broadcast G frozen.

Formulas implemented:

* Teacher loss (supplement Sec. 9 "Weighting user models", as the reference
  code computes it): with w_{k,y} = n_{k,y} / sum_j n_{j,y},
      L_T = 1/B sum_i sum_k w_{k,y_i} CE(h_k(z_i), y_i)      (`'per_head'`)
  A class nobody holds gets uniform weights 1/K (the reference would divide
  by 0 but never samples such labels: it draws labels from the "qualified"
  ones, max_k n_{k,y} > 1, `qualified_labels`). The paper's main objective
  (eq. 4 of the ICML paper; the supplement's printed form) puts the ensemble
  inside the loss, CE(softmax(sum_k w_{k,y} h_k(z)), y); `ensemble='logits'`
  selects it.
* Diversity loss (the reference's `DiversityLoss(metric='l1')`, after Mao et
  al., CVPR 2019):
      L_div = exp(-1/B^2 sum_{i,j} d_z(z_i, z_j) * d_eps(eps_i, eps_j)),
      d_z(a, b) = mean_d |a_d - b_d| (l1; 'l2': mean_d (a_d - b_d)^2;
                  'cosine': 1 - cos(a, b)),
      d_eps(a, b) = mean_d (a_d - b_d)^2,
  the mean running over all B^2 ordered pairs, diagonal (zeros) included.
  Minimising it spreads the features of distinct noise vectors apart.
* Teacher accuracy (a diagnostic): argmax of sum_k w_{k,y} h_k(z) vs y
  (`label_weighted_ensemble`; the server's link table scores the same
  ensemble of the full client models on its labeled images).
* Local objective (ICML paper eq. 5 plus the reference code's extra term):
      J_k = CE(f_k(x), y)
            + alpha * 1/B' sum_j CE(h_k(G(eps_j, y_hat_j)), y_hat_j)
            + beta * KL(softmax(h_k(G(eps_i, y_i))) || softmax(f_k(x_i)))
  with y_hat ~ p_hat(y) (the reference: uniform over every label of the
  federation, `fedgen_tff.generated_label_probs`), G and
  the KL target frozen, the KL averaged over the real batch ("batchmean").
  The paper has only the alpha term (beta = 0). The reference multiplies the
  alpha term by B'/B and decays both coefficients per round,
  max(1e-4, c0 * 0.98^t) (`decayed_coefficient`), with c0 = 10 for MNIST,
  and switches the regulariser off in round 0 (an untrained generator). The
  caller passes the effective alpha and beta.

Noise defaults to the paper's N(0, I); the reference code draws U[0, 1)
(`noise='uniform'`). Use the same kind on the server and the clients.

Heads are given as a callable features [B, d] -> logits [K, B, C], e.g.
`linear_heads_logits` over stacked kernels/biases of the K clients' last
layers (FedGen's heads are one Dense layer) or a stack of Keras heads.

Nothing here depends on a TFF placement; `generator_step` builds no
variables and can run in a `tf.function` inside a TFF computation.
"""

from typing import Callable, NamedTuple

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import data_free
from tff_kd.core import distillation
from tff_kd.core import loops
from tff_kd.methods.fedgen import hparams as hparams_lib
from tff_kd.models import classifiers
from tff_kd.models import generators

HeadsFn = Callable[[tf.Tensor], tf.Tensor]
# The config's choices (`hparams` imports no TensorFlow).
TEACHER_ENSEMBLES = hparams_lib.TEACHER_ENSEMBLES


@tf.autograph.experimental.do_not_convert
def linear_heads_logits(features: tf.Tensor, kernels: tf.Tensor,
                        biases: tf.Tensor) -> tf.Tensor:
  """Logits of K linear heads on one batch of features.

  Args:
    features: [B, d].
    kernels: [K, d, C] stacked Dense kernels.
    biases: [K, C] stacked Dense biases.

  Returns:
    [K, B, C] logits.
  """
  return (tf.einsum('bd,kdc->kbc', tf.cast(features, tf.float32), kernels) +
          biases[:, None, :])


@tf.autograph.experimental.do_not_convert
def _weights_per_sample(labels, label_counts) -> tf.Tensor:
  """alpha[k, i] = w[k, y_i], [K, B]."""
  return tf.gather(data_free.label_weights(label_counts),
                   tf.cast(labels, tf.int32),
                   axis=1)


@tf.autograph.experimental.do_not_convert
def teacher_loss(teacher_logits: tf.Tensor,
                 labels: tf.Tensor,
                 label_counts: tf.Tensor,
                 *,
                 ensemble: str = 'per_head') -> tf.Tensor:
  """FedGen's label-count-weighted teacher loss (see module docstring).

  Args:
    teacher_logits: [K, B, C], head k's logits on generated feature i.
    labels: [B] int labels the features were generated for.
    label_counts: [K, C] per-client label counts n_{k,y}.
    ensemble: 'per_head' (reference code, sum_k w CE(h_k, y)) or 'logits'
      (the paper, CE(sum_k w h_k, y)).

  Returns:
    Scalar float32 loss.

  Raises:
    ValueError: Unknown `ensemble`.
  """
  if ensemble not in TEACHER_ENSEMBLES:
    raise ValueError(f'teacher ensemble {ensemble!r} is unknown; choose one of '
                     f"{', '.join(TEACHER_ENSEMBLES)}")
  teacher_logits = tf.cast(teacher_logits, tf.float32)
  labels = tf.cast(labels, tf.int32)
  alpha = _weights_per_sample(labels, label_counts)
  if ensemble == 'per_head':
    num_heads = tf.shape(teacher_logits)[0]
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.tile(labels[None, :], [num_heads, 1]), logits=teacher_logits)
    return tf.reduce_mean(tf.reduce_sum(alpha * ce, axis=0))
  mixed = tf.einsum('kb,kbc->bc', alpha, teacher_logits)
  return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=mixed))


@tf.autograph.experimental.do_not_convert
def label_weighted_ensemble(teacher_logits: tf.Tensor, labels: tf.Tensor,
                            label_counts: tf.Tensor) -> tf.Tensor:
  """FedGen's teacher ensemble: sum_k w_{k,y_i} h_k(x_i), [B, C] logits.

  Each teacher's logits on sample i are weighted by its share w_{k,y_i} =
  n_{k,y_i} / sum_j n_{j,y_i} of the sample's label (1/K for a label
  nobody holds): the weights of `teacher_loss`, which the generator is
  trained against. The label picks the weights, so this is the ensemble
  of a sample whose label is known (a generated feature's, or a labeled
  image's true label), not a predictor for unlabeled data.

  Args:
    teacher_logits: [K, B, C] the teachers' logits.
    labels: [B] int labels.
    label_counts: [K, C] per-teacher label counts n_{k,y}.
  """
  alpha = _weights_per_sample(labels, label_counts)
  return tf.einsum('kb,kbc->bc', alpha, tf.cast(teacher_logits, tf.float32))


class GeneratorStepResult(NamedTuple):
  """One server generator step's outputs (scalars float32).

  Attributes:
    optimizer_state: The generator optimiser's new state.
    loss: teacher_weight * teacher_loss + diversity_weight * diversity.
    teacher_loss: `teacher_loss` before the update.
    diversity: `diversity_loss` before the update.
    teacher_accuracy: Accuracy of the weighted-logit ensemble on the labels
      the features were generated for.
  """

  optimizer_state: object
  loss: tf.Tensor
  teacher_loss: tf.Tensor
  diversity: tf.Tensor
  teacher_accuracy: tf.Tensor


@tf.autograph.experimental.do_not_convert
def generator_step(generator: tf.keras.Model,
                   heads_fn: HeadsFn,
                   label_counts: tf.Tensor,
                   optimizer: tff.learning.optimizers.Optimizer,
                   optimizer_state,
                   *,
                   seed,
                   hparams: 'hparams_lib.FedGenHparams',
                   label_probs: tf.Tensor | None = None,
                   diversity_metric: str = 'l1') -> GeneratorStepResult:
  """One FedGen server step on the generator's trainable variables.

  Args:
    generator: `[noise, labels] -> features` (e.g.
      `build_feature_generator`); trained in training mode (BatchNorm).
    heads_fn: features [B, d] -> [K, B, C] logits of the frozen client heads.
    label_counts: [K, C] counts of this round's clients.
    optimizer: A `tff.learning.optimizers` optimizer (reference: Adam 3e-4
      on MNIST, 1e-4 in the paper's Table 8).
    optimizer_state: Its state over `generator.trainable_weights`.
    seed: int or shape-[2] stateless seed; vary it per step.
    hparams: `config.fedgen`: `generator_batch_size` samples per step
      (reference 128), `noise_dim`, `noise` ('gaussian', the paper, or
      'uniform', the reference code), the loss weights `teacher_weight`
      and `diversity_weight` (the reference's ensemble_alpha and
      ensemble_eta, 1 each) and `ensemble` (`teacher_loss`'s form).
    label_probs: [C] weights of the labels to draw; default uniform over
      `data_free.qualified_labels(label_counts)` (the reference).
    diversity_metric: `diversity_loss` metric.

  Returns:
    A `GeneratorStepResult`.
  """
  batch_size, noise_dim = hparams.generator_batch_size, hparams.noise_dim
  seeds = tf.random.experimental.stateless_split(
      generators._as_seed(seed), 2)  # pylint: disable=protected-access
  if label_probs is None:
    label_probs = tf.cast(data_free.qualified_labels(label_counts), tf.float32)
  labels = data_free.sample_labels(label_probs, batch_size, seeds[0])
  eps = generators.sample_noise([batch_size, noise_dim], hparams.noise,
                                seeds[1])
  variables = generator.trainable_weights
  with tf.GradientTape() as tape:
    features = generator([eps, labels], training=True)
    logits = tf.cast(heads_fn(features), tf.float32)
    t_loss = teacher_loss(logits, labels, label_counts,
                          ensemble=hparams.ensemble)
    diversity = data_free.diversity_loss(eps, features, metric=diversity_metric)
    loss = (hparams.teacher_weight * t_loss +
            hparams.diversity_weight * diversity)
  grads = tape.gradient(loss, variables)
  optimizer_state, updated = optimizer.next(
      optimizer_state, tuple(variables), tuple(grads))
  for variable, value in zip(variables, updated):
    variable.assign(value)
  mixed = label_weighted_ensemble(logits, labels, label_counts)
  accuracy = tf.reduce_mean(tf.cast(
      tf.equal(tf.argmax(mixed, axis=-1, output_type=tf.int32), labels),
      tf.float32))
  return GeneratorStepResult(optimizer_state, loss, t_loss, diversity,
                             accuracy)


class GeneratorTrainingResult(NamedTuple):
  """Means over the steps of one `train_generator` call (float32 scalars).

  Attributes:
    optimizer_state: The generator optimiser's state after the last step.
    loss: Mean total loss.
    teacher_loss: Mean `teacher_loss`.
    diversity: Mean `diversity_loss`.
    teacher_accuracy: Mean ensemble accuracy on the generated features.
  """

  optimizer_state: object
  loss: tf.Tensor
  teacher_loss: tf.Tensor
  diversity: tf.Tensor
  teacher_accuracy: tf.Tensor


def train_generator(generator: tf.keras.Model,
                    heads_fn: HeadsFn,
                    label_counts: tf.Tensor,
                    optimizer: tff.learning.optimizers.Optimizer,
                    optimizer_state,
                    *,
                    seed,
                    hparams: 'hparams_lib.FedGenHparams',
                    **step_kwargs) -> GeneratorTrainingResult:
  """FedGen's server round: `generator_steps` `generator_step`s (ref.: 50).

  Step i draws its labels and noise from `fold_in(seed, i)`, so a round is
  reproducible from (seed, round) and eager and graph runs agree.

  Args:
    generator: As in `generator_step` (its variables change).
    heads_fn: As in `generator_step`.
    label_counts: [K, C] counts of this round's clients.
    optimizer: Generator optimiser (reference: Adam, 3e-4 on MNIST).
    optimizer_state: Its state (carried across rounds by the caller).
    seed: int or shape-[2] stateless seed of the round.
    hparams: `config.fedgen`: `generator_steps` (>= 1) and the steps'
      settings (`generator_step`).
    **step_kwargs: `generator_step`'s other keyword options (label_probs,
      diversity_metric).

  Returns:
    A `GeneratorTrainingResult`.

  Raises:
    ValueError: generator_steps < 1.
  """
  steps = hparams.generator_steps
  if not isinstance(steps, int) or steps < 1:
    raise ValueError(f'generator steps must be an integer >= 1, got {steps!r}')
  return _train_generator(generator, heads_fn, label_counts, optimizer,
                          optimizer_state, steps,
                          generators._as_seed(seed),  # pylint: disable=protected-access
                          dict(step_kwargs, hparams=hparams))


@tf.function(autograph=False)
def _train_generator(generator, heads_fn, label_counts, optimizer,
                     optimizer_state, steps, seed, step_kwargs):

  def step(carry, i):
    state, sums = carry
    r = generator_step(
        generator, heads_fn, label_counts, optimizer, state,
        seed=tf.random.experimental.stateless_fold_in(seed, i), **step_kwargs)
    return r.optimizer_state, sums + tf.stack(
        [r.loss, r.teacher_loss, r.diversity, r.teacher_accuracy])

  state, sums = loops.fold_range(
      steps, step,
      (tf.nest.map_structure(tf.convert_to_tensor, optimizer_state),
       tf.zeros([4])))
  means = tf.unstack(sums / float(steps))
  return GeneratorTrainingResult(state, *means)


@tf.autograph.experimental.do_not_convert
def decayed_coefficient(initial: float, round_num, *, decay: float = 0.98,
                        floor: float = 1e-4) -> tf.Tensor:
  """The reference's per-round decay max(floor, initial * decay^round)."""
  value = initial * tf.pow(decay, tf.cast(round_num, tf.float32))
  return tf.maximum(tf.cast(floor, tf.float32), value)


class LocalLoss(NamedTuple):
  """Terms of `regularized_local_loss` (scalars float32, weights applied)."""

  total: tf.Tensor
  ce: tf.Tensor
  teacher: tf.Tensor
  latent: tf.Tensor


class Coefficients(NamedTuple):
  """This round's weights of the local objective's generator terms.

  Attributes:
    alpha: Weight of the generated-feature CE (reference: max(1e-4,
      10 * 0.98^t) * B'/B).
    beta: Weight of the latent KL term (reference: max(1e-4, 10 * 0.98^t);
      the paper: 0). A Python 0 keeps the term out of the graph.
  """

  alpha: float | tf.Tensor
  beta: float | tf.Tensor = 0.0


class _Draws(NamedTuple):
  """One client step's random draws for its regulariser.

  Attributes:
    sampled: [B'] int32 labels y_hat of the generated features.
    eps: [B', noise_dim] their noise.
    eps_y: [B, noise_dim] the noise of the real batch's latent targets, or
      None without the latent term.
  """

  sampled: tf.Tensor
  eps: tf.Tensor
  eps_y: tf.Tensor | None


def _local_draws(seed, label_probs: tf.Tensor, batch_size,
                 hparams: 'hparams_lib.FedGenHparams',
                 latent: bool) -> _Draws:
  """The draws of one client step from its stateless `seed` (split in 3)."""
  noise_dim, noise = hparams.noise_dim, hparams.noise
  seeds = tf.random.experimental.stateless_split(
      generators._as_seed(seed), 3)  # pylint: disable=protected-access
  sampled = data_free.sample_labels(label_probs,
                                    hparams.local_gen_batch_size, seeds[0])
  eps = generators.sample_noise([hparams.local_gen_batch_size, noise_dim],
                                noise, seeds[1])
  eps_y = (generators.sample_noise([batch_size, noise_dim], noise, seeds[2])
           if latent else None)
  return _Draws(sampled, eps, eps_y)


def _has_latent(beta) -> bool:
  """False for a Python 0 beta, which keeps the latent term out of the
  graph."""
  return not (isinstance(beta, (int, float)) and beta == 0)


@tf.autograph.experimental.do_not_convert
def regularized_local_loss(classifier: classifiers.Classifier,
                           generator: tf.keras.Model,
                           batch: dict,
                           *,
                           label_probs: tf.Tensor,
                           seed,
                           coefficients: Coefficients,
                           hparams: 'hparams_lib.FedGenHparams',
                           training: bool = True,
                           logits: tf.Tensor | None = None) -> LocalLoss:
  """FedGen's client objective J_k on one batch (see module docstring).

  Call inside a `tf.GradientTape`; gradients flow into the classifier only
  (the generator runs in inference mode and its outputs are constants).

  Args:
    classifier: The client's `Classifier` (the head consumes G's features).
    generator: The broadcast generator `[noise, labels] -> features`.
    batch: `{'x': real images [B, ...], 'y': real int labels [B]}`.
    label_probs: [C] weights of the sampled labels y_hat (reference: uniform
      over every label of the federation; the paper: p_hat(y)).
    seed: int or shape-[2] stateless seed; vary it per step.
    coefficients: The terms' `Coefficients`.
    hparams: `config.fedgen`: `noise_dim`, `noise` ('gaussian', the paper,
      or 'uniform', the reference code) and `local_gen_batch_size` B'.
    training: Classifier mode.
    logits: The classifier's logits on `x` if already computed (e.g. by
      `local_training.train_locally`, which passes them to its
      regulariser); otherwise computed here.

  Returns:
    A `LocalLoss` (each term already multiplied by its weight).
  """
  x, y = batch['x'], batch['y']
  alpha, beta = coefficients
  y = tf.cast(y, tf.int32)
  draws = _local_draws(seed, label_probs, tf.shape(y)[0], hparams,
                       _has_latent(beta))
  if logits is None:
    logits = classifier.model(x, training=training)
  ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=y, logits=logits))

  gen_features = tf.stop_gradient(
      generator([draws.eps, draws.sampled], training=False))
  gen_logits = classifier.head(gen_features, training=training)
  teacher = alpha * tf.reduce_mean(
      tf.nn.sparse_softmax_cross_entropy_with_logits(labels=draws.sampled,
                                                     logits=gen_logits))

  if draws.eps_y is None:
    latent = tf.constant(0.0)
  else:
    z_y = tf.stop_gradient(generator([draws.eps_y, y], training=False))
    target = tf.stop_gradient(tf.nn.softmax(
        classifier.head(z_y, training=training)))
    latent = beta * distillation.kd_loss(logits, target, 1.0)
  return LocalLoss(ce + teacher + latent, ce, teacher, latent)


@tf.autograph.experimental.do_not_convert
def fused_regularizer(heads_fn: Callable[[tf.Tensor], tf.Tensor],
                      generator: tf.keras.Model,
                      logits: tf.Tensor,
                      labels: tf.Tensor,
                      mask: tf.Tensor,
                      *,
                      label_probs: tf.Tensor,
                      seeds: tf.Tensor,
                      coefficients: Coefficients,
                      hparams: 'hparams_lib.FedGenHparams') -> tf.Tensor:
  """`regularized_local_loss`'s generator terms for G clients in lockstep.

  Client g's row is what `regularized_local_loss` gives its batch (the
  real examples of `labels[g]`, `mask[g]`), with its own seed, labels to
  draw and coefficients, and its own head: the same draws (each client
  draws its noise for its real examples only), the generator run once on
  every client's samples (inference mode, so each sample's features are
  its own), the latent KL averaged over the client's real examples.

  Args:
    heads_fn: [G, N, d] features -> [G, N, C] logits, client g's head on
      row g.
    generator: The broadcast generator, loaded.
    logits: [G, B, C] the clients' training-mode logits on their batches.
    labels: [G, B] int32 labels.
    mask: [G, B] float32, 1 for a real example (real ones first).
    label_probs: [G, C] each client's weights of the labels to draw.
    seeds: [G, 2] int64, each client's seed of this step.
    coefficients: `Coefficients` whose alpha (and beta, unless a Python 0)
      are [G].
    hparams: As in `regularized_local_loss`.

  Returns:
    [G] float32: each client's teacher + latent term, weights applied.
  """
  alpha, beta = coefficients
  latent = _has_latent(beta)
  g = int(labels.shape[0])
  batch = tf.shape(labels)[1]
  count = tf.reduce_sum(mask, axis=1)
  noise_dim = hparams.noise_dim

  def draw(args):
    probs, seed, n = args
    d = _local_draws(seed, probs, n, hparams, latent)
    if not latent:
      return d.sampled, d.eps
    return d.sampled, d.eps, tf.pad(
        d.eps_y, [[0, batch - tf.shape(d.eps_y)[0]], [0, 0]])

  drawn = tf.map_fn(
      draw, (label_probs, seeds, tf.cast(count, tf.int32)),
      fn_output_signature=(tf.int32, tf.float32) + (
          (tf.float32,) if latent else ()))
  sampled, eps = drawn[:2]
  gen_batch = hparams.local_gen_batch_size
  noise_in = [tf.reshape(eps, [-1, noise_dim])]
  labels_in = [tf.reshape(sampled, [-1])]
  if latent:
    noise_in.append(tf.reshape(drawn[2], [-1, noise_dim]))
    labels_in.append(tf.reshape(tf.cast(labels, tf.int32), [-1]))
  features = tf.stop_gradient(generator(
      [tf.concat(noise_in, 0), tf.concat(labels_in, 0)], training=False))
  # Client-major within each part: [G * B'] generated, then [G * B] latent.
  d = features.shape[-1]
  head_logits = heads_fn(tf.reshape(features[:g * gen_batch],
                                    [g, gen_batch, d]))
  teacher = alpha * tf.reduce_mean(
      tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=sampled, logits=head_logits), axis=1)
  if not latent:
    return teacher
  latent_logits = heads_fn(tf.reshape(features[g * gen_batch:],
                                      [g, batch, d]))
  target = tf.stop_gradient(tf.nn.softmax(latent_logits))
  kl = distillation.kl_per_example(logits, target, 1.0)
  return teacher + beta * tf.math.divide_no_nan(
      tf.reduce_sum(mask * kl, axis=1), count)
