"""Golden numbers and behaviour of DaFKD's GAN pieces (`dafkd.gan`)."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import distillation
from tff_kd.methods.dafkd import gan
from tff_kd.models import classifiers
from tff_kd.models import generators

_D_REAL = np.array([0.9, 0.6, 0.3], np.float32)
_D_FAKE = np.array([0.2, 0.7], np.float32)


def _logit(p):
  return np.log(p / (1.0 - p))


def _np_softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_discriminator_loss_is_eq2_over_the_union():
  # -1/(3 + 2) [log .9 + log .6 + log .3 + log .8 + log .3], pinned by hand.
  expected = -(np.log(_D_REAL).sum() + np.log(1 - _D_FAKE).sum()) / 5
  assert expected == pytest.approx(0.6494550598779798)
  got = gan.discriminator_loss(_D_REAL, _D_FAKE[:, None])
  assert float(got) == pytest.approx(expected, rel=1e-6)
  got_logits = gan.discriminator_loss(_logit(_D_REAL), _logit(_D_FAKE),
                                      from_logits=True)
  assert float(got_logits) == pytest.approx(expected, rel=1e-5)
  # Saturated outputs stay finite.
  assert np.isfinite(float(gan.discriminator_loss([0.0], [1.0])))


def test_generator_loss_forms_eq3():
  minimax = float(gan.generator_loss(_D_FAKE))
  assert minimax == pytest.approx(np.log(1 - _D_FAKE).mean(), rel=1e-6)
  assert minimax == pytest.approx(-0.7135581778200728, rel=1e-6)
  ns = float(gan.generator_loss(_D_FAKE, form='non_saturating'))
  assert ns == pytest.approx(0.9830564281864164, rel=1e-6)
  assert float(gan.generator_loss(_logit(_D_FAKE), form='non_saturating',
                                  from_logits=True)) == pytest.approx(
                                      ns, rel=1e-5)
  with pytest.raises(ValueError, match='form'):
    gan.generator_loss(_D_FAKE, form='wasserstein')


def test_joint_loss_eq9():
  logits = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 1.0], [0.0, 3.0, 0.0]],
                    np.float32)
  labels = np.array([0, 2, 1])
  ce = -np.mean(np.log(_np_softmax(logits)[np.arange(3), labels]))
  adv = -(np.log(_D_REAL).sum() + np.log(1 - _D_FAKE).sum()) / 5
  got = gan.joint_loss(logits, labels, _D_REAL, _D_FAKE, adv_weight=0.5)
  assert float(got) == pytest.approx(ce + 0.5 * adv, rel=1e-6)


def test_correlation_weights_eq7_and_entropy():
  probs = np.array([[0.9, 0.0, 0.2], [0.3, 0.0, 0.2]], np.float32)
  alpha = gan.correlation_weights(probs).numpy()
  np.testing.assert_allclose(alpha, [[0.75, 0.5, 0.5], [0.25, 0.5, 0.5]],
                             rtol=1e-6)
  np.testing.assert_allclose(alpha.sum(0), 1.0, rtol=1e-6)
  # Entropy: samples (1, 0) and (.5, .5): mean(0, log 2) = log(2) / 2.
  ent = distillation.mean_entropy(
      np.array([[1.0, 0.5], [0.0, 0.5]], np.float32), axis=0)
  assert float(ent) == pytest.approx(0.34657359027997264, rel=1e-6)
  ent_alpha = -np.mean(np.sum(alpha * np.log(alpha), 0))
  assert float(distillation.mean_entropy(alpha, axis=0)) == pytest.approx(
      ent_alpha, rel=1e-6)


def test_gradient_penalty_matches_numpy():
  real = np.array([[1.0, 2.0], [0.0, -1.0], [3.0, 1.0]], np.float32)
  fake = np.array([[0.0, 0.0], [2.0, 2.0], [-1.0, 1.0]], np.float32)
  seed = [4, 2]
  # A linear critic with a unit-norm weight has gradient norm 1 everywhere.
  unit = tf.constant([[0.6], [0.8]])
  assert float(gan.gradient_penalty(lambda x: x @ unit, real, fake,
                                    seed)) == pytest.approx(0.0, abs=1e-6)
  assert float(gan.gradient_penalty(lambda x: x @ (2.0 * unit), real, fake,
                                    seed)) == pytest.approx(1.0, rel=1e-5)
  # f(x) = sum x^2: grad 2 x_tilde at x_tilde = e real + (1 - e) fake.
  e = generators.sample_noise([3, 1], 'uniform', seed).numpy()
  x_tilde = e * real + (1 - e) * fake
  expected = np.mean((np.linalg.norm(2 * x_tilde, axis=1) - 1.0)**2)
  got = gan.gradient_penalty(lambda x: tf.reduce_sum(x * x, 1), real, fake,
                             seed)
  assert float(got) == pytest.approx(expected, rel=1e-5)


def test_private_teacher_equals_weighted_ensemble():
  rng = np.random.default_rng(0)
  k, n, c, t = 3, 5, 4, 2.0
  logits = rng.normal(size=(k, n, c)).astype(np.float32) * 3
  f = rng.uniform(size=(k, n)).astype(np.float32)
  f[:, 4] = 0.0  # Every discriminator rejects sample 4.
  sum_fs, sum_f = 0.0, 0.0
  for i in range(k):
    fs_i, f_i = gan.private_teacher_terms(f[i][:, None], logits[i], t)
    sum_fs += fs_i
    sum_f += f_i
  plain = distillation.weighted_ensemble(
      logits, gan.correlation_weights(f), temperature=t, ensemble='probs')
  mean_probs = tf.reduce_mean(tf.nn.softmax(logits / t), axis=0)
  got = gan.private_teacher(sum_fs, sum_f, fallback=mean_probs)
  np.testing.assert_allclose(got, plain, atol=1e-6)
  # Without a fallback the all-zero sample gets the uniform distribution.
  got_uniform = gan.private_teacher(sum_fs, sum_f).numpy()
  np.testing.assert_allclose(got_uniform[:4], plain[:4], atol=1e-6)
  np.testing.assert_allclose(got_uniform[4], np.full(c, 1 / c), atol=1e-7)


_SHAPE = (8, 8, 1)
_NOISE = 4


def _images(cls: np.ndarray, seed: int) -> np.ndarray:
  """Class c: +1 on one quarter of the image (c-th), plus noise."""
  rng = np.random.default_rng(seed)
  x = rng.normal(0, 0.3, size=(len(cls), *_SHAPE)).astype(np.float32) - 0.5
  for i, c in enumerate(cls):
    r, col = divmod(int(c), 2)
    x[i, 4 * r:4 * r + 4, 4 * col:4 * col + 4] += 1.5
  return np.clip(x, -1, 1)


def _setup(shared=True, norm='batch'):
  clf = classifiers.build_classifier('cnn', input_shape=_SHAPE, num_classes=3,
                                     norm=norm, seed=0)
  disc = generators.build_discriminator_head(clf, seed=1, shared=shared)
  gen = generators.build_image_generator(
      noise_dim=_NOISE, num_classes=3, image_shape=_SHAPE, hidden=(16,),
      seed=2)
  return clf, disc, gen


def test_client_gan_step_trains_each_part_in_the_right_direction():
  clf, disc, gen = _setup()
  variables = gan.gan_variables(clf, disc, gen)
  assert len(variables.joint) == len(clf.model.trainable_weights) + 2
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=0.1)
  labels = np.arange(16) % 3
  batch = {'x': tf.constant(_images(labels, 0)), 'y': tf.constant(labels)}

  @tf.function
  def step(joint_state, gen_state, seed):
    return gan.client_gan_step(
        gan.GanModels(clf, disc, gen), batch, gan.GanOptimizers(sgd, sgd),
        (joint_state, gen_state),
        gan.GanSettings(_NOISE, 3, gp_weight=0.3,
                        generator_form='non_saturating'), seed)

  def run(joint_lr, gen_lr, steps):
    joint_state = gan.initial_optimizer_state(sgd, variables.joint, joint_lr)
    gen_state = gan.initial_optimizer_state(sgd, variables.generator, gen_lr)
    results = []
    for i in range(steps):
      r = step(joint_state, gen_state, tf.constant([i, 7]))
      joint_state, gen_state = r.joint_state, r.generator_state
      results.append(r)
    return results

  def snapshot(vs):
    return [v.numpy().copy() for v in vs]

  # Frozen generator: the discriminator and classifier improve.
  gen_before = snapshot(variables.generator)
  results = run(0.1, 0.0, 12)
  for a, b in zip(gen_before, snapshot(variables.generator)):
    np.testing.assert_array_equal(a, b)
  first, last = results[0], results[-1]
  assert float(last.disc_loss) < float(first.disc_loss) - 0.05
  assert float(last.ce_loss) < float(first.ce_loss)
  assert float(last.real_accuracy) + float(last.fake_accuracy) > 1.5
  assert all(float(r.penalty) > 0 for r in results)

  # Frozen classifier and discriminator: the generator fools it more.
  joint_before = snapshot(variables.joint)
  results = run(0.0, 0.1, 8)
  for a, b in zip(joint_before, snapshot(variables.joint)):
    np.testing.assert_array_equal(a, b)
  assert float(results[-1].gen_loss) < float(results[0].gen_loss)


def _frozen_step(clf, disc, gen, batch, seed, **kwargs):
  """One `client_gan_step` with lr 0 (nothing trainable moves)."""
  variables = gan.gan_variables(clf, disc, gen)
  adam = tff.learning.optimizers.build_adam(learning_rate=0.0)
  return gan.client_gan_step(
      gan.GanModels(clf, disc, gen), batch, gan.GanOptimizers(adam, adam),
      (gan.initial_optimizer_state(adam, variables.joint),
       gan.initial_optimizer_state(adam, variables.generator)),
      gan.GanSettings(_NOISE, 3, **kwargs), seed)


def _statistics(clf, disc):
  return gan._unique(list(clf.model.non_trainable_weights) +  # pylint: disable=protected-access
                     list(disc.model.non_trainable_weights))


@pytest.mark.parametrize('shared', [True, False])
def test_step_keeps_the_moving_statistics_of_the_real_batch(shared):
  """Regression: pseudo batches must not move BatchNorm's moving statistics.

  The pseudo batch, the generator step's batch and the penalty's
  interpolates go through the (shared) extractor; in training mode (the
  old behaviour, now 'batch_update') their moving-statistics updates
  stayed, so the inference-mode classifier normalised real images with the
  generator's statistics.
  """
  clf, disc, gen = _setup(shared=shared)
  labels = np.arange(8) % 3
  batch = {'x': tf.constant(_images(labels, 5)), 'y': tf.constant(labels)}
  statistics = _statistics(clf, disc)
  assert statistics  # BatchNorm moving means and variances.
  start = [v.numpy().copy() for v in statistics]
  # Expected: one training-mode pass of the real batch alone (lr 0: the
  # weights do not move, so the pass sees the same ones as the step).
  clf.model(batch['x'], training=True)
  if not shared:
    disc.model(batch['x'], training=True)
  expected = [v.numpy().copy() for v in statistics]

  @tf.function
  def step(mode):
    return _frozen_step(clf, disc, gen, batch, [3, 4], gp_weight=0.3,
                        discriminator_mode=mode)

  for mode in gan.DISCRIMINATOR_MODES:
    for v, s in zip(statistics, start):
      v.assign(s)
    step(mode)
    got = [v.numpy() for v in statistics]
    if mode == 'batch_update':  # The pseudo batches moved them.
      assert max(np.max(np.abs(g - e)) for g, e in zip(got, expected)) > 1e-3
    else:
      for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match='discriminator_mode'):
    step('moving')


@pytest.mark.parametrize('mode', ['inference', 'real_train', 'batch'])
def test_discriminator_inputs_are_normalised_as_configured(mode):
  """Pins eq. (2)'s inputs per `discriminator_mode`.

  'inference' (default): real and pseudo batches both in inference mode,
  the mode in which the server scores. 'real_train': the real batch in
  training mode (the classifier's pass), pseudo in inference mode: the
  BatchNorm mode alone then tells them apart. 'batch': both in training
  mode, each batch normalised by its own statistics.
  """
  clf, disc, gen = _setup()
  labels = np.arange(8) % 3
  batch = {'x': tf.constant(_images(labels, 6)), 'y': tf.constant(labels)}
  seed = tf.constant([5, 6], tf.int64)
  statistics = _statistics(clf, disc)
  start = [v.numpy().copy() for v in statistics]
  # The step's pseudo batch: generator in training mode, seeds[0].
  seeds = tf.random.experimental.stateless_split(seed, 3)
  x_fake = gan.generate(gen, 8, noise_dim=_NOISE, num_classes=3,
                        seed=seeds[0], training=True)[0]
  # The classifier's training-mode pass comes first and updates statistics.
  d_real_train = disc.logit_model(batch['x'], training=True)
  d_real = (disc.logit_model(batch['x'], training=False)
            if mode == 'inference' else d_real_train)
  d_fake = disc.logit_model(x_fake, training=mode == 'batch')
  expected = gan.discriminator_loss(d_real, d_fake, from_logits=True)
  for v, s in zip(statistics, start):
    v.assign(s)
  r = _frozen_step(clf, disc, gen, batch, seed, discriminator_mode=mode)
  assert float(r.disc_loss) == pytest.approx(float(expected), rel=1e-5)


def test_unshared_step_updates_the_classifier_with_its_ce_alone():
  """Without sharing, eq. (9)'s classifier gradient is the CE's only."""
  clf, disc, gen = _setup(shared=False, norm='none')
  variables = gan.gan_variables(clf, disc, gen)
  assert len(variables.joint) == (len(clf.model.trainable_weights) +
                                  len(disc.model.trainable_weights))
  labels = np.array([0, 1, 2, 1])
  batch = {'x': tf.constant(_images(labels, 3)), 'y': tf.constant(labels)}
  lr = 0.2
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=lr)
  with tf.GradientTape() as tape:
    ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=batch['y'], logits=clf.model(batch['x'], training=True)))
  clf_vars = clf.model.trainable_weights
  expected = [v.numpy() - lr * g.numpy()
              for v, g in zip(clf_vars, tape.gradient(ce, clf_vars))]
  disc_before = [v.numpy() for v in disc.model.trainable_weights]
  result = gan.client_gan_step(
      gan.GanModels(clf, disc, gen), batch, gan.GanOptimizers(sgd, sgd),
      (gan.initial_optimizer_state(sgd, variables.joint),
       gan.initial_optimizer_state(sgd, variables.generator)),
      gan.GanSettings(_NOISE, 3), [1, 2], train_generator=False)
  assert float(result.ce_loss) == pytest.approx(float(ce), rel=1e-6)
  assert float(result.gen_loss) == 0.0
  for v, e in zip(clf_vars, expected):
    np.testing.assert_allclose(v.numpy(), e, atol=1e-6)
  assert all(np.max(np.abs(v.numpy() - b)) > 0 for v, b in zip(
      disc.model.trainable_weights, disc_before))


def test_discriminators_of_disjoint_clients_weight_their_own_data():
  """Theorem 1 with an ideal generator: f_k -> p_k / (p_k + p)."""
  classes = {'A': np.array([0, 1]), 'B': np.array([2])}
  rng = np.random.default_rng(1)
  train = {k: rng.choice(c, 64) for k, c in classes.items()}
  test = {k: rng.choice(c, 32) for k, c in classes.items()}
  x_train = {k: _images(y, seed=i) for i, (k, y) in enumerate(train.items())}
  x_test = {k: _images(y, seed=10 + i) for i, (k, y) in enumerate(test.items())}
  # Pseudo samples from the global distribution p = (p_A + p_B) / 2.
  pool = tf.constant(np.concatenate([x_train['A'], x_train['B']]))
  adam = tff.learning.optimizers.build_adam(learning_rate=3e-3)

  def train_client(x, y):
    clf, disc, gen = _setup(norm='none')
    variables = gan.gan_variables(clf, disc, gen)
    x, y = tf.constant(x), tf.constant(y)

    @tf.function
    def fit():
      state = gan.initial_optimizer_state(adam, variables.joint)
      for step in tf.range(150):
        seed = tf.stack([step, 3])
        idx = tf.random.stateless_uniform([16], seed, 0, 64, tf.int32)
        fake_idx = tf.random.stateless_uniform(
            [16], seed + 1, 0, tf.shape(pool)[0], tf.int32)
        with tf.GradientTape() as tape:
          loss = gan.joint_loss(
              clf.model(tf.gather(x, idx)), tf.gather(y, idx),
              disc.logit_model(tf.gather(x, idx)),
              disc.logit_model(tf.gather(pool, fake_idx)), from_logits=True)
        grads = tape.gradient(loss, variables.joint)
        state, new = adam.next(state, tuple(variables.joint), tuple(grads))
        for v, n in zip(variables.joint, new):
          v.assign(n)
    fit()
    return disc

  discs = {k: train_client(x_train[k], train[k]) for k in classes}
  for k, other in (('A', 'B'), ('B', 'A')):
    scores = tf.stack([tf.reshape(discs[c].model(x_test[k]), [-1])
                       for c in (k, other)])
    alpha = gan.correlation_weights(scores).numpy()
    assert np.mean(alpha[0] > 0.5) >= 0.9, (k, alpha[0])
    assert np.mean(alpha[0]) > 0.75
    assert float(distillation.mean_entropy(alpha, axis=0)) < 0.5 * np.log(2)
    # Theorem 1: f_k(x) = p_k / (p_k + p) = 2/3 on own data, 0 on the other's.
    assert abs(float(tf.reduce_mean(scores[0])) - 2 / 3) < 0.12
    assert float(tf.reduce_mean(scores[1])) < 0.1


def test_generator_step_labels_and_auxiliary_term():
  """The conditional candidates of the generator step, golden numbers.

  'local' draws g's labels from the real batch's labels (with
  replacement, seeded); `aux_weight` adds CE(classifier(g(z, y)), y) with
  the classifier in inference mode; both leave eq. (3) itself unchanged.
  """
  clf, disc, gen = _setup()
  labels = np.array([2, 2, 2, 2, 2, 2])  # The client holds class 2 only.
  batch = {'x': tf.constant(_images(labels, 8)), 'y': tf.constant(labels)}
  seed = tf.constant([9, 1], tf.int64)
  statistics = _statistics(clf, disc)
  start = [v.numpy().copy() for v in statistics]
  # The generator step's seed is the step's second split; 'local' labels
  # come from that seed's second split, uniform ones from `generate`.
  gen_seed = tf.random.experimental.stateless_split(seed, 3)[1]
  local_seed = tf.random.experimental.stateless_split(gen_seed, 2)[1]
  local_y = tf.gather(batch['y'], tf.random.stateless_uniform(
      [6], local_seed, 0, 6, tf.int32))

  def step_and_expected(labels, aux, **kwargs):
    """(the step's generator loss, eq. 3 + aux * CE by hand, g's labels)."""
    for v, s in zip(statistics, start):
      v.assign(s)
    got = float(_frozen_step(clf, disc, gen, batch, seed,
                             generator_form='non_saturating',
                             aux_weight=aux, **kwargs).gen_loss)
    # By hand, after the step's real-batch pass moved the statistics (lr 0:
    # nothing else moved).
    x, _, y = gan.generate(gen, 6, noise_dim=_NOISE, num_classes=3,
                           seed=gen_seed, labels=labels, training=True)
    loss = gan.generator_loss(disc.logit_model(x, training=False),
                              form='non_saturating', from_logits=True)
    ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=y, logits=clf.model(x, training=False)))
    return got, float(loss + aux * ce), set(y.numpy())

  got, want, classes = step_and_expected(None, 0.0)
  assert classes != {2}  # Uniform labels: not only the client's.
  assert got == pytest.approx(want, rel=1e-5)
  for aux in (0.0, 0.7):
    got, want, classes = step_and_expected(local_y, aux,
                                           generator_labels='local')
    assert classes == {2}
    assert got == pytest.approx(want, rel=1e-5)
  with pytest.raises(ValueError, match='generator_labels'):
    step_and_expected(None, 0.0, generator_labels='global')


def test_auxiliary_term_makes_the_generator_follow_its_label():
  """With the client classifier frozen, the aux term alone trains g(., y)
  towards what that classifier calls y (label fidelity rises from chance);
  without it (eq. 3 alone) nothing ties g to y."""
  clf, disc, gen = _setup(norm='none')
  labels = np.arange(48) % 3
  x = _images(labels, 11)
  adam = tff.learning.optimizers.build_adam(learning_rate=3e-3)
  clf_state = gan.initial_optimizer_state(adam, clf.model.trainable_weights)
  for _ in range(60):  # Teach the classifier the three quarter-classes.
    with tf.GradientTape() as tape:
      ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=labels, logits=clf.model(x, training=True)))
    clf_state = gan._apply(adam, clf_state, clf.model.trainable_weights,  # pylint: disable=protected-access
                           tape.gradient(ce, clf.model.trainable_weights))
  start = [v.numpy().copy() for v in gen.trainable_weights]

  def fidelity():
    x_gen, _, y = gan.generate(gen, 300, noise_dim=_NOISE, num_classes=3,
                               seed=[3, 3])
    pred = tf.argmax(clf.model(x_gen, training=False), -1, tf.int32)
    return float(tf.reduce_mean(tf.cast(pred == y, tf.float32)))

  batch = {'x': tf.constant(x[:16]), 'y': tf.constant(labels[:16])}
  variables = gan.gan_variables(clf, disc, gen)
  zero = tff.learning.optimizers.build_sgdm(learning_rate=0.0)

  @tf.function
  def step(gen_state, i, aux):
    return gan.client_gan_step(
        gan.GanModels(clf, disc, gen), batch, gan.GanOptimizers(zero, adam),
        (gan.initial_optimizer_state(zero, variables.joint), gen_state),
        gan.GanSettings(_NOISE, 3, generator_form='non_saturating',
                        generator_labels='local', aux_weight=aux),
        tf.stack([i, tf.constant(5, tf.int64)])).generator_state

  got = {}
  for aux in (0.0, 1.0):
    for v, s in zip(gen.trainable_weights, start):
      v.assign(s)
    state = gan.initial_optimizer_state(adam, variables.generator)
    for i in range(40):
      state = step(state, tf.constant(i, tf.int64), aux)
    got[aux] = fidelity()
  assert got[1.0] >= 0.9, got
  assert got[0.0] <= 0.6, got


def test_projection_discriminator_scores_image_label_pairs():
  """f(x, y) = sigmoid(w . phi(x) + b + e_y . phi(x)); e starts at zero."""
  clf = classifiers.build_classifier('cnn', input_shape=_SHAPE, num_classes=3,
                                     norm='batch', seed=0)
  plain = generators.build_discriminator_head(clf, seed=1)
  proj = generators.build_discriminator_head(clf, seed=1, num_classes=3)
  assert proj.conditional and not plain.conditional
  assert len(proj.head_variables) == 3  # Kernel, bias, label embedding.
  labels = np.array([0, 1, 2, 2])
  x = tf.constant(_images(labels, 4))
  np.testing.assert_allclose(gan.discriminator_scores(proj, x, labels),
                             gan.discriminator_scores(plain, x), rtol=1e-6)
  embedding = np.random.default_rng(0).normal(
      size=(3, clf.feature_dim)).astype(np.float32)
  by_name = {v.name.split('/')[-1].split(':')[0]: v
             for v in proj.head_variables}
  by_name['embeddings'].assign(embedding)
  phi = clf.features(x, training=False).numpy()
  w, b = by_name['kernel'].numpy(), by_name['bias'].numpy()
  logit = phi @ w[:, 0] + b[0] + np.sum(embedding[labels] * phi, axis=1)
  np.testing.assert_allclose(gan.discriminator_scores(proj, x, labels),
                             1 / (1 + np.exp(-logit)), rtol=1e-5)
  np.testing.assert_allclose(proj.logits(x, labels)[:, 0], logit, rtol=1e-5)
  with pytest.raises(ValueError, match='labels'):
    proj.logits(x)


@pytest.mark.parametrize('shared', [True, False])
@pytest.mark.parametrize('num_classes', [0, 3])
def test_teacher_outputs_equal_the_two_separate_passes(shared, num_classes):
  """One extractor pass feeding both heads gives the separate passes' numbers
  (batches of 4 over 10 images: a short last batch too)."""
  clf = classifiers.build_classifier('cnn', input_shape=_SHAPE, num_classes=3,
                                     norm='batch', seed=0)
  disc = generators.build_discriminator_head(clf, seed=1, shared=shared,
                                             num_classes=num_classes)
  if num_classes:
    embedding = np.random.default_rng(0).normal(
        size=(3, clf.feature_dim)).astype(np.float32)
    [v for v in disc.head_variables if 'embeddings' in v.name][0].assign(
        embedding)
  labels = np.array([0, 1, 2, 2, 1, 0, 0, 1, 2, 1])
  x = tf.constant(_images(labels, 10))
  y = tf.constant(labels, tf.int32) if num_classes else None
  logits, scores = tf.function(gan.teacher_outputs)(clf, disc, x, y, 4)
  np.testing.assert_array_equal(
      logits, distillation.teacher_logits([clf.model], x, 4)[0])
  np.testing.assert_array_equal(
      scores, gan.discriminator_scores(disc, x, y, 4))
  assert logits.shape == (10, 3) and scores.shape == (10,)
