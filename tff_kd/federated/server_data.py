"""Data the server holds for KD methods, on disk and read inside TFF.

Server-side distillation (FedDF, Lin et al., NeurIPS 2020; FedD3A) needs an
unlabeled proxy pool, and FedDF's drop-worst a small labeled validation set.
Embedding them in the server computation as constants would put tens of MB
into every serialised computation, so, like `FileClientData`, they are
written once as serialised tensors and the server's TensorFlow computation
reads them from their paths each round (`read_pool`, `read_validation`).
"""

import json
import os
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_kd import errors

_MANIFEST = 'server_manifest.json'


class ServerData:
  """The server's unlabeled proxy pool and labeled validation set (each
  optional, not both absent)."""

  def __init__(self, directory: str):
    """Opens server data written by `ServerData.create`.

    Raises:
      DataError: the folder holds no server data.
    """
    self.directory = os.path.abspath(directory)
    path = os.path.join(self.directory, _MANIFEST)
    if not os.path.exists(path):
      raise errors.DataError(f'no server data in {self.directory}: '
                             f'{_MANIFEST} is missing')
    with open(path) as f:
      manifest = json.load(f)
    self.pool_size: int = manifest['pool_size']
    self.val_size: int = manifest['val_size']
    self.image_shape: tuple[int, ...] = tuple(manifest['image_shape'])
    self.proxy_name: str = manifest.get('proxy_name', '')

  @classmethod
  def create(cls, directory: str, pool_x: Optional[np.ndarray],
             val_x: Optional[np.ndarray] = None,
             val_y: Optional[np.ndarray] = None, *,
             proxy_name: str = '') -> 'ServerData':
    """Writes the pool (and validation set) as tensor files.

    Args:
      directory: Output folder (created).
      pool_x: Unlabeled proxy images [N, H, W, C], N >= 1 (labels are never
        written: the server must not see them), or None: no pool, only the
        labeled validation set (the data-free methods' link tables).
      val_x: Optional labeled validation images [V, H, W, C].
      val_y: Their integer labels [V].
      proxy_name: Where the pool came from, for reports.

    Returns:
      The opened `ServerData`.

    Raises:
      DataError: an empty pool, neither a pool nor a validation set, or
        mismatched validation arrays.
    """
    if pool_x is not None:
      pool_x = np.asarray(pool_x, np.float32)
      if pool_x.ndim < 2 or len(pool_x) == 0:
        raise errors.DataError(
            f'the proxy pool must be a non-empty [N, ...] array, got shape '
            f'{pool_x.shape}')
    val_size = 0
    if val_x is not None or val_y is not None:
      if val_x is None or val_y is None or len(val_x) != len(val_y):
        raise errors.DataError('the server validation set needs images and '
                               'labels of the same length')
      val_x = np.asarray(val_x, np.float32)
      if pool_x is not None and val_x.shape[1:] != pool_x.shape[1:]:
        raise errors.DataError(
            f'server validation images {val_x.shape[1:]} and proxy images '
            f'{pool_x.shape[1:]} differ in shape')
      val_size = len(val_y)
    if pool_x is None and not val_size:
      raise errors.DataError('server data needs a proxy pool or a labeled '
                             'validation set')
    os.makedirs(directory, exist_ok=True)
    arrays = [] if pool_x is None else [('pool.x', pool_x)]
    if val_size:
      arrays += [('val.x', val_x), ('val.y', np.asarray(val_y, np.int32))]
    for name, arr in arrays:
      tf.io.write_file(os.path.join(directory, name),
                       tf.io.serialize_tensor(tf.convert_to_tensor(arr)))
    shape = (pool_x if pool_x is not None else val_x).shape[1:]
    with open(os.path.join(directory, _MANIFEST), 'w') as f:
      json.dump(dict(pool_size=0 if pool_x is None else int(len(pool_x)),
                     val_size=val_size, image_shape=list(shape),
                     proxy_name=proxy_name), f)
    return cls(directory)

  def read_pool(self) -> tf.Tensor:
    """The proxy pool [N, H, W, C] (graph- or eager-mode).

    Raises:
      ConfigError: the server data holds no pool (`server_data.proxy`
        unset).
    """
    if not self.pool_size:
      raise errors.ConfigError(
          'this method needs an unlabeled server pool: set '
          'server_data.proxy and server_data.proxy_size')
    x = tf.io.parse_tensor(
        tf.io.read_file(os.path.join(self.directory, 'pool.x')), tf.float32)
    x.set_shape([self.pool_size, *self.image_shape])
    return x

  def read_validation(self) -> tuple[tf.Tensor, tf.Tensor] | None:
    """(images, labels) of the validation set, or None when there is none."""
    if not self.val_size:
      return None
    x = tf.io.parse_tensor(
        tf.io.read_file(os.path.join(self.directory, 'val.x')), tf.float32)
    y = tf.io.parse_tensor(
        tf.io.read_file(os.path.join(self.directory, 'val.y')), tf.int32)
    x.set_shape([self.val_size, *self.image_shape])
    y.set_shape([self.val_size])
    return x, y
