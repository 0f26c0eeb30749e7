"""Client datasets served to TFF as a dataset computation over file keys.

Materialising each client's `tf.data.Dataset` in Python and passing it into a
TFF computation serialises the whole dataset into the call every round. Here
each client's arrays are written once, as serialised tensors, and the round's
datasets are built *inside* the TFF runtime from a short string key

    "<client_id>|<seed>|<round>"

by `dataset_computation`, which is composed in front of a learning process
(`tff.simulation.compose_dataset_computation_with_learning_process`). The key
carries the shuffle seed, so every round sees a fresh, reproducible shuffle
(FedGen's reference code trained on an unshuffled loader, which inflated its
gains), and a resumed run replays exactly the same batches.

Local work is either a number of optimiser steps (FedGen, FedAvg papers) or a
number of full epochs (DaFKD, FedDF): see `LocalWork`.
"""

import collections
import json
import os
import re
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

_MANIFEST = 'manifest.json'
LOCAL_UNITS = ('steps', 'epochs')


class LocalWork(NamedTuple):
  """How much local training a client does per round.

  Attributes:
    unit: 'steps' (a fixed number of mini-batches, cycling through the data)
      or 'epochs' (full passes, the last batch may be partial).
    amount: Number of steps or epochs, >= 1.
    batch_size: Mini-batch size, >= 1.
  """

  unit: str
  amount: int
  batch_size: int

  def validate(self) -> 'LocalWork':
    if self.unit not in LOCAL_UNITS:
      raise ValueError(f"local work unit {self.unit!r} is unknown; choose one "
                       f"of {', '.join(LOCAL_UNITS)}")
    if self.amount < 1 or self.batch_size < 1:
      raise ValueError(f'local work needs amount >= 1 and batch_size >= 1, '
                       f'got amount={self.amount}, '
                       f'batch_size={self.batch_size}')
    return self


def element_spec(image_shape: Sequence[int]) -> collections.OrderedDict:
  """The batch structure every client dataset yields."""
  return collections.OrderedDict(
      x=tf.TensorSpec([None, *image_shape], tf.float32),
      y=tf.TensorSpec([None], tf.int32))


def shuffled_batches(x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor,
                     local: LocalWork) -> tf.data.Dataset:
  """One client's round of batches, reshuffled every epoch from `seed`."""
  num = tf.shape(y, out_type=tf.int64)[0]
  ds = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y))
  ds = ds.shuffle(num, seed=seed, reshuffle_each_iteration=True)
  if local.unit == 'epochs':
    # Batch before repeating so that no batch straddles two epochs.
    return ds.batch(local.batch_size).repeat(local.amount)
  return ds.repeat().batch(local.batch_size).take(local.amount)


def _batch_order(num: int, seed: int,
                 local: LocalWork) -> tuple[tf.Tensor, tf.Tensor]:
  """(example indices, batch sizes) of `shuffled_batches`' first pass.

  Built and run in a fresh graph, as inside a TFF computation: a dataset
  made eagerly would take TF's eager global seed (set e.g. by
  `tf.random.set_seed`) into its shuffle's seed pair, and so its order.
  """
  with tf.Graph().as_default() as graph:
    index = tf.range(num, dtype=tf.int64)
    ds = shuffled_batches(index, index, tf.constant(seed, tf.int64), local)
    flat = ds.reduce(tf.zeros([0], tf.int64),
                     lambda acc, b: tf.concat([acc, b['y']], 0))
    sizes = ds.reduce(tf.zeros([0], tf.int64), lambda acc, b: tf.concat(
        [acc, tf.shape(b['y'], out_type=tf.int64)], 0))
    with tf.compat.v1.Session(graph=graph) as session:
      flat, sizes = session.run([flat, sizes])
  return tf.constant(flat), tf.constant(sizes)


def _round_seed(parts: tf.Tensor) -> tf.Tensor:
  """The int64 seed of a split `"<id>|<seed>|<round>"` key's round."""
  return (tf.strings.to_number(parts[1], tf.int64) * 1_000_003 +
          tf.strings.to_number(parts[2], tf.int64))


def _op_error_reason(e: tf.errors.OpError) -> str:
  """A TF op error's message without the op's and the payload's dumps."""
  text = (e.message or type(e).__name__).strip().splitlines()[0]
  text = re.sub(r'\{\{[^}]*\}\}\s*', '', text).split(', base64:')[0]
  return re.sub(r'\s*\[Op:.*$', '', text).rstrip('.') or type(e).__name__


class FileClientData:
  """Per-client arrays on disk plus the TFF computation that reads them."""

  def __init__(self, directory: str):
    """Opens client data previously written by `FileClientData.create`.

    Args:
      directory: Folder holding `manifest.json` and the tensor files.

    Raises:
      FileNotFoundError: if the manifest is missing.
    """
    self.directory = os.path.abspath(directory)
    with open(os.path.join(self.directory, _MANIFEST)) as f:
      manifest = json.load(f)
    self.client_ids: list[str] = manifest['client_ids']
    self.num_examples: list[int] = manifest['num_examples']
    self.image_shape: tuple[int, ...] = tuple(manifest['image_shape'])

  @classmethod
  def create(cls, directory: str, x: np.ndarray, y: np.ndarray,
             partitions: Sequence[np.ndarray]) -> 'FileClientData':
    """Writes one `<id>.x` / `<id>.y` tensor-file pair per client.

    Args:
      directory: Output folder (created).
      x: All training images, float32 NHWC.
      y: All training labels, integer.
      partitions: Index arrays, one per client.

    Returns:
      The opened `FileClientData`.
    """
    os.makedirs(directory, exist_ok=True)
    ids = [str(i) for i in range(len(partitions))]
    for cid, idx in zip(ids, partitions):
      for suffix, arr in (('x', x[idx].astype(np.float32)),
                          ('y', y[idx].astype(np.int32))):
        tf.io.write_file(
            os.path.join(directory, f'{cid}.{suffix}'),
            tf.io.serialize_tensor(tf.convert_to_tensor(arr)))
    manifest = dict(client_ids=ids,
                    num_examples=[int(len(p)) for p in partitions],
                    image_shape=list(x.shape[1:]))
    # Written last, so a half-written folder is never mistaken for a full one.
    with open(os.path.join(directory, _MANIFEST), 'w') as f:
      json.dump(manifest, f)
    return cls(directory)

  @property
  def element_spec(self) -> collections.OrderedDict:
    return element_spec(self.image_shape)

  def _parse_x(self, path: tf.Tensor) -> tf.Tensor:
    """A client's images file as float32 [N, *image_shape]; an error if it
    cannot be read or parsed or has another dtype or shape."""
    x = tf.io.parse_tensor(tf.io.read_file(path), tf.float32)
    return tf.ensure_shape(x, [None, *self.image_shape])

  def _parse_y(self, path: tf.Tensor) -> tf.Tensor:
    """A client's labels file as int32 [N]; an error as in `_parse_x`."""
    return tf.ensure_shape(
        tf.io.parse_tensor(tf.io.read_file(path), tf.int32), [None])

  def read_arrays(self, client_id: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Reads one client's images and labels (graph- or eager-mode).

    Bad client data is a client fault, not the run's: when a file cannot
    be read or parsed (missing, truncated, corrupt) or holds arrays of
    another dtype or shape, or the two files disagree on the number of
    examples, the client gets one NaN image instead. Its update is then
    non-finite, so the round excludes and counts it (`client/num_excluded`,
    `tff_kd.federated.client_works.screen_client`) exactly as a client whose
    data holds NaNs; `problem` names the file for the driver's warning.
    (The errors are caught with `tf.data`'s `ignore_errors`, the one
    error-catching construct a TF graph has: the reads run inside TFF's
    worker, where an error would end the whole round.)
    """
    prefix = tf.strings.join([self.directory, '/', client_id])

    @tf.autograph.experimental.do_not_convert
    def parse(prefix):
      x = self._parse_x(prefix + '.x')
      y = self._parse_y(prefix + '.y')
      with tf.control_dependencies([tf.debugging.assert_equal(
          tf.shape(x)[0], tf.shape(y)[0])]):
        return tf.identity(x), tf.identity(y)

    bad = (tf.fill([1, *self.image_shape], float('nan')),
           tf.zeros([1], tf.int32))
    x, y = (tf.data.Dataset.from_tensors(prefix).map(parse).ignore_errors()
            .concatenate(tf.data.Dataset.from_tensors(bad)).take(1)
            .get_single_element())
    x.set_shape([None, *self.image_shape])
    y.set_shape([None])
    return x, y

  def problem(self, client_index: int) -> Optional[str]:
    """Why a client's data cannot be used, naming the file, or None.

    What `read_arrays` replaces by a NaN image, checked eagerly on the
    driver (for the warning of a round that excluded clients).
    """
    prefix = os.path.join(self.directory, self.client_ids[client_index])
    arrays = []
    for path, parse in ((prefix + '.x', self._parse_x),
                        (prefix + '.y', self._parse_y)):
      try:
        arrays.append(parse(tf.constant(path)))
      except tf.errors.OpError as e:
        return f'{path}: {_op_error_reason(e)}'
    if arrays[0].shape[0] != arrays[1].shape[0]:
      return (f'{prefix}.y: {arrays[1].shape[0]} labels for '
              f'{arrays[0].shape[0]} images in {prefix}.x')
    return None

  def dataset_from_key(self, key: tf.Tensor,
                       local: LocalWork) -> tf.data.Dataset:
    """The round's dataset for a `"<id>|<seed>|<round>"` key."""
    parts = tf.strings.split(key, '|')
    x, y = self.read_arrays(parts[0])
    return shuffled_batches(x, y, _round_seed(parts), local)

  def replayable_dataset(self, key: str, local: LocalWork) -> tf.data.Dataset:
    """`dataset_from_key`'s batches, the same on every pass (eager only).

    A `dataset_from_key` dataset reshuffles on every pass over it, inside a
    TFF computation as well (its shuffle's seed state advances), so only a
    dataset built again from the key sees the first pass's order again
    (FedD3A's projection gets its own; `fedd3a_tf.client_round`). This one
    fixes the order up front: the example indices of `dataset_from_key`'s
    first pass, gathered from the client's arrays in every pass.

    Args:
      key: `"<id>|<seed>|<round>"`.
      local: The local work.

    Returns:
      A `tf.data.Dataset` of the same batches as `dataset_from_key`.
    """
    parts = key.split('|')
    x, y = self.read_arrays(tf.constant(parts[0]))
    indices, sizes = _batch_order(
        int(y.shape[0]), int(parts[1]) * 1_000_003 + int(parts[2]),
        local.validate())
    ends = tf.cumsum(sizes)
    starts = ends - sizes
    bounds = tf.data.Dataset.from_tensor_slices((starts, ends))
    return bounds.map(lambda s, e: collections.OrderedDict(
        x=tf.gather(x, indices[s:e]), y=tf.gather(y, indices[s:e])))

  def dataset_fn(self, local: LocalWork) -> 'KeyedDatasets':
    """A TF-traceable key -> dataset function for clients that build their
    own dataset (see `tff_kd.federated.tff_types.client_data_type`)."""
    return KeyedDatasets(self, local.validate())

  def dataset_computation(self, local: LocalWork) -> tff.Computation:
    """A TFF computation mapping a key string to the client's dataset."""
    local = local.validate()

    @tff.tensorflow.computation(np.str_)
    def client_dataset(key):
      return self.dataset_from_key(key, local)

    return client_dataset

  def keys(self, client_indices: Sequence[int], *, seed: int,
           round_num: int) -> list[str]:
    """Keys for `dataset_computation`, one per sampled client."""
    return [f'{self.client_ids[i]}|{seed}|{round_num}' for i in client_indices]


class KeyedDatasets:
  """key -> the client's dataset of the round: `FileClientData`'s keyed path.

  Calling it gives `dataset_from_key`'s batches. Fused clients
  (`tff_kd.core.fused`, `runtime.client_execution='fused'`) take the key's arrays
  instead (`arrays`) and draw their batch order themselves.

  Attributes:
    data: The client data.
    local: The local work.
  """

  def __init__(self, data: FileClientData, local: LocalWork):
    self.data = data
    self.local = local

  def __call__(self, key: tf.Tensor) -> tf.data.Dataset:
    return self.data.dataset_from_key(key, self.local)

  def arrays(self, key: tf.Tensor
             ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """A key's (images, labels, stateless seed) in graph code.

    The seed is [2] int64: the key's seed and round (as `dataset_from_key`
    combines them) and a hash of its client id, so that clients of the same
    size draw different orders. The empty key (a padded group,
    `learning.group_keys`) has no examples.
    """
    parts = tf.strings.split(key, '|')
    empty = tf.equal(tf.strings.length(key), 0)

    def read():
      x, y = self.data.read_arrays(parts[0])
      return x, y, tf.stack([
          _round_seed(parts),
          tf.strings.to_hash_bucket_fast(parts[0], 2**31 - 1)])

    def none():
      return (tf.zeros([0, *self.data.image_shape]), tf.zeros([0], tf.int32),
              tf.zeros([2], tf.int64))

    x, y, seed = tf.cond(empty, none, read)
    x.set_shape([None, *self.data.image_shape])
    y.set_shape([None])
    return x, y, seed
