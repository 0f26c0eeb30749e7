"""Pretrained initial weights (`tff_kd.models.pretrained`): files of every
supported format are read once and start every build, eager or graph;
mismatches and offline ImageNet weights are one-line `ConfigError`s."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tff_kd import errors
from tff_kd import models
from tff_kd.models import pretrained
from tff_kd.models import pretraining
from tff_kd.program import export

_SHAPE = (8, 8, 1)


def _values(model):
  return [v.numpy() for v in model.weights]


@pytest.fixture
def source():
  """A 'pretrained' CNN (seed 7, every variable + 0.25) and its values
  (built per test: a Keras model made before a graph build is unusable
  after it)."""
  clf = models.build_classifier('cnn', input_shape=_SHAPE, num_classes=10,
                                seed=7)
  for v in clf.model.weights:
    v.assign(v + 0.25)
  return clf.model, _values(clf.model)


def _save(model, path, fmt):
  if fmt == 'saved_model':
    return export.export_saved_model(model, path)
  model.save_weights(path)
  return path


@pytest.mark.parametrize('name,fmt', [('w.h5', 'h5'),
                                      ('w.weights.h5', 'h5'),
                                      ('ckpt', 'checkpoint'),
                                      ('export', 'saved_model')])
def test_every_build_starts_from_the_file(tmp_path, source, name, fmt):
  model, values = source
  path = _save(model, str(tmp_path / name), fmt)
  assert pretrained.weights_format(path) == fmt
  build = models.classifier_builder('cnn', input_shape=_SHAPE,
                                    num_classes=10, seed=0, weights=path)
  for _ in range(2):  # Read once; every build gets the values.
    for a, b in zip(_values(build().model), values):
      np.testing.assert_array_equal(a, b)
  with tf.Graph().as_default():
    in_graph = build().model
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for a, b in zip(sess.run(in_graph.weights), values):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('name,fmt,match', [
    ('w.h5', 'h5', r'variable 0 is \S+ \(3, 3, 1, 6\) in the file but '
                   r'\S+ \(3, 3, 3, 6\) in the model'),
    ('w.weights.h5', 'h5', 'does not fit the model'),
    ('ckpt', 'checkpoint', r'incompatible tensor with shape \(3, 3, 1, 6\)'),
    ('export', 'saved_model', r'variable 0 \S+ has shape \(3, 3, 1, 6\)'),
])
def test_a_mismatched_file_is_one_line(tmp_path, source, name, fmt, match):
  path = _save(source[0], str(tmp_path / name), fmt)
  with pytest.raises(errors.ConfigError) as e:
    models.classifier_builder('cnn', input_shape=(8, 8, 3), num_classes=10,
                              weights=path, what='model.weights')
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith(f'model.weights: {path} does not fit the model')
  assert e.match(match)


def test_another_architecture_is_refused(tmp_path, source):
  path = _save(source[0], str(tmp_path / 'w.h5'), 'h5')
  with pytest.raises(errors.ConfigError, match='does not fit the model'):
    models.classifier_builder('resnet11', input_shape=_SHAPE,
                              num_classes=10, weights=path)


def test_weights_settings_are_checked():
  models.check_weights('model.weights', '')
  models.check_weights('model.weights', None)
  models.check_weights('model.weights', 'imagenet', 'keras:ResNet50')
  with pytest.raises(errors.ConfigError,
                     match="model.weights='imagenet' needs a keras:"):
    models.check_weights('model.weights', 'imagenet', 'cnn')
  with pytest.raises(errors.ConfigError, match='is not a weights file'):
    models.check_weights('model.weights', '/nonexistent/w.h5')
  assert models.parse_weights_list('', 'cnn,keras:MobileNetV2',
                                   key='k') == ['', '']
  assert models.parse_weights_list(',imagenet', 'cnn,keras:MobileNetV2',
                                   key='k') == ['', 'imagenet']
  with pytest.raises(errors.ConfigError, match='k has 1 entries but'):
    models.parse_weights_list('imagenet', 'cnn,keras:MobileNetV2', key='k')
  with pytest.raises(errors.ConfigError, match="entry for 'cnn'"):
    models.parse_weights_list('imagenet,', 'cnn,keras:MobileNetV2', key='k')


@pytest.mark.parametrize('value,match', [
    ('pretrain:svhn', "expected 'pretrain:<dataset>'"),
    ('pretrain:digits?epochs=0', 'epochs must be >= 1'),
    ('pretrain:digits?steps=3', "optional '\\?epochs=N&limit=N'"),
    ('pretrain:digits?epochs=2&epochs=3', 'expected'),
    ('pretrain:digits?limit=-1', 'expected'),
    ('pretrain:digits?epochs', 'expected'),
])
def test_pretrain_settings_are_checked_as_text(value, match):
  with pytest.raises(errors.ConfigError, match=match) as e:
    models.check_weights('model.weights', value, 'cnn')
  assert '\n' not in str(e.value)


def test_pretrain_settings_need_no_file_and_name_their_cache(
    tmp_path, monkeypatch):
  monkeypatch.setenv('HOME', str(tmp_path / 'empty_home'))
  for value in ('pretrain:fashion_mnist', 'pretrain:usps?limit=500',
                'pretrain:digits?epochs=2&limit=100'):
    models.check_weights('model.weights', value, 'resnet11')
  assert models.parse_weights_list(
      'pretrain:digits,', 'cnn,resnet11', key='k') == ['pretrain:digits', '']
  with pytest.raises(errors.ConfigError, match="library's own models"):
    models.check_weights('model.weights', 'pretrain:digits',
                         'keras:MobileNetV2')
  names = {
      pretraining.cache_path(pretraining.parse_spec(v), data_dir='~/d',
                             model='cnn', norm='batch',
                             image_shape=(32, 32, 3), seed=0)
      for v in ('pretrain:fashion_mnist', 'pretrain:fashion_mnist?epochs=5',
                'pretrain:fashion_mnist?epochs=1&limit=64')}
  home = str(tmp_path / 'empty_home')
  assert names == {
      f'{home}/d/tff_kd_pretrained/cnn_batch_32x32x3_fashion_mnist_seed0'
      '.weights.h5',
      f'{home}/d/tff_kd_pretrained/cnn_batch_32x32x3_fashion_mnist_seed0'
      '_e1_n64.weights.h5'}
  assert not os.path.exists(home)


def test_imagenet_offline_is_one_line_naming_the_cache(tmp_path, monkeypatch):
  # An empty Keras cache: Keras must download, which fails offline (at once
  # here; a silent network is cut after pretrained._DOWNLOAD_TIMEOUT_S).
  monkeypatch.setenv('KERAS_HOME', str(tmp_path / 'keras'))
  monkeypatch.setattr(pretrained, '_DOWNLOAD_TIMEOUT_S', 5.0)
  with pytest.raises(errors.ConfigError) as e:
    models.classifier_builder('keras:MobileNetV2', input_shape=_SHAPE,
                              num_classes=10, weights='imagenet',
                              options={'alpha': 0.35})
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith("model.weights='imagenet': Keras could not get "
                            'the ImageNet weights of keras:MobileNetV2')
  assert os.path.join(str(tmp_path / 'keras'), 'models') in message
