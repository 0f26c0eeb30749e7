r"""Pretrained starts that the library makes itself: `pretrain:<dataset>`.

FedD3A (Su, Li, Xue, AAAI 2023, Sec. 4) starts every model from ImageNet
weights. Offline, or for the library's own small models that have no
ImageNet weights, a weights setting of the form

    pretrain:<dataset>[?epochs=N&limit=N]

names weights that this module makes: the classifier (the experiment's
model, norm, image shape and seed) trained centrally on `<dataset>` (one of
`tff_kd.data.DATASETS`, resized and channel-matched to the experiment's
images) with Adam (lr 1e-3, batches of 128) for `epochs` passes (default 5)
over its first `limit` training images (default: all). The file is cached
under `<data_dir>/tff_kd_pretrained/`; the first run that needs it trains
it, in a child process with Keras' progress bar (the CNN on Fashion-MNIST
at 32x32x3: about 2 minutes on 2 CPU cores), and every later run reads it.

The setting is checked without touching the file system
(`check_spec`), so validating a config never depends on what an earlier
process left behind; `resolve` turns it into a path when the experiment is
prepared, before any TFF computation. The training runs in a child process
so that a run that pretrains is the same run, variable for variable and
seed for seed, as one that finds the file cached.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Optional, Sequence

import tensorflow as tf

from tff_kd import errors
from tff_kd.data import datasets
from tff_kd.models import classifiers
from tff_kd.models import names

# The `pretrain:` setting as text lives in `names` (a config is checked
# without TensorFlow); these are its names here.
PREFIX = names.PRETRAIN_PREFIX
DEFAULT_EPOCHS = names.PRETRAIN_EPOCHS
Spec = names.PretrainSpec
is_spec = names.is_pretrain_spec
parse_spec = names.parse_pretrain_spec
check_spec = names.check_pretrain_spec

CACHE_FOLDER = 'tff_kd_pretrained'
BATCH_SIZE = 128
LEARNING_RATE = 1e-3


def cache_path(spec: Spec, *, data_dir: str, model: str, norm: str,
               image_shape: Sequence[int], seed: int) -> str:
  """Where the weights of `spec` for this model live."""
  return os.path.join(os.path.expanduser(data_dir), CACHE_FOLDER,
                      spec.file_name(model, norm, image_shape, seed))


def pretrain(spec: Spec, *, path: str, model: str, norm: str,
             image_shape: Sequence[int], seed: int,
             data_dir: Optional[str], manual_dir: Optional[str],
             verbose: int = 1, callbacks: Sequence = ()) -> dict:
  """Trains the classifier on `spec.dataset` and writes its weights.

  In this process (`resolve` calls it in a child process). The file is
  written under a temporary name and then moved into place, so a killed
  run leaves no partial file and concurrent runs do not collide.

  Args:
    spec: What to train on, and how long.
    path: The weights file to write (`cache_path`).
    model: A name of `tff_kd.models.MODELS`.
    norm: Its norm.
    image_shape: (H, W, C) of the experiment's images.
    seed: Initialiser and shuffle seed.
    data_dir: tfds data folder (also decoded caches).
    manual_dir: Raw files of `spec.dataset` (`tff_kd.data.load_dataset`).
    verbose: Keras' `fit` verbosity (1: a progress bar).
    callbacks: Keras callbacks for `fit` (e.g. a time budget).

  Returns:
    What was done: train and test accuracy, seconds, images; also written
    beside the weights as `<path>.json`.
  """
  shape = tuple(int(v) for v in image_shape)
  tf.keras.utils.set_random_seed(seed)
  start = time.perf_counter()
  ds = datasets.load_dataset(spec.dataset, data_dir=data_dir,
                             manual_dir=manual_dir, image_shape=shape,
                             train_limit=spec.limit or None)
  load_s = time.perf_counter() - start
  keras_model = classifiers.build_classifier(
      model, input_shape=shape, num_classes=ds.num_classes, norm=norm,
      seed=seed).model
  keras_model.compile(
      optimizer=tf.keras.optimizers.Adam(LEARNING_RATE),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=['accuracy'])
  start = time.perf_counter()
  history = keras_model.fit(ds.x_train, ds.y_train, batch_size=BATCH_SIZE,
                            epochs=spec.epochs, shuffle=True,
                            verbose=verbose, callbacks=list(callbacks))
  train_s = time.perf_counter() - start
  _, accuracy = keras_model.evaluate(ds.x_test, ds.y_test, batch_size=1000,
                                     verbose=0)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  partial = f'{path}.{os.getpid()}.partial.weights.h5'
  keras_model.save_weights(partial)
  info = dict(
      model=model, norm=norm, image_shape=list(shape), seed=int(seed),
      dataset=spec.dataset, epochs=spec.epochs, limit=spec.limit,
      batch_size=BATCH_SIZE, learning_rate=LEARNING_RATE,
      train_images=int(len(ds.y_train)), num_classes=int(ds.num_classes),
      epochs_run=len(history.history['loss']),
      train_accuracy=[round(float(a), 4)
                      for a in history.history['accuracy']],
      test_accuracy=round(float(accuracy), 4), load_s=round(load_s, 1),
      train_s=round(train_s, 1), tensorflow=tf.__version__)
  with open(f'{partial}.json', 'w') as f:
    json.dump(info, f, indent=2)
  os.replace(f'{partial}.json', f'{path}.json')
  os.replace(partial, path)
  return info


def resolve(value: str, *, key: str, model: str, norm: str,
            image_shape: Sequence[int], seed: int, data_dir: str,
            manual_dir: Optional[str]) -> str:
  """The weights path of a setting: itself, or a `pretrain:` spec's cached
  file, made first (in a child process) when it is missing.

  Raises:
    ConfigError: a bad spec, or a pretraining that failed (its last line).
  """
  if not is_spec(value):
    return value
  spec = check_spec(key, value, model)
  path = cache_path(spec, data_dir=data_dir, model=model, norm=norm,
                    image_shape=image_shape, seed=seed)
  if os.path.isfile(path):
    return path
  print(f'{key}={value!r}: pretraining {model} ({norm}) on {spec.dataset} '
        f'for {spec.epochs} epoch(s), once; the weights are cached in '
        f'{path}', file=sys.stderr, flush=True)
  command = [sys.executable, '-m', __name__, f'--path={path}',
             f'--spec={value}', f'--model={model}', f'--norm={norm}',
             '--image_shape=' + ','.join(str(int(v)) for v in image_shape),
             f'--seed={int(seed)}', f'--data_dir={data_dir}',
             f'--manual_dir={manual_dir or ""}']
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get(
      'TF_CPP_MIN_LOG_LEVEL', '2'))
  done = subprocess.run(command, stderr=subprocess.PIPE, text=True,
                        env=env, check=False)
  if done.returncode != 0 or not os.path.isfile(path):
    lines = [l for l in done.stderr.strip().splitlines() if l.strip()]
    raise errors.ConfigError(
        f'{key}={value!r}: pretraining failed: '
        f'{lines[-1] if lines else f"exit status {done.returncode}"}')
  return path


def main(argv: Optional[Sequence[str]] = None) -> None:
  """The child process of `resolve`: one pretraining, errors as one line."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  for name in ('path', 'spec', 'model', 'norm', 'image_shape', 'data_dir',
               'manual_dir'):
    parser.add_argument(f'--{name}', required=True)
  parser.add_argument('--seed', type=int, required=True)
  args = parser.parse_args(argv)
  try:
    info = pretrain(parse_spec(args.spec), path=args.path, model=args.model,
                    norm=args.norm,
                    image_shape=[int(v) for v in args.image_shape.split(',')],
                    seed=args.seed, data_dir=args.data_dir or None,
                    manual_dir=args.manual_dir or None)
  except errors.UserError as e:  # Data or config errors: one line.
    print(f'{type(e).__name__}: {e}', file=sys.stderr)
    sys.exit(1)
  print(f'pretrained: {info["dataset"]} test accuracy '
        f'{info["test_accuracy"]:.4f} in {info["train_s"]} s', flush=True)


if __name__ == '__main__':
  main()
