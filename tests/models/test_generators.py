"""Generators, DaFKD's discriminator head and seeded noise."""

import numpy as np
import pytest
import tensorflow as tf

from tff_kd import errors
from tff_kd.models import classifiers
from tff_kd.models import generators

_SHAPE = (8, 8, 1)


def _classifier(seed=0):
  return classifiers.build_classifier(
      'cnn', input_shape=_SHAPE, num_classes=3, seed=seed)


def _image_generator(seed=1, **kwargs):
  return generators.build_image_generator(
      noise_dim=4, num_classes=3, image_shape=_SHAPE, hidden=(16,),
      seed=seed, **kwargs)


def test_image_generator_shapes_range_and_label_formats():
  z = generators.sample_noise([5, 4], seed=3)
  y = tf.constant([0, 1, 2, 0, 1])
  gen = _image_generator()
  x = gen([z, y], training=False).numpy()
  assert x.shape == (5, 8, 8, 1)
  assert np.all(np.abs(x) <= 1.0) and np.std(x) > 0
  # The label matters: the same noise with other labels gives other images.
  x_other = gen([z, tf.constant([1, 2, 0, 1, 2])], training=False).numpy()
  assert np.max(np.abs(x - x_other)) > 1e-4
  # One-hot input with the same seed is the same network.
  gen_1h = _image_generator(label_format='one_hot')
  np.testing.assert_allclose(
      gen_1h([z, tf.one_hot(y, 3)], training=False), x, atol=1e-6)
  mult = _image_generator(combine='multiply')
  assert mult([z, y]).shape == (5, 8, 8, 1)
  with pytest.raises(errors.ConfigError, match='combine'):
    _image_generator(combine='sum')


def test_generators_are_seeded():
  def values(model):
    return [w.numpy() for w in model.weights]
  for a, b in zip(values(_image_generator(seed=7)),
                  values(_image_generator(seed=7))):
    np.testing.assert_array_equal(a, b)
  kernels_7 = values(_image_generator(seed=7))[0]
  kernels_8 = values(_image_generator(seed=8))[0]
  assert np.max(np.abs(kernels_7 - kernels_8)) > 1e-3


def test_feature_generator_shapes_and_output_activation():
  z = generators.sample_noise([6, 32], 'uniform', seed=1)
  y = tf.constant([0, 1, 2, 0, 1, 2])
  linear = generators.build_feature_generator(
      num_classes=3, feature_dim=10, hidden=16, seed=2)
  out = linear([z, y], training=False).numpy()
  assert out.shape == (6, 10)
  assert out.min() < 0  # FedGen's reference: a linear last layer.
  relu = generators.build_feature_generator(
      num_classes=3, feature_dim=10, hidden=16, seed=2,
      output_activation='relu')
  np.testing.assert_allclose(relu([z, y], training=False),
                             np.maximum(out, 0.0), atol=1e-6)


def _sgd_disc_step(disc, x, lr=0.5):
  with tf.GradientTape() as tape:
    loss = -tf.reduce_mean(tf.math.log(disc.model(x, training=False) + 1e-7))
  variables = disc.model.trainable_weights
  for v, g in zip(variables, tape.gradient(loss, variables)):
    v.assign_sub(lr * g)


def test_shared_head_trains_the_classifiers_extractor():
  clf = _classifier()
  disc = generators.build_discriminator_head(clf, seed=3)
  assert disc.shared and disc.extractor is clf.features
  clf_refs = {v.ref() for v in clf.features.trainable_weights}
  disc_refs = [v.ref() for v in disc.model.trainable_weights]
  # Same objects: every extractor variable, plus exactly the head's two.
  assert clf_refs <= set(disc_refs)
  assert len(disc_refs) == len(clf_refs) + 2
  assert [v.ref() for v in disc.head_variables] == [
      r for r in disc_refs if r not in clf_refs]
  x = tf.random.stateless_uniform([4, *_SHAPE], seed=[1, 2], minval=-1)
  np.testing.assert_allclose(
      disc.model(x), tf.sigmoid(disc.logit_model(x)), atol=1e-6)
  before = clf.features(x, training=False).numpy()
  _sgd_disc_step(disc, x)
  after = clf.features(x, training=False).numpy()
  assert np.max(np.abs(after - before)) > 1e-4


def test_unshared_head_leaves_the_classifier_alone():
  clf = _classifier()
  disc = generators.build_discriminator_head(clf, seed=3, shared=False)
  assert not disc.shared and disc.extractor is not clf.features
  clf_refs = {v.ref() for v in clf.model.weights}
  assert not clf_refs & {v.ref() for v in disc.model.weights}
  x = tf.random.stateless_uniform([4, *_SHAPE], seed=[1, 2], minval=-1)
  before = clf.features(x, training=False).numpy()
  disc_before = disc.extractor(x, training=False).numpy()
  _sgd_disc_step(disc, x)
  np.testing.assert_array_equal(clf.features(x, training=False), before)
  assert np.max(np.abs(disc.extractor(x, training=False) - disc_before)) > 1e-4
  # A custom extractor builder (another seed) is used as given.
  other = generators.build_discriminator_head(
      clf, seed=3, shared=False, extractor_fn=lambda: _classifier(9).features)
  assert np.max(np.abs(other.extractor(x) - clf.features(x))) > 1e-4


def test_noise_kinds_statistics_and_seeding():
  gauss = generators.sample_noise([20000, 4], 'gaussian', seed=5).numpy()
  unif = generators.sample_noise([20000, 4], 'uniform', seed=5).numpy()
  assert abs(gauss.mean()) < 0.02 and abs(gauss.std() - 1.0) < 0.02
  assert gauss.min() < -3 and gauss.max() > 3
  assert unif.min() >= 0.0 and unif.max() < 1.0
  assert abs(unif.mean() - 0.5) < 0.01
  assert abs(unif.var() - 1.0 / 12.0) < 0.005
  np.testing.assert_array_equal(
      generators.sample_noise([3, 4], 'uniform', seed=[5, 1]),
      generators.sample_noise([3, 4], 'uniform', seed=tf.constant([5, 1])))
  assert not np.allclose(generators.sample_noise([3, 4], seed=5),
                         generators.sample_noise([3, 4], seed=6))
  with pytest.raises(ValueError, match='noise kind'):
    generators.sample_noise([2], 'laplace', seed=0)
