"""Keras models as classifiers: `from_keras`, `keras:<Application>` models."""

import numpy as np
import pytest
import tensorflow as tf

from tff_kd import errors
from tff_kd import models
from tff_kd.models import classifiers

_X = np.random.default_rng(0).uniform(-1, 1, (4, 8, 8, 1)).astype(np.float32)


def _functional(head_activation=None, softmax_layer=False):
  init = lambda i: tf.keras.initializers.GlorotUniform(seed=i)  # noqa: E731
  images = tf.keras.Input((8, 8, 1))
  h = tf.keras.layers.Conv2D(4, 3, kernel_initializer=init(1))(images)
  h = tf.keras.layers.GlobalAveragePooling2D(name='pool')(h)
  h = tf.keras.layers.Dense(6, activation='relu', name='feat',
                            kernel_initializer=init(2))(h)
  out = tf.keras.layers.Dense(3, activation=head_activation, name='logits',
                              kernel_initializer=init(3))(h)
  if softmax_layer:
    out = tf.keras.layers.Softmax()(out)
  return tf.keras.Model(images, out, name='small')


@pytest.mark.parametrize('layer', ['feat', -2])
def test_from_keras_splits_at_the_layer_and_shares_variables(layer):
  keras_model = _functional()
  clf = models.from_keras(keras_model, feature_layer=layer, num_classes=3)
  assert clf.feature_dim == 6
  assert clf.features.output_shape == (None, 6)
  assert clf.head.output_shape == (None, 3)
  ids = lambda m: [id(v) for v in m.trainable_weights]  # noqa: E731
  assert ids(clf.model) == ids(clf.features) + ids(clf.head)
  assert set(ids(clf.model)) == set(ids(keras_model))
  np.testing.assert_allclose(clf.model(_X), keras_model(_X), rtol=1e-6)
  np.testing.assert_allclose(clf.head(clf.features(_X)), keras_model(_X),
                             rtol=1e-6)
  # Training the classifier trains the user's model.
  keras_model.get_layer('logits').bias.assign(tf.ones(3))
  np.testing.assert_allclose(clf.model(_X), keras_model(_X), rtol=1e-6)


@pytest.mark.parametrize('kwargs', [{'head_activation': 'softmax'},
                                    {'softmax_layer': True}])
def test_from_keras_strips_a_final_softmax(kwargs):
  keras_model = _functional(**kwargs)
  clf = models.from_keras(keras_model, 'feat')
  logits = clf.model(_X)
  np.testing.assert_allclose(tf.nn.softmax(logits), keras_model(_X),
                             rtol=1e-5, atol=1e-7)
  assert not np.allclose(np.sum(logits, axis=-1), 1.0)


class _Subclassed(tf.keras.Model):

  def call(self, x):
    return x


def test_from_keras_errors():
  keras_model = _functional()
  with pytest.raises(errors.ConfigError, match="'nope' is not a layer"):
    models.from_keras(keras_model, 'nope')
  with pytest.raises(errors.ConfigError, match='index 9 is out of range'):
    models.from_keras(keras_model, 9)
  with pytest.raises(errors.ConfigError, match=r'not \[batch, 5\] logits'):
    models.from_keras(keras_model, 'feat', num_classes=5)
  with pytest.raises(errors.ConfigError, match='one \\[batch, d\\] tensor'):
    models.from_keras(keras_model, 1)  # The conv's 4-D output.
  with pytest.raises(errors.ConfigError, match='leaves no head'):
    models.from_keras(keras_model, 'logits')
  with pytest.raises(errors.ConfigError, match='is the input'):
    models.from_keras(keras_model, 0)
  with pytest.raises(errors.ConfigError, match='functional Keras model'):
    models.from_keras(_Subclassed(), 'feat')
  a, b = tf.keras.Input((2,)), tf.keras.Input((2,))
  two = tf.keras.Model([a, b], tf.keras.layers.Dense(2)(
      tf.keras.layers.Concatenate()([a, b])))
  with pytest.raises(errors.ConfigError, match='one input and one output'):
    models.from_keras(two, 0)
  # A head that also reads a layer before the split.
  x = tf.keras.Input((4,))
  f = tf.keras.layers.Dense(3, name='f')(x)
  skip = tf.keras.Model(x, tf.keras.layers.Add(name='add')(
      [tf.keras.layers.Dense(4)(f), x]))
  with pytest.raises(errors.ConfigError, match="'add' reads several tensors"):
    models.from_keras(skip, 'f')


@pytest.fixture(scope='module')
def mobilenet():
  """The smallest MobileNetV2 (alpha 0.35) on 8x8 grey digits, and its
  initial values."""
  clf = models.build_classifier('keras:MobileNetV2', input_shape=(8, 8, 1),
                                num_classes=10, seed=3,
                                options={'alpha': 0.35})
  return clf, [v.numpy() for v in clf.model.weights]


def test_application_builds_resized_rgb_and_trains_one_step(mobilenet):
  clf, _ = mobilenet
  assert clf.feature_dim == 1280 and clf.model.output_shape == (None, 10)
  resize = clf.features.get_layer('application_input')
  assert resize.size == (32, 32)  # MobileNetV2's minimum side.
  opt = tf.keras.optimizers.SGD(0.1)
  bn = [layer for layer in clf.features.submodules
        if isinstance(layer, tf.keras.layers.BatchNormalization)]
  assert bn and all(layer.momentum == 0.9 for layer in bn)
  mean_before = bn[0].moving_mean.numpy().copy()
  kernel_before = clf.head.trainable_weights[0].numpy().copy()
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
        tf.range(4) % 10, clf.model(_X, training=True), from_logits=True))
  opt.apply_gradients(zip(tape.gradient(loss, clf.model.trainable_weights),
                          clf.model.trainable_weights))
  assert np.isfinite(loss.numpy())
  assert not np.array_equal(kernel_before, clf.head.trainable_weights[0])
  # BatchNorm: statistics move in training mode only, and inference mode
  # uses them.
  assert not np.array_equal(mean_before, bn[0].moving_mean.numpy())
  mean_after = bn[0].moving_mean.numpy().copy()
  clf.model(_X, training=False)
  np.testing.assert_array_equal(mean_after, bn[0].moving_mean.numpy())


def test_application_initial_weights_are_seeded(mobilenet):
  again = models.build_classifier('keras:MobileNetV2', input_shape=(8, 8, 1),
                                  num_classes=10, seed=3,
                                  options={'alpha': 0.35})
  initial = mobilenet[1]
  assert len(initial) == len(again.model.weights)
  for a, b in zip(initial, again.model.weights):
    np.testing.assert_array_equal(a, b)


def test_unseeded_initialisers_are_reseeded_alike_in_eager_and_graph():
  def build(seed):
    with tf.variable_creator_scope(classifiers._SeededInitialisers(seed)):  # pylint: disable=protected-access
      x = tf.keras.Input((4,))
      return tf.keras.Model(x, tf.keras.layers.Dense(3)(
          tf.keras.layers.Dense(5)(x)))

  first = [v.numpy() for v in build(1).weights]
  second = [v.numpy() for v in build(1).weights]
  other = [v.numpy() for v in build(2).weights]
  with tf.Graph().as_default():
    model = build(1)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      in_graph = sess.run(model.weights)
  for a, b, c in zip(first, second, in_graph):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
  assert not np.array_equal(first[0], other[0])


@pytest.mark.parametrize('app,pixels', [
    # MobileNetV2 ('tf' mode): [-1, 1] as given.
    ('MobileNetV2', [-1.0, -1.0, -1.0]),
    # ResNet50 ('caffe' mode): BGR pixels minus ImageNet's BGR mean.
    ('ResNet50', [-103.939, -116.779, -123.68]),
    # DenseNet121 ('torch' mode): ImageNet mean / std standardisation.
    ('DenseNet121', [-0.485 / 0.229, -0.456 / 0.224, -0.406 / 0.225]),
    # EfficientNetB0 scales inside the network: pixels in [0, 255].
    ('EfficientNetB0', [0.0, 0.0, 0.0]),
])
def test_application_input_is_the_applications_preprocessing(app, pixels):
  black = -np.ones((1, 2, 2, 1), np.float32)  # Normalised pixel 0.
  out = classifiers.ApplicationInput(app)(black).numpy()
  assert out.shape == (1, 2, 2, 3)
  np.testing.assert_allclose(out[0, 0, 0], pixels, rtol=1e-5, atol=1e-5)
  white = np.ones((1, 2, 2, 3), np.float32)
  if app == 'MobileNetV2':
    np.testing.assert_allclose(classifiers.ApplicationInput(app)(white), 1.0)


def test_application_names():
  assert {'ResNet50', 'MobileNetV2', 'ResNet50V2'} <= set(models.APPLICATIONS)
  models.check_model_name('model.name', 'keras:ResNet50V2')
  models.check_model_name('model.name', 'resnet11')
  with pytest.raises(errors.ConfigError,
                     match="model.name: model 'keras:ResNet18' is not a "
                           'Keras Application'):
    models.check_model_name('model.name', 'keras:ResNet18')
  with pytest.raises(errors.ConfigError, match="'vgg' is unknown"):
    models.check_model_name('model.name', 'vgg')
  assert models.parse_model_list(
      'cnn:group,keras:MobileNetV2', default_norm='batch', key='k') == [
          ('cnn', 'group'), ('keras:MobileNetV2', 'batch')]
  with pytest.raises(errors.ConfigError, match="entry 'keras:MobileNetV2:group'"):
    models.parse_model_list('keras:MobileNetV2:group', default_norm='batch',
                            key='k')
  assert classifiers.min_input_size('Xception') == 71
  assert classifiers.min_input_size('ResNet50') == 32
