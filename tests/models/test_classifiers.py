"""Classifiers: sizes, the extractor/head split, seeding and normalisation."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_kd import errors
from tff_kd.models import classifiers
from tff_kd.models import generators


def _cnn(norm='batch', seed=0, input_shape=(28, 28, 1)):
  return classifiers.build_classifier('cnn', input_shape=input_shape,
                                      num_classes=10, norm=norm, seed=seed)


@pytest.fixture(scope='module')
def cnn():
  return _cnn()


@pytest.fixture(scope='module')
def resnet():
  return classifiers.build_classifier('resnet11', input_shape=(32, 32, 3),
                                      num_classes=10, norm='batch', seed=0)


def _layer_types(model):
  return collections.Counter(type(layer).__name__ for layer in model.layers)


def _resnet11_parameters(channels, num_classes, norm):
  """Trainable scalars of the documented bottleneck ResNet, counted by hand."""
  def conv(c_in, c_out, k):
    # Without a norm a conv has a bias; a norm has a scale and an offset.
    return c_in * c_out * k * k + (2 * c_out if norm else c_out)
  total, c = conv(channels, 16, 3), 16
  for planes, stride in ((16, 1), (32, 2), (64, 2)):
    for block in range(2):
      out = 4 * planes
      if (stride if block == 0 else 1) != 1 or c != out:
        total += conv(c, out, 1)
      total += conv(c, planes, 1) + conv(planes, planes, 3)
      total += conv(planes, out, 1)
      c = out
  return total + 256 * num_classes + num_classes


# ------------------------------------------------------------------- sizes


def test_cnn_matches_fedgen_reference_size(cnn):
  # conv 1->6 (54) + BN (12) + conv 6->16 (864) + BN (32) + FC 784->32
  # (25,120) + FC 32->10 (330).
  assert classifiers.num_parameters(cnn.model) == 26_412
  assert cnn.feature_dim == 32
  assert classifiers.num_parameters(cnn.head) == 330
  assert cnn.model.output_shape == (None, 10)
  assert cnn.features.output_shape == (None, 32)


def test_cnn_on_larger_rgb_inputs_has_a_larger_flatten_layer():
  clf = _cnn(input_shape=(32, 32, 3))
  # 3x3x3x6 + 12 + 864 + 32 + (8*8*16)*32 + 32 + 330.
  assert classifiers.num_parameters(clf.model) == 34_200
  assert clf.feature_dim == 32


def test_resnet11_shape_and_size(resnet):
  assert resnet.feature_dim == 256
  assert resnet.features.output_shape == (None, 256)
  x = np.random.default_rng(0).normal(size=(3, 32, 32, 3)).astype(np.float32)
  assert resnet.model(x, training=False).shape == (3, 10)
  assert classifiers.num_parameters(resnet.model) == 220_378
  assert _resnet11_parameters(3, 10, norm=True) == 220_378
  types = _layer_types(resnet.features)
  # Stem + 3 convs in each of 6 blocks + 3 projection shortcuts.
  assert types['Conv2D'] == 22
  assert types['BatchNormalization'] == 22
  assert types['Add'] == 6
  assert types['GlobalAveragePooling2D'] == 1


def test_resnet11_without_norm_uses_conv_biases():
  clf = classifiers.build_classifier('resnet11', input_shape=(16, 16, 1),
                                     num_classes=4, norm='none')
  assert classifiers.num_parameters(clf.model) == _resnet11_parameters(
      1, 4, norm=False)
  assert not clf.model.non_trainable_weights


# ------------------------------------------------------ extractor and head


@pytest.mark.parametrize('name', ['cnn', 'resnet'])
def test_model_is_head_of_features(name, cnn, resnet):
  clf = {'cnn': cnn, 'resnet': resnet}[name]
  shape = clf.model.input_shape[1:]
  x = np.random.default_rng(1).normal(size=(4, *shape)).astype(np.float32)
  for training in (False, True):
    np.testing.assert_allclose(
        clf.model(x, training=training).numpy(),
        clf.head(clf.features(x, training=training)).numpy(),
        rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('name', ['cnn', 'resnet'])
def test_weights_are_shared_extractor_first(name, cnn, resnet):
  clf = {'cnn': cnn, 'resnet': resnet}[name]
  want = clf.features.trainable_weights + clf.head.trainable_weights
  got = clf.model.trainable_weights
  assert len(got) == len(want)
  assert all(a is b for a, b in zip(got, want))
  assert len(clf.model.weights) == (len(clf.features.weights) +
                                    len(clf.head.weights))


def test_training_the_model_changes_its_halves():
  clf = _cnn(seed=3)
  before = [v.numpy() for v in clf.head.trainable_weights]
  x = np.ones((2, 28, 28, 1), np.float32)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(clf.model(x, training=True) ** 2)
  grads = tape.gradient(loss, clf.model.trainable_weights)
  assert all(g is not None for g in grads)
  for v, g in zip(clf.model.trainable_weights, grads):
    v.assign_sub(0.1 * g)
  after = [v.numpy() for v in clf.head.trainable_weights]
  assert any(np.any(a != b) for a, b in zip(before, after))


# ----------------------------------------------------------------- seeding


def _values(clf):
  return [v.numpy() for v in clf.model.weights]


def test_same_seed_same_weights_different_seed_different():
  a, b, c = _values(_cnn(seed=5)), _values(_cnn(seed=5)), _values(_cnn(seed=6))
  assert len(a) == len(b) == len(c)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  kernels = [i for i, v in enumerate(a) if v.ndim > 1]
  assert kernels and all(np.any(a[i] != c[i]) for i in kernels)


def test_layers_get_distinct_initialiser_seeds():
  kernels = [v.numpy() for v in _cnn(seed=0).model.trainable_weights
             if v.shape.rank == 4]
  assert [k.shape for k in kernels] == [(3, 3, 1, 6), (3, 3, 6, 16)]
  # He-normal with one seed would give both kernels the same leading values
  # up to the fan-in scale.
  first = kernels[0].ravel()[:6] / np.sqrt(2 / 9)
  second = kernels[1].ravel()[:6] / np.sqrt(2 / 54)
  assert not np.allclose(first, second, atol=1e-3)


def test_graph_mode_gives_the_eager_initial_weights():
  eager = _values(_cnn(seed=2))
  graph = tf.Graph()
  with graph.as_default():
    clf = _cnn(seed=2)
    with tf.compat.v1.Session(graph=graph) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      values = sess.run(clf.model.weights)
  assert len(values) == len(eager)
  for x, y in zip(eager, values):
    np.testing.assert_array_equal(x, y)


# ----------------------------------------------------------- normalisation


def test_group_norm_has_no_non_trainable_weights():
  clf = _cnn(norm='group')
  assert not clf.model.non_trainable_weights
  groups = [layer.groups for layer in clf.features.layers
            if isinstance(layer, tf.keras.layers.GroupNormalization)]
  # The largest group count <= 8 dividing 6 and 16 channels.
  assert groups == [6, 8]
  assert 'BatchNormalization' not in _layer_types(clf.features)
  assert classifiers.num_parameters(clf.model) == 26_412


def test_batch_norm_uses_pytorch_momentum(cnn, resnet):
  for clf in (cnn, resnet):
    bns = [layer for layer in clf.features.layers
           if isinstance(layer, tf.keras.layers.BatchNormalization)]
    assert bns
    assert all(bn.momentum == pytest.approx(0.9) for bn in bns)
    assert all(bn.epsilon == pytest.approx(1e-5) for bn in bns)
  # Moving mean and variance of each of the two BN layers.
  assert len(cnn.model.non_trainable_weights) == 4


def test_no_norm_has_neither_and_convs_have_biases():
  clf = _cnn(norm='none')
  types = _layer_types(clf.features)
  assert 'BatchNormalization' not in types
  assert 'GroupNormalization' not in types
  assert not clf.model.non_trainable_weights
  convs = [layer for layer in clf.features.layers
           if isinstance(layer, tf.keras.layers.Conv2D)]
  assert len(convs) == 2 and all(c.use_bias for c in convs)
  # 60 + 880 + 25,120 + 330.
  assert classifiers.num_parameters(clf.model) == 26_390


# ------------------------------------------------------------------ errors


def test_unknown_model_is_a_config_error():
  with pytest.raises(errors.ConfigError, match="'vgg16'") as e:
    classifiers.build_classifier('vgg16', input_shape=(28, 28, 1),
                                 num_classes=10)
  assert 'resnet11' in str(e.value) and '\n' not in str(e.value)


def test_unknown_norm_is_a_config_error():
  with pytest.raises(errors.ConfigError, match="'layer'") as e:
    classifiers.build_classifier('cnn', input_shape=(28, 28, 1),
                                 num_classes=10, norm='layer')
  assert 'group' in str(e.value) and '\n' not in str(e.value)


def _built_in_a_graph(build, **kwargs):
  """(the ops, the initial weights by name, the config, the architecture
  digest, the outputs in training and inference mode on fixed images) of a
  model `build(**kwargs)` constructs in a graph, Keras' names fresh."""
  tf.keras.backend.clear_session()
  graph = tf.Graph()
  with graph.as_default():
    built = build(**kwargs)
    model = getattr(built, 'model', built)
    ops = len(graph.get_operations())
    inputs = [tf.constant(np.random.default_rng(0).random(
        [4, *i.shape[1:]]).astype(np.float32)) for i in model.inputs]
    inputs = inputs[0] if len(inputs) == 1 else inputs
    outputs = [model(inputs, training=t) for t in (True, False)]
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      weights = {v.name: session.run(v) for v in model.weights}
      values = session.run(outputs)
  return ops, weights, model.get_config(), classifiers.architecture_digest(
      model) if hasattr(built, 'model') else None, values


@pytest.mark.parametrize('build,kwargs', [
    (classifiers.build_classifier,
     {'name': 'cnn', 'input_shape': (8, 8, 1), 'num_classes': 10,
      'seed': 3}),
    (classifiers.build_classifier,
     {'name': 'resnet11', 'input_shape': (8, 8, 1), 'num_classes': 10}),
    (generators.build_dcgan_generator,
     {'noise_dim': 8, 'num_classes': 10, 'image_shape': (8, 8, 1)}),
], ids=['cnn', 'resnet11', 'dcgan'])
def test_inference_construction_builds_the_same_model_with_fewer_ops(
    build, kwargs):
  """`base.constructs_keras_models`: the same weights (values and names),
  config, digest and outputs in both modes as the undecorated builder, from
  a graph with fewer ops (no BatchNormalization `tf.cond`s built only to
  infer shapes)."""
  ops, weights, config, digest, values = _built_in_a_graph(build, **kwargs)
  ops_0, weights_0, config_0, digest_0, values_0 = _built_in_a_graph(
      build.__wrapped__, **kwargs)
  assert ops < ops_0
  assert list(weights) == list(weights_0)
  for name in weights:
    np.testing.assert_array_equal(weights[name], weights_0[name], name)
  assert config == config_0 and digest == digest_0
  for a, b in zip(values, values_0):
    np.testing.assert_array_equal(a, b)
