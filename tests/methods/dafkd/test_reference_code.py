"""The switches of DaFKD's `reference` preset: what the authors' code does.

haozhaowang/DaFKD2023 (39a536c) differs from the paper (Wang et al., CVPR
2023) in ways `dafkd.variant=reference` reproduces (studies/parity runs
that code beside ours). Each switch is pinned against an eager replay or
numpy:

* `gp_norm='pixel'`: the gradient penalty over each pixel's channels
  (`gradients.norm(2, dim=1)` of an NCHW gradient), golden numbers;
* `gan_epochs`, `disc_rounds`, `generator_rounds`: eq. 2 only in the first
  epochs of the first rounds, the generator step in those of the first
  (other) rounds; outside them the head and the generator do not move;
* `gan_passes='every_step'` with 'batch_update': a step whose GAN terms are
  off still runs their forward passes, which move the BatchNorm
  statistics, and trains the classifier exactly as a plain step does;
* `server_batchnorm='batch'`: the pool is drawn and scored a batch at a
  time with batch statistics, and the scoring leaves the moving statistics
  as they were;
* `first_distill_round`: before it the round's classifier is the average;
* the diagnostics score the labeled images as the server scores its pool.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import models
from tff_kd.core import distill_hparams
from tff_kd.core import local_training
from tff_kd.methods.dafkd import dafkd_tf as dafkd
from tff_kd.methods.dafkd import diagnostics as dafkd_diagnostics
from tff_kd.methods.dafkd import gan
from tff_kd.models import classifiers
from tff_kd.models import generators
from tests.methods.dafkd import server_case as server_case_lib

SHAPE = (8, 8, 1)
CLASSES = 3
NOISE = 4
LR = 0.05


def test_pixel_gradient_penalty_golden_numbers():
  # disc_fn(x) = sum(w * x): the gradient at any x is w, per sample.
  w = tf.constant(np.arange(1, 9, dtype=np.float32).reshape(1, 2, 2, 2) / 4)
  real = tf.zeros([3, 2, 2, 2])
  fake = tf.ones([3, 2, 2, 2])
  disc_fn = lambda x: tf.reduce_sum(w * x, axis=[1, 2, 3])
  pixel = gan.gradient_penalty(disc_fn, real, fake, 0, norm='pixel')
  image = gan.gradient_penalty(disc_fn, real, fake, 0, norm='image')
  per_pixel = np.sqrt((w.numpy()[0] ** 2).sum(-1))  # [2, 2]
  np.testing.assert_allclose(pixel, ((per_pixel - 1) ** 2).mean(), rtol=1e-5)
  np.testing.assert_allclose(
      image, (np.sqrt((w.numpy() ** 2).sum()) - 1) ** 2, rtol=1e-5)
  with pytest.raises(ValueError, match='norm'):
    gan.gradient_penalty(disc_fn, real, fake, 0, norm='channel')


def _models():
  classifier = classifiers.build_classifier(
      'cnn', input_shape=SHAPE, num_classes=CLASSES, norm='batch', seed=0)
  discriminator = generators.build_discriminator_head(classifier, seed=2)
  generator = generators.build_dcgan_generator(
      noise_dim=NOISE, num_classes=CLASSES, image_shape=SHAPE, width=4,
      seed=1)
  return gan.GanModels(classifier, discriminator, generator)


def _epochs(epochs: int = 3) -> tf.data.Dataset:
  """Two batches of 4, repeated: `epochs` epochs of known length."""
  rng = np.random.default_rng(0)
  x = rng.uniform(-1, 1, (8, *SHAPE)).astype(np.float32)
  y = rng.integers(0, CLASSES, 8).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices({'x': x, 'y': y}).batch(
      4).repeat(epochs)


def _round(settings, round_num, models_=None, *, dataset=None, lr=LR):
  """`client_round` from the models' current weights (default: the seeded
  models; `dataset` default: `_epochs()`); (result, models)."""
  sgd = tff.learning.optimizers.build_sgdm(lr)
  models_ = models_ or _models()
  weights = tf.nest.map_structure(tf.identity, (
      local_training.model_weights(models_.classifier.model),
      local_training.model_weights(models_.generator)))
  row = [tf.identity(v) for v in dafkd.discriminator_variables(
      models_.discriminator)]
  result = dafkd.client_round(
      models_, weights, row, _epochs() if dataset is None else dataset,
      gan.GanOptimizers(sgd, sgd),
      dafkd.Round(tf.constant(lr), tf.constant(round_num)),
      tf.constant(7, tf.int64), settings)
  return result, models_


def _replay(round_num, settings):
  """The round eagerly: per step, GAN step with its switches or CE step."""
  sgd = tff.learning.optimizers.build_sgdm(LR)
  m = _models()
  variables = gan.gan_variables(*m)
  states = (gan.initial_optimizer_state(sgd, variables.joint,
                                        tf.constant(LR)),
            gan.initial_optimizer_state(sgd, variables.generator))
  for step, batch in enumerate(_epochs()):
    in_window = step < 2  # The first of 3 epochs of 2 steps.
    disc_on = in_window and round_num < settings.disc_rounds
    gen_on = in_window and round_num < settings.generator_rounds
    if disc_on or gen_on:
      r = gan.client_gan_step(
          m, batch, gan.GanOptimizers(sgd, sgd), states, settings,
          dafkd.step_seed(tf.constant(7, tf.int64), tf.constant(step)),
          disc_on=tf.constant(disc_on), train_generator=tf.constant(gen_on))
      states = (r.joint_state, r.generator_state)
    else:
      with tf.GradientTape() as tape:
        logits = m.classifier.model(batch['x'], training=True)
        ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=batch['y'], logits=logits))
      grads = tape.gradient(ce, m.classifier.model.trainable_weights)
      for v, g in zip(m.classifier.model.trainable_weights, grads):
        v.assign_sub(LR * g)
  return m


WINDOWS = gan.GanSettings(NOISE, CLASSES, gan_epochs=1, local_epochs=3,
                          disc_rounds=1, generator_rounds=2)


@pytest.mark.parametrize('round_num', [0, 1, 2])
def test_round_and_epoch_windows_match_an_eager_replay(round_num):
  result, _ = _round(WINDOWS, round_num)
  replay = _replay(round_num, WINDOWS)
  start = _models()
  for got, v, s in zip(result.classifier_delta.trainable,
                       replay.classifier.model.trainable_weights,
                       start.classifier.model.trainable_weights):
    np.testing.assert_allclose(got, v.numpy() - s.numpy(), atol=1e-5)
  head_start = dafkd.discriminator_variables(start.discriminator)
  head_moved = max(float(np.abs(a - b.numpy()).max())
                   for a, b in zip(result.discriminator, head_start))
  gen_moved = max(float(np.abs(d).max())
                  for d in result.generator_delta.trainable)
  # Eq. 2 trains the head in round 0 only, the generator steps run in
  # rounds 0 and 1; neither moves outside its rounds.
  assert (head_moved > 0) == (round_num < 1)
  assert (gen_moved > 0) == (round_num < 2)
  for got, want, s in zip(result.generator_delta.trainable,
                          replay.generator.trainable_weights,
                          start.generator.trainable_weights):
    np.testing.assert_allclose(got, want.numpy() - s.numpy(), atol=1e-5)


def test_gan_epochs_need_the_round_length():
  assert int(dafkd._epoch_window_end(_epochs(), WINDOWS)) == 2  # pylint: disable=protected-access
  unknown = _epochs().filter(lambda b: True)
  assert int(dafkd._epoch_window_end(unknown, WINDOWS)) == tf.int64.max  # pylint: disable=protected-access


def _statistics(m):
  return [v.numpy() for v in m.classifier.model.non_trainable_weights]


def test_every_step_passes_move_the_statistics_not_the_weights():
  # Round 5: every GAN term is off. 'window' trains plain CE steps;
  # 'every_step' runs the GAN's training-mode passes too.
  base = dict(gan_epochs=1, local_epochs=3, disc_rounds=1,
              generator_rounds=2, discriminator_mode='batch_update')
  plain, m_plain = _round(gan.GanSettings(NOISE, CLASSES, **base), 5)
  passes, m_passes = _round(
      gan.GanSettings(NOISE, CLASSES, gan_passes='every_step', **base), 5)
  for a, b in zip(plain.classifier_delta.trainable,
                  passes.classifier_delta.trainable):
    np.testing.assert_allclose(a, b, atol=1e-6)
  moved = max(float(np.abs(a - b).max()) for a, b in zip(
      _statistics(m_plain), _statistics(m_passes)))
  assert moved > 1e-3
  for d in passes.generator_delta.trainable:
    assert float(np.abs(d).max()) == 0.0
  assert float(tf.reduce_sum(passes.means)) == 0.0  # No GAN step counted.


def _server_models():
  clf = models.build_classifier('cnn', input_shape=SHAPE, num_classes=10,
                                seed=0)
  disc = generators.build_discriminator_head(clf, seed=2)
  gen = generators.build_dcgan_generator(
      noise_dim=NOISE, num_classes=10, image_shape=SHAPE, width=4, seed=1)
  return gan.GanModels(clf, disc, gen)


def test_batch_statistics_pool_and_scores():
  m = _server_models()
  seed = dafkd.pool_seed(0, tf.constant(3))
  pool, labels = dafkd.pseudo_pool(m.generator, 16, noise_dim=NOISE,
                                   num_classes=10, seed=seed,
                                   with_labels=True, batch_statistics=8)
  _, z, y = gan.generate(m.generator, 16, noise_dim=NOISE, num_classes=10,
                         seed=seed)
  np.testing.assert_array_equal(labels, y)
  for i in (0, 8):
    np.testing.assert_allclose(
        pool[i:i + 8], m.generator([z[i:i + 8], y[i:i + 8]], training=True),
        atol=1e-5)
  before = _statistics(m)
  logits, scores = gan.teacher_outputs(m.classifier, m.discriminator, pool,
                                       batch_size=8, batch_statistics=True)
  for a, b in zip(before, _statistics(m)):
    np.testing.assert_array_equal(a, b)
  for i in (0, 8):
    features = m.classifier.features(pool[i:i + 8], training=True)
    np.testing.assert_allclose(logits[i:i + 8], m.classifier.head(features),
                               atol=1e-5)
    np.testing.assert_allclose(
        scores[i:i + 8],
        tf.reshape(tf.sigmoid(m.discriminator.head_logits(features, None)),
                   [-1]), atol=1e-5)


@pytest.mark.parametrize('round_num,distilled', [(0, False), (1, True)])
def test_first_distill_round_keeps_the_average_before_it(round_num,
                                                         distilled):
  m = _server_models()
  weights, uploads = server_case_lib.two_clients(m, 0.5, 1.0)
  settings = dafkd.ServerSettings(
      gan.GanSettings(NOISE, 10),
      distill_hparams.DistillConfig.plain(steps=3, batch_size=8, seed=5),
      16, pool_from_broadcast=True, first_distill_round=1)
  r = dafkd.server_round(m, tff.learning.optimizers.build_sgdm(0.3), weights,
                         uploads, settings, dafkd.pool_seed(0, round_num),
                         round_num=tf.constant(round_num))
  mean = dafkd.mean_update(weights[0], uploads.classifier_deltas,
                           uploads.valid)
  same = all(np.array_equal(a, b) for a, b in zip(
      tf.nest.flatten(r.classifier), tf.nest.flatten(mean)))
  assert same != distilled
  assert float(r.distill.accepted) == float(distilled)


def test_diagnostics_score_the_labeled_images_as_the_pool():
  # With batch statistics at the server, the labeled images are scored the
  # same way, so the holder diagnostics measure the weights the pool gets.
  m = _server_models()
  weights, uploads = server_case_lib.two_clients(m, 0.5, 1.0)
  settings = dafkd.ServerSettings(
      gan.GanSettings(NOISE, 10),
      distill_hparams.DistillConfig.plain(steps=2, batch_size=8, seed=5),
      16, pool_from_broadcast=True, batch_statistics=True)
  rng = np.random.default_rng(4)
  validation = dafkd_diagnostics.Validation(
      tf.constant(rng.uniform(-1, 1, (24, *SHAPE)), tf.float32),
      tf.constant(rng.integers(0, 10, 24), tf.int32),
      tf.constant(rng.integers(0, 5, (2, 10)), tf.float32), 0.05)
  hook = dafkd_diagnostics.RoundDiagnostics(
      settings, tff.learning.optimizers.build_sgdm(0.3), validation)
  r = dafkd.server_round(m, tff.learning.optimizers.build_sgdm(0.3), weights,
                         uploads, settings, dafkd.pool_seed(0, 1),
                         labeled=(validation.x, validation.y),
                         diagnostics=hook)
  _, scores = dafkd.teacher_outputs(
      m.classifier, m.discriminator, weights[0], uploads.classifier_deltas,
      uploads.discriminator_rows, uploads.valid, validation.x,
      dafkd.Scoring(8, batch_statistics=True))
  np.testing.assert_allclose(r.metrics['disc_score_real'],
                             float(tf.reduce_mean(scores)), rtol=1e-5)
  _, inference = dafkd.teacher_outputs(
      m.classifier, m.discriminator, weights[0], uploads.classifier_deltas,
      uploads.discriminator_rows, uploads.valid, validation.x)
  assert abs(float(tf.reduce_mean(inference)) -
             float(r.metrics['disc_score_real'])) > 1e-4


def test_plateau_update_is_reduce_lr_on_plateau():
  # Last-batch losses 1, 2, 2, 2, 0.5: running means 1, 1.5, 1.67, 1.75,
  # 1.5; the best stays 1 from epoch 1, so epoch 4 is the third without
  # improvement and the rate drops to 0.2x (torch's ReduceLROnPlateau with
  # factor 0.2, patience 2, as DaFKD's code builds it).
  sgd = tff.learning.optimizers.build_sgdm(0.5)
  state = gan.initial_optimizer_state(sgd, [tf.Variable(0.0)],
                                      tf.constant(0.5))
  plateau = dafkd.Plateau.start()
  rates = []
  for loss in (1.0, 2.0, 2.0, 2.0, 0.5):
    state, plateau = dafkd.plateau_update(sgd, state, plateau,
                                          tf.constant(loss))
    rates.append(float(sgd.get_hparams(state)['learning_rate']))
  np.testing.assert_allclose(rates, [0.5, 0.5, 0.5, 0.1, 0.1], rtol=1e-6)
  assert float(plateau.best) == 1.0 and float(plateau.bad) == 1.0


def _contradictions(epochs: int) -> tf.data.Dataset:
  """Four images, each in both batches with another label: the loss has a
  floor it cannot go below."""
  x = np.random.default_rng(1).uniform(-1, 1, (4, *SHAPE)).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices(
      {'x': np.concatenate([x, x]),
       'y': np.array([0, 1, 2, 0, 1, 2, 0, 1], np.int32)}).batch(4).repeat(
           epochs)


def _sgd_epochs(classifier, epochs: int, rates) -> list[float]:
  """Eager SGD over `_contradictions(epochs)` at `rates(step)`; the
  epochs' last-batch cross-entropies."""
  last = []
  for step, batch in enumerate(_contradictions(epochs)):
    with tf.GradientTape() as tape:
      logits = classifier.model(batch['x'], training=True)
      ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=batch['y'], logits=logits))
    grads = tape.gradient(ce, classifier.model.trainable_weights)
    rate = rates(step, ce)
    for v, g in zip(classifier.model.trainable_weights, grads):
      v.assign_sub(rate * g)
  return last


def test_client_plateau_matches_an_eager_replay():
  # From a model at the loss floor (12 epochs at lr 2 first), round 2's
  # plain cross-entropy steps stall, and their rate follows
  # `plateau_update` at every epoch's last step (two batches an epoch).
  epochs, lr = 8, 2.0
  settings = gan.GanSettings(NOISE, CLASSES, gan_epochs=1,
                             local_epochs=epochs, disc_rounds=1,
                             generator_rounds=1, client_plateau=True)
  start = _models()
  _sgd_epochs(start.classifier, 12, lambda step, ce: lr)
  floor = [v.numpy() for v in start.classifier.model.weights]

  def at_floor():
    m = _models()
    for v, value in zip(m.classifier.model.weights, floor):
      v.assign(value)
    return m

  result, _ = _round(settings, 2, at_floor(),
                     dataset=_contradictions(epochs), lr=lr)

  sgd = tff.learning.optimizers.build_sgdm(lr)
  replay = at_floor()
  schedule = {'state': gan.initial_optimizer_state(
      sgd, [tf.Variable(0.0)], tf.constant(lr)),
              'plateau': dafkd.Plateau.start(), 'cuts': 0}

  def rates(step, ce):
    rate = float(sgd.get_hparams(schedule['state'])['learning_rate'])
    if step % 2 == 1:  # The epoch's last step: after its update.
      schedule['state'], schedule['plateau'] = dafkd.plateau_update(
          sgd, schedule['state'], schedule['plateau'], ce)
      schedule['cuts'] += float(
          sgd.get_hparams(schedule['state'])['learning_rate']) < rate
    return rate

  _sgd_epochs(replay.classifier, epochs, rates)
  assert schedule['cuts'] >= 1
  for got, v, s in zip(result.classifier_delta.trainable,
                       replay.classifier.model.trainable_weights,
                       at_floor().classifier.model.trainable_weights):
    np.testing.assert_allclose(got, v.numpy() - s.numpy(), atol=1e-5)
