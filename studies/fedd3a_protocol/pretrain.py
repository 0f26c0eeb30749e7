r"""Pretrains a classifier on Fashion-MNIST: an offline stand-in for ImageNet.

FedD3A (Su, Li, Xue, AAAI 2023) starts every model from ImageNet weights;
this machine is offline, so the library's CNN (and ResNet-11) is pretrained
on Fashion-MNIST instead, resized (bilinear) and made RGB (grey repeated) to
the digit domains' shape (32x32x3, `configs/fedd3a_digits*.py`). No digit
client domain (MNIST, USPS, MNIST-M) and no digit server pool (`digits`,
`usps`) is Fashion-MNIST, so its features are learnt on other data, as
ImageNet's are.

The training is the library's (`tff_kd.models.pretraining`): a config with
`model.weights='pretrain:fashion_mnist'` makes the same file on its first
run. This script makes it ahead of time, with a time budget if wanted
(`--max_seconds`, for ResNet-11), and records the command, the test
accuracy and the timings in `studies/fedd3a_protocol/results/pretrain_<model>.json`. A
second run only re-evaluates the cached file (`--force` retrains).
`--dataset` pretrains on another dataset of `tff_kd.data.DATASETS` (default
Fashion-MNIST; the smoke test's scikit-learn `digits` needs no tfds build);
the accuracy is then recorded as `<dataset>_test_accuracy`.

Usage (about 2 minutes for the CNN on 2 CPU cores):
  TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -m studies.fedd3a_protocol.pretrain \
      --model=cnn --manual_dir=../shared/data --epochs=5
"""

import json
import os
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import tensorflow as tf

from studies import common
from tff_kd import data as data_lib
from tff_kd import models
from tff_kd.models import pretraining

_MODEL = flags.DEFINE_string('model', 'cnn', 'cnn | resnet11.')
_NORM = flags.DEFINE_string('norm', 'batch', 'The model norm.')
_SHAPE = flags.DEFINE_string('image_shape', '32,32,3',
                             'H,W,C of the digit domains.')
_SEED = flags.DEFINE_integer('seed', 0, 'Initialiser and shuffle seed.')
_EPOCHS = flags.DEFINE_integer('epochs', pretraining.DEFAULT_EPOCHS,
                               'Passes over the training set.')
_TRAIN_LIMIT = flags.DEFINE_integer('train_limit', 0,
                                    '> 0: the first N training images only.')
_MAX_SECONDS = flags.DEFINE_float(
    'max_seconds', 0.0, '> 0: stop training after this many seconds.')
_DATA_DIR = flags.DEFINE_string('data_dir', '~/tensorflow_datasets',
                                'tfds data_dir; the weights are cached in '
                                f'its {pretraining.CACHE_FOLDER}/.')
_MANUAL_DIR = flags.DEFINE_string('manual_dir', '../shared/data',
                                  'Raw files (its fashion_mnist/).')
_FORCE = flags.DEFINE_bool('force', False, 'Retrain even if cached.')
_DATASET = flags.DEFINE_string(
    'dataset', 'fashion_mnist', 'The dataset pretrained on (default '
    "Fashion-MNIST, the stand-in for ImageNet; e.g. 'digits' for a smoke "
    'test without a tfds build).')
_OUT = flags.DEFINE_string('out', 'studies/fedd3a_protocol/results',
                           'Folder of pretrain_<model>.json.')


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


def _cached_accuracy(path: str, shape: tuple) -> float:
  """The `--dataset` test accuracy of a cached weights file."""
  ds = data_lib.load_dataset(
      _DATASET.value, data_dir=os.path.expanduser(_DATA_DIR.value),
      manual_dir=_MANUAL_DIR.value, image_shape=shape)
  model = models.build_classifier(
      _MODEL.value, input_shape=shape, num_classes=ds.num_classes,
      norm=_NORM.value, seed=_SEED.value).model
  model.load_weights(path)
  model.compile(metrics=['accuracy'], loss=tf.keras.losses.
                SparseCategoricalCrossentropy(from_logits=True))
  return float(model.evaluate(ds.x_test, ds.y_test, batch_size=1000,
                              verbose=0)[1])


def main(argv):
  del argv
  shape = tuple(int(v) for v in _SHAPE.value.split(','))
  spec = pretraining.Spec(_DATASET.value, epochs=_EPOCHS.value,
                          limit=_TRAIN_LIMIT.value)
  path = pretraining.cache_path(spec, data_dir=_DATA_DIR.value,
                                model=_MODEL.value, norm=_NORM.value,
                                image_shape=shape, seed=_SEED.value)
  if os.path.exists(path) and not _FORCE.value:
    print(f'cached: {path}')
    trained = None
    accuracy = _cached_accuracy(path, shape)
  else:
    stop = _StopAfter(_MAX_SECONDS.value)
    trained = pretraining.pretrain(
        spec, path=path, model=_MODEL.value, norm=_NORM.value,
        image_shape=shape, seed=_SEED.value,
        data_dir=os.path.expanduser(_DATA_DIR.value),
        manual_dir=_MANUAL_DIR.value, verbose=2, callbacks=[stop])
    trained['stopped_early_at_batch'] = stop.stopped_at
    accuracy = trained['test_accuracy']
  result = dict(
      command=common.command('fedd3a_protocol.pretrain'), weights=path,
      **{f'{_DATASET.value}_test_accuracy': round(accuracy, 4)},
      trained=trained,
      machine=common.machine())
  out = os.path.join(_OUT.value, f'pretrain_{_MODEL.value}')
  common.write_result(out, result)
  print(json.dumps(result, indent=2))
  print(f'wrote {out}.json; test accuracy {accuracy:.4f}; weights {path}')


if __name__ == '__main__':
  app.run(main)
