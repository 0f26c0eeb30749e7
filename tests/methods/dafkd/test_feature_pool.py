"""DaFKD's appendix A (Fig. 7): a generator of features, pinned exactly.

With `dafkd.generator='feature'` the generator makes features of the
classifier's extractor instead of images. What is pinned:

* the server round against numpy: each teacher's logits are its head
  (W_k f + b_k) on the generated features, its score the sigmoid of its
  discriminator head, eq. (7) and eq. (8) give the target; only the
  averaged classifier's head is distilled (the extractor stays the average
  to the last bit), and the labeled accuracy it reports is the whole
  classifier's on the real images, in inference mode (the mode and feature
  space the head is trained in);
* a client step: eq. (2)'s negatives are scored by the discriminator's
  head on g(z, y) (not through the extractor), and the generator's loss is
  eq. (3) plus the auxiliary cross-entropy of the classifier's head;
* one TFF round of the process with the feature generator.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import models
from tff_kd.core import distill_hparams
from tff_kd.core import distillation
from tff_kd.core import local_training
from tff_kd.methods.dafkd import dafkd_tf
from tff_kd.methods.dafkd import diagnostics as dafkd_diagnostics
from tff_kd.methods.dafkd import gan
from tff_kd.models import generators
from tests.methods.dafkd import server_case as server_case_lib

NOISE = 8
SHAPE = (8, 8, 1)
CLASSES = 10
POOL = 32
T = 2.0


def _sigmoid(z):
  return 1.0 / (1.0 + np.exp(-z))


def _softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _feature_generator(clf, seed=1):
  return generators.build_feature_generator(
      noise_dim=NOISE, num_classes=CLASSES, feature_dim=clf.feature_dim,
      hidden=16, output_activation='relu', seed=seed)


@pytest.fixture(scope='module')
def server_case():
  """Models, broadcast weights, two clients' uploads and labeled images."""
  clf = models.build_classifier('cnn', input_shape=SHAPE,
                                num_classes=CLASSES, seed=0)
  disc = generators.build_discriminator_head(clf, seed=2)
  gen = _feature_generator(clf)
  (clf_w, gen_w), uploads = server_case_lib.two_clients(
      gan.GanModels(clf, disc, gen), 0.5, 1.0)
  rng = np.random.default_rng(4)
  validation = dafkd_diagnostics.Validation(
      tf.constant(rng.uniform(-1, 1, (40, *SHAPE)), tf.float32),
      tf.constant(rng.integers(0, CLASSES, 40), tf.int32),
      tf.constant(rng.integers(0, 5, (2, CLASSES)), tf.float32), 0.05)
  return gan.GanModels(clf, disc, gen), (clf_w, gen_w), uploads, validation


def _settings(steps=6):
  return dafkd_tf.ServerSettings(
      gan.GanSettings(NOISE, CLASSES, feature_space=True),
      distill_hparams.DistillConfig.plain(steps=steps, batch_size=8, seed=5,
                                       temperature=T),
      POOL, pool_from_broadcast=True)


def _server_round(case, settings, twin_student=False):
  """`server_round` with DaFKD's diagnostics hook on the labeled images."""
  models_, weights, uploads, validation = case
  optimizer = tff.learning.optimizers.build_sgdm(0.5)
  return dafkd_tf.server_round(
      models_, optimizer, weights, uploads, settings,
      dafkd_tf.pool_seed(0, tf.constant(3)),
      labeled=(validation.x, validation.y),
      diagnostics=dafkd_diagnostics.RoundDiagnostics(
          settings, optimizer, validation, twin_student=twin_student))


def test_server_round_distils_the_head_on_generated_features(server_case):
  models_, (clf_w, gen_w), uploads, validation = server_case
  clf, _, gen = models_
  r = _server_round(server_case, _settings())
  # The pool, by hand: features from the broadcast generator.
  tf.nest.map_structure(lambda v, t: v.assign(t),
                        local_training.model_weights(gen), gen_w)
  feats, labels = dafkd_tf.pseudo_pool(
      gen, POOL, noise_dim=NOISE, num_classes=CLASSES,
      seed=dafkd_tf.pool_seed(0, tf.constant(3)), with_labels=True)
  f = feats.numpy()
  assert f.shape == (POOL, clf.feature_dim) and f.min() >= 0.0
  # Teachers in numpy: the last two trainable tensors are the head's
  # Dense(C); the discriminator head is Dense(1).
  kernel, bias = [(clf_w.trainable[i][None] + uploads.classifier_deltas
                   .trainable[i]).numpy() for i in (-2, -1)]
  d_kernel, d_bias = [row.numpy() for row in uploads.discriminator_rows]
  logits = np.einsum('nd,kdc->knc', f, kernel) + bias[:, None, :]
  scores = _sigmoid(np.einsum('nd,kdo->kno', f, d_kernel)[..., 0]
                    + d_bias[:, None, 0])
  alpha = scores / scores.sum(0, keepdims=True)
  target = np.einsum('kn,knc->nc', alpha, _softmax(logits / T))
  np.testing.assert_allclose(r.metrics['mean_disc_score'], scores.mean(),
                             rtol=1e-5)
  np.testing.assert_allclose(r.metrics['target_entropy'], np.mean(
      -(target * np.log(target)).sum(-1)), rtol=1e-5)
  # The averaged classifier, and its head distilled by hand on (f, target).
  averaged = dafkd_tf.mean_update(clf_w, uploads.classifier_deltas,
                                  uploads.valid)
  tf.nest.map_structure(lambda v, t: v.assign(t),
                        local_training.model_weights(clf.model), averaged)
  head_before = clf.head(feats).numpy()
  np.testing.assert_allclose(
      r.metrics['label_fidelity'],
      np.mean(head_before.argmax(-1) == labels.numpy()))
  np.testing.assert_allclose(
      r.metrics['agreement_before'], np.mean(head_before.argmax(-1) ==
                                  target.argmax(-1)))
  hand = distillation.distill(
      clf.head, tff.learning.optimizers.build_sgdm(0.5), feats,
      tf.constant(target, tf.float32), _settings().distill)
  head_vars = {v.ref() for v in clf.head.weights}
  moved = 0
  for v, got, mean in zip(clf.model.trainable_weights,
                          r.classifier.trainable, averaged.trainable):
    if v.ref() in head_vars:
      np.testing.assert_allclose(got, v.numpy(), atol=1e-5)
      moved += int(np.abs(got - mean.numpy()).max() > 1e-3)
    else:  # The extractor is the average, to the last bit.
      np.testing.assert_array_equal(got, mean.numpy())
  assert moved == 2
  for got, mean in zip(r.classifier.non_trainable, averaged.non_trainable):
    np.testing.assert_array_equal(got, mean.numpy())
  np.testing.assert_allclose(r.distill.first_loss, hand.first_loss,
                             rtol=1e-5)
  # The labeled accuracies are the whole classifier's on the real images
  # in inference mode (the head's inputs are the averaged extractor's
  # inference-mode features, as the head was distilled on).
  after = tff.learning.models.ModelWeights(
      list(r.classifier.trainable), list(r.classifier.non_trainable))
  after.assign_weights_to(clf.model)
  accuracy = np.mean(clf.model(validation.x, training=False).numpy().argmax(
      -1) == validation.y.numpy())
  np.testing.assert_allclose(r.distill.labeled_accuracy_after, accuracy)
  # Diagnostics: eq. (7) on the real labeled images (through the
  # extractors) and on the generated features with their pseudo labels.
  assert 0.0 <= float(r.metrics['holder_mass']) <= 1.0
  assert 0.0 <= float(r.metrics['pool_label_mass_weighted']) <= 1.0


def test_twin_student_is_the_uniform_target_from_the_same_start(
    server_case):

  def run(twin_student, correlation=True):
    return _server_round(server_case,
                         _settings()._replace(correlation=correlation),
                         twin_student=twin_student)

  plain, with_twin = run(False), run(True)
  assert 'twin_labeled_accuracy_after' not in plain.metrics
  # The round itself is unchanged by the diagnostic.
  for a, b in zip(tf.nest.flatten(plain.classifier),
                  tf.nest.flatten(with_twin.classifier)):
    np.testing.assert_array_equal(a, b)
  # The twin's accuracy is the uniform-weight round's.
  uniform = run(False, correlation=False)
  np.testing.assert_allclose(with_twin.metrics['twin_labeled_accuracy_after'],
                             uniform.distill.labeled_accuracy_after)
  assert (float(uniform.distill.labeled_accuracy_after)
          != float(plain.distill.labeled_accuracy_after)
          or any(np.abs(a - b).max() > 1e-3 for a, b in zip(
              uniform.classifier.trainable, plain.classifier.trainable)))


def _client_case():
  clf = models.build_classifier('cnn', input_shape=SHAPE,
                                num_classes=CLASSES, norm='none', seed=0)
  disc = generators.build_discriminator_head(clf, seed=2)
  gen = _feature_generator(clf)
  rng = np.random.default_rng(7)
  batch = {'x': tf.constant(rng.uniform(-1, 1, (8, *SHAPE)), tf.float32),
           'y': tf.constant(rng.integers(0, 3, 8), tf.int32)}
  return gan.GanModels(clf, disc, gen), batch


def test_client_step_scores_generated_features_with_the_heads():
  models_, batch = _client_case()
  clf, disc, gen = models_
  settings = gan.GanSettings(NOISE, CLASSES, generator_form='non_saturating',
                             generator_labels='local', aux_weight=0.7,
                             feature_space=True)
  sgd = tff.learning.optimizers.build_sgdm(0.1)
  variables = gan.gan_variables(*models_)
  states = (gan.initial_optimizer_state(sgd, variables.joint),
            gan.initial_optimizer_state(sgd, variables.generator))
  seed = tf.constant([3, 4], tf.int64)
  seeds = tf.random.experimental.stateless_split(seed, 3)
  # Eq. (2) before the step: real images through the extractor, the
  # generated features through the head alone.
  fake, _, _ = gan.generate(gen, 8, noise_dim=NOISE, num_classes=CLASSES,
                            seed=seeds[0], training=True)
  d_real = disc.logits(batch['x']).numpy().ravel()
  d_fake = disc.head_logits(fake).numpy().ravel()
  eq2 = -np.mean(np.concatenate([np.log(_sigmoid(d_real)),
                                 np.log(1.0 - _sigmoid(d_fake))]))
  gen_before = [tf.identity(v) for v in gen.trainable_weights]
  r = gan.client_gan_step(models_, batch, gan.GanOptimizers(sgd, sgd),
                          states, settings, seed)
  np.testing.assert_allclose(r.disc_loss, eq2, rtol=1e-5)
  # Eq. (3) + aux with the updated heads and the generator before its step.
  for v, b in zip(gen.trainable_weights, gen_before):
    assert np.abs(v.numpy() - b.numpy()).max() > 0  # it was trained
    v.assign(b)
  labels = tf.gather(batch['y'], tf.random.stateless_uniform(
      [8], tf.random.experimental.stateless_split(seeds[1], 2)[1], 0, 8,
      tf.int32))
  feats, _, _ = gan.generate(gen, 8, noise_dim=NOISE, num_classes=CLASSES,
                             seed=seeds[1], labels=labels, training=True)
  d_gen = disc.head_logits(feats).numpy().ravel()
  probs = _softmax(clf.head(feats).numpy())
  expected = (-np.mean(np.log(_sigmoid(d_gen))) - 0.7 * np.mean(
      np.log(probs[np.arange(8), labels.numpy()])))
  np.testing.assert_allclose(r.gen_loss, expected, rtol=1e-5)


@pytest.mark.parametrize('detach', [True, False])
def test_detach_extractor_keeps_eq2_out_of_the_extractor(detach):
  models_, batch = _client_case()
  clf, disc, _ = models_
  settings = gan.GanSettings(NOISE, CLASSES, feature_space=True,
                             detach_extractor=detach)
  sgd = tff.learning.optimizers.build_sgdm(0.1)
  variables = gan.gan_variables(*models_)
  states = (gan.initial_optimizer_state(sgd, variables.joint),
            gan.initial_optimizer_state(sgd, variables.generator))
  extractor = clf.features.trainable_weights
  with tf.GradientTape() as tape:
    ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=batch['y'], logits=clf.model(batch['x'], training=True)))
  # Plain SGD: the cross-entropy's step alone.
  expected = [v - 0.1 * g for v, g in zip(extractor,
                                          tape.gradient(ce, extractor))]
  head_before = [tf.identity(v) for v in disc.head_variables]
  gan.client_gan_step(models_, batch, gan.GanOptimizers(sgd, sgd), states,
                      settings, tf.constant([3, 4], tf.int64))
  gap = max(float(np.abs(v.numpy() - e.numpy()).max())
            for v, e in zip(extractor, expected))
  if detach:
    assert gap < 1e-6
  else:  # Eq. (2)'s real term moves the extractor too.
    assert gap > 1e-4
  assert all(np.abs(v.numpy() - b.numpy()).max() > 0
             for v, b in zip(disc.head_variables, head_before))
