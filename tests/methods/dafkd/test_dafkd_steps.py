"""DaFKD's `gan_steps`: GAN terms only in a window of a round's local steps.

`tff_kd.methods.dafkd.dafkd_tf.client_round` with `gan_steps=1` on three
batches must
equal, eagerly, one `gan.client_gan_step` (eq. 9 then eq. 3) as the first
(`gan_window='first'`) or the last (`'last'`) step, and two plain
cross-entropy steps of the classifier that leave the generator and the
discriminator's own head untouched.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.methods.dafkd import dafkd_tf as dafkd
from tff_kd.methods.dafkd import gan
from tff_kd.core import local_training
from tff_kd.models import classifiers
from tff_kd.models import generators

SHAPE = (8, 8, 1)
CLASSES = 3
NOISE = 4
LR = 0.05


def _models():
  classifier = classifiers.build_classifier(
      'cnn', input_shape=SHAPE, num_classes=CLASSES, norm='batch', seed=0)
  discriminator = generators.build_discriminator_head(classifier, seed=2)
  generator = generators.build_image_generator(
      noise_dim=NOISE, num_classes=CLASSES, image_shape=SHAPE, hidden=(8,),
      seed=1)
  return classifier, discriminator, generator


def _batches():
  rng = np.random.default_rng(0)
  x = rng.uniform(-1, 1, (12, *SHAPE)).astype(np.float32)
  y = rng.integers(0, CLASSES, 12).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices({'x': x, 'y': y}).batch(4)


def _values(variables):
  return [v.numpy() for v in variables]


def _cross_entropy_step(clf, batch):
  with tf.GradientTape() as tape:
    logits = clf.model(batch['x'], training=True)
    ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=batch['y'], logits=logits))
  grads = tape.gradient(ce, clf.model.trainable_weights)
  for v, g in zip(clf.model.trainable_weights, grads):
    v.assign_sub(LR * g)


@pytest.mark.parametrize('window,gan_at', [('first', 0), ('last', 2)])
def test_gan_terms_only_in_their_window(window, gan_at):
  sgd = tff.learning.optimizers.build_sgdm(LR)
  settings = gan.GanSettings(NOISE, CLASSES, gan_steps=1, gan_window=window)
  seed = tf.constant(7, tf.int64)

  clf, disc, gen = _models()
  weights = (local_training.model_weights(clf.model),
             local_training.model_weights(gen))
  weights = tf.nest.map_structure(tf.identity, weights)
  row = [tf.identity(v) for v in dafkd.discriminator_variables(disc)]
  result = dafkd.client_round(
      gan.GanModels(clf, disc, gen), weights, row, _batches(),
      gan.GanOptimizers(sgd, sgd), dafkd.Round(tf.constant(LR)), seed,
      settings)

  # Eager replay on fresh copies of the same models.
  clf2, disc2, gen2 = _models()
  variables = gan.gan_variables(clf2, disc2, gen2)
  joint_state = gan.initial_optimizer_state(sgd, variables.joint,
                                            tf.constant(LR))
  gen_state = gan.initial_optimizer_state(sgd, variables.generator)
  for step, batch in enumerate(_batches()):
    if step == gan_at:
      gan.client_gan_step(
          gan.GanModels(clf2, disc2, gen2), batch,
          gan.GanOptimizers(sgd, sgd), (joint_state, gen_state),
          gan.GanSettings(NOISE, CLASSES),
          dafkd.step_seed(seed, tf.constant(step)))
    else:
      _cross_entropy_step(clf2, batch)

  start = local_training.model_weights(_models()[0].model)
  for got, v, s in zip(result.classifier_delta.trainable,
                       clf2.model.trainable_weights, start.trainable):
    np.testing.assert_allclose(got, v.numpy() - s.numpy(), atol=1e-5)
  # The generator and the head moved in the GAN step only.
  gen_start = _values(_models()[2].trainable_weights)
  for got, after, s in zip(result.generator_delta.trainable,
                           _values(gen2.trainable_weights), gen_start):
    np.testing.assert_allclose(got, after - s, atol=1e-6)
    assert np.abs(after - s).max() > 0
  for got, after in zip(result.discriminator,
                        _values(dafkd.discriminator_variables(disc2))):
    np.testing.assert_allclose(got, after, atol=1e-6)
  assert int(result.local.num_steps) == 3
