r"""Pretrains a classifier on Fashion-MNIST: an offline stand-in for ImageNet.

FedD3A (Su, Li, Xue, AAAI 2023) starts every model from ImageNet weights;
this machine is offline, so this script pretrains the library's CNN (and
ResNet-11) on Fashion-MNIST instead, resized (bilinear) and made RGB (grey
repeated) to the digit domains' shape (32x32x3, `configs/fedd3a_digits*.py`,
`tff_kd.data.load_domains`). No digit client domain (MNIST, USPS, MNIST-M)
and no digit server pool (`digits`, `usps`) is Fashion-MNIST, so its
features are learnt on other data, as ImageNet's are.

The weights file holds the whole classifier (`Classifier.model.save_weights`,
Keras h5): give it as `model.weights` (or a `client_weights` entry) of a
config with the same model, norm and image shape, e.g.

    --config.model.weights=~/tensorflow_datasets/tff_kd_pretrained/cnn_batch_32x32x3_fashion_mnist_seed0.weights.h5

It is cached under `<data_dir>/tff_kd_pretrained/`; a second run only
re-evaluates it (`--force` retrains). The command, the test accuracy and
the timings go to `benchmarks/results/pretrain_<model>.json`.

Usage (about 2 minutes for the CNN on 2 CPU cores):
  TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -m benchmarks.pretrain \
      --model=cnn --manual_dir=../shared/data --epochs=5
"""

import json
import os
import time
from typing import Sequence

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import tensorflow as tf

from benchmarks import common
from tff_kd import data as data_lib
from tff_kd import models

_MODEL = flags.DEFINE_string('model', 'cnn', 'cnn | resnet11.')
_NORM = flags.DEFINE_string('norm', 'batch', 'The model norm.')
_SHAPE = flags.DEFINE_string('image_shape', '32,32,3',
                             'H,W,C of the digit domains.')
_SEED = flags.DEFINE_integer('seed', 0, 'Initialiser and shuffle seed.')
_EPOCHS = flags.DEFINE_integer('epochs', 5, 'Passes over the training set.')
_BATCH = flags.DEFINE_integer('batch_size', 128, 'Batch size.')
_LR = flags.DEFINE_float('learning_rate', 1e-3, 'Adam learning rate.')
_TRAIN_LIMIT = flags.DEFINE_integer('train_limit', 0,
                                    '> 0: the first N training images only.')
_MAX_SECONDS = flags.DEFINE_float(
    'max_seconds', 0.0, '> 0: stop training after this many seconds.')
_DATA_DIR = flags.DEFINE_string('data_dir', '~/tensorflow_datasets',
                                'tfds data_dir; the weights are cached in '
                                'its tff_kd_pretrained/.')
_MANUAL_DIR = flags.DEFINE_string('manual_dir', '../shared/data',
                                  'Raw files (its fashion_mnist/).')
_FORCE = flags.DEFINE_bool('force', False, 'Retrain even if cached.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results',
                           'Folder of pretrain_<model>.json.')

DATASET = 'fashion_mnist'


def weights_path(data_dir: str, model: str, norm: str,
                 image_shape: Sequence[int], seed: int = 0) -> str:
  """Where the pretrained weights of a (model, norm, shape, seed) live."""
  shape = 'x'.join(str(int(v)) for v in image_shape)
  return os.path.join(os.path.expanduser(data_dir), 'tff_kd_pretrained',
                      f'{model}_{norm}_{shape}_{DATASET}_seed{seed}.weights.h5')


class _StopAfter(tf.keras.callbacks.Callback):
  """Stops training once `seconds` have passed (checked every batch)."""

  def __init__(self, seconds: float):
    super().__init__()
    self._seconds = seconds
    self._start = time.perf_counter()
    self.stopped_at = None

  def on_train_batch_end(self, batch, logs=None):
    if self._seconds and time.perf_counter() - self._start > self._seconds:
      self.model.stop_training = True
      self.stopped_at = batch


def main(argv):
  del argv
  shape = tuple(int(v) for v in _SHAPE.value.split(','))
  tf.keras.utils.set_random_seed(_SEED.value)
  start = time.perf_counter()
  ds = data_lib.load_dataset(
      DATASET, data_dir=os.path.expanduser(_DATA_DIR.value),
      manual_dir=_MANUAL_DIR.value, image_shape=shape,
      train_limit=_TRAIN_LIMIT.value or None)
  load_s = time.perf_counter() - start
  clf = models.build_classifier(_MODEL.value, input_shape=shape,
                                num_classes=ds.num_classes, norm=_NORM.value,
                                seed=_SEED.value)
  model = clf.model
  model.compile(
      optimizer=tf.keras.optimizers.Adam(_LR.value),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=['accuracy'])
  path = weights_path(_DATA_DIR.value, _MODEL.value, _NORM.value, shape,
                      _SEED.value)
  trained = None
  if os.path.exists(path) and not _FORCE.value:
    model.load_weights(path)
    print(f'cached: {path}')
  else:
    stop = _StopAfter(_MAX_SECONDS.value)
    start = time.perf_counter()
    history = model.fit(ds.x_train, ds.y_train, batch_size=_BATCH.value,
                        epochs=_EPOCHS.value, shuffle=True, verbose=2,
                        callbacks=[stop])
    train_s = time.perf_counter() - start
    os.makedirs(os.path.dirname(path), exist_ok=True)
    model.save_weights(path)
    trained = dict(
        train_s=round(train_s, 1), epochs_run=len(history.history['loss']),
        stopped_early_at_batch=stop.stopped_at,
        train_accuracy=[round(float(a), 4)
                        for a in history.history['accuracy']])
  _, accuracy = model.evaluate(ds.x_test, ds.y_test, batch_size=1000,
                               verbose=0)
  result = dict(
      command=common.command('pretrain'),
      model=_MODEL.value, norm=_NORM.value, image_shape=list(shape),
      dataset=DATASET, train_images=int(len(ds.y_train)),
      parameters=int(models.num_parameters(model)), seed=_SEED.value,
      epochs=_EPOCHS.value, batch_size=_BATCH.value,
      learning_rate=_LR.value, weights=path,
      fashion_mnist_test_accuracy=round(float(accuracy), 4),
      load_s=round(load_s, 1), trained=trained,
      machine=common.machine(), tensorflow=tf.__version__)
  out = os.path.join(_OUT.value, f'pretrain_{_MODEL.value}')
  common.write_result(out, result)
  print(json.dumps(result, indent=2))
  print(f'wrote {out}.json; test accuracy {accuracy:.4f}; weights {path}')


if __name__ == '__main__':
  app.run(main)
