"""TFF's `ClientData` as the library's client data, read per round.

`tff.simulation.datasets.ClientData` (EMNIST by writer, CIFAR-100, a user's
own) is how TFF's users hold federated data. `TFFClientData` wraps one so
that every part of the program (`tff_kd.program.experiment.prepare` and
`run`, resume, `tff.learning.programs.train_model` through
`tff_kd.program.tff_programs.ClientDataSource`) takes it like the library's
own `FileClientData`:

* the partition is the `ClientData`'s own clients: client k is
  `client_ids[k]` (sorted as the `ClientData` lists them), and a round's
  keys are `"<k>|<seed>|<round>"`, the same keys `FileClientData` uses, so
  sampling, per-client seeds and the per-client stores of DaFKD, FedGen and
  heterogeneous FedDF / FedD3A work unchanged;
* nothing is read up front: a sampled client's examples are read at round
  time, inside the TFF computation, by the `ClientData`'s
  `serializable_dataset_fn` (a SQL query for TFF's own datasets), mapped to
  the library's `(x, y)` elements by an element function, and batched with
  `FileClientData`'s reproducible per-round shuffle. A `ClientData` larger
  than memory is therefore never loaded whole; one client's examples are
  held while it trains.

Elements: TFF's datasets yield dicts (EMNIST: `pixels` [28, 28] float in
[0, 1], `label`; CIFAR-100: `image` [32, 32, 3] uint8, `label`). By default
`x_key` / `y_key` name the image and label, the image is divided by
`pixel_max` into [0, 1], given a channel axis if it has none, and
normalised like every dataset of the library, `(p - 0.5) / 0.5`. Any other
structure takes an `element_fn(element) -> (x, y)` that returns a float32
HWC image already normalised that way and an integer label.
"""

import hashlib
import json
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.federated import client_data as client_data_lib

ElementFn = Callable[[Any], tuple[tf.Tensor, tf.Tensor]]

# The `ClientDataSourceIterator` source of a `TFFClientData` (it has no
# folder): this prefix and its `identity`.
SOURCE_PREFIX = 'tff_client_data:'
# Adapters made in this process, by identity, so that a data-source
# iterator restored from its bytes (a `train_model` program state) finds its
# `ClientData` again.
_OPENED: dict[str, 'TFFClientData'] = {}
# A client's examples are read in blocks of this many and concatenated.
_BLOCK = 1024


def pixels_and_label(x_key: str = 'pixels', y_key: str = 'label',
                     pixel_max: float = 1.0) -> ElementFn:
  """The default element function: `(normalised image, int32 label)`.

  Args:
    x_key: The image's key in an element (EMNIST 'pixels', CIFAR 'image').
    y_key: The label's key.
    pixel_max: The image's white value (1.0 for EMNIST, 255 for uint8
      images); pixels are divided by it, then normalised as `(p - 0.5) / 0.5`.

  Returns:
    `element -> (x [H, W, C] float32, y int32)`; an [H, W] image gets C = 1.
  """

  def element_fn(element):
    x = tf.cast(element[x_key], tf.float32) / pixel_max
    if x.shape.rank == 2:
      x = x[..., tf.newaxis]
    # Exactly `tff_kd.data.normalise`: (p - 0.5) * 2.
    return (x - 0.5) * 2.0, tf.cast(element[y_key], tf.int32)

  return element_fn


def _whole(element_fn: ElementFn) -> Callable[..., Any]:
  """`element_fn` as a `Dataset.map` function: tf.data splits tuple
  elements into arguments; `element_fn` takes the element whole."""
  return lambda *e: element_fn(e[0] if len(e) == 1 else e)


def _ids_digest(client_ids: Sequence[str]) -> str:
  return hashlib.sha256(json.dumps(list(client_ids)).encode()).hexdigest()[:16]


class TFFClientData(client_data_lib.FileClientData):
  """A `tff.simulation.datasets.ClientData` served as the library's clients.

  It keeps `FileClientData`'s interface (`client_ids`, `element_spec`,
  `keys`, `dataset_fn`, `dataset_computation`, `dataset_from_key`,
  `replayable_dataset`), reading a client's arrays from the `ClientData`
  instead of a folder (`read_arrays`), so the builders, the round loop and
  `train_model`'s data source take it unchanged.

  Attributes:
    source: The wrapped `ClientData`.
    name: The user's name for it (in the run's config and reports).
    num_classes: Number of labels.
    element_fn: `element -> (x, y)` (see the module docstring).
    client_ids: The clients of the federation, in key order.
    image_shape: One image's [H, W, C].
    identity: `'<name>:<digest of the client ids>'`: what a run folder
      records (`dataset.client_data`) and checks on resume.
    num_examples: None: a client's size is known only once it is read.
  """

  def __init__(self, client_data: tff.simulation.datasets.ClientData, *,
               name: str, num_classes: int,
               element_fn: Optional[ElementFn] = None,
               x_key: str = 'pixels', y_key: str = 'label',
               pixel_max: float = 1.0,
               client_ids: Optional[Sequence[str]] = None):
    """Wraps `client_data`; reads none of its examples.

    Args:
      client_data: Any `ClientData` with a `serializable_dataset_fn` (every
        one TFF builds: `from_clients_and_tf_fn`, `preprocess`, the SQL- and
        file-backed datasets of `tff.simulation.datasets`).
      name: A short name for it, recorded in the run folder; a resumed run
        must give the same one.
      num_classes: Number of labels (>= 2); labels are in [0, num_classes).
      element_fn: Maps one element to `(x, y)`; default
        `pixels_and_label(x_key, y_key, pixel_max)`.
      x_key: See `pixels_and_label`.
      y_key: See `pixels_and_label`.
      pixel_max: See `pixels_and_label`.
      client_ids: The clients to use (default: all, as the `ClientData`
        lists them).

    Raises:
      ConfigError: a bad name, class count, client list, a `ClientData`
        without a serialisable dataset function, or elements the element
        function does not map to one image and one scalar label.
    """
    if not isinstance(client_data, tff.simulation.datasets.ClientData):
      raise errors.ConfigError(
          'client_data must be a tff.simulation.datasets.ClientData, got '
          f'{type(client_data).__name__}')
    if not isinstance(name, str) or not name:
      raise errors.ConfigError(
          f"the ClientData's name must be a non-empty string, got {name!r}")
    if not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
      raise errors.ConfigError(
          f'num_classes must be an integer >= 2, got {num_classes!r}')
    try:
      dataset_fn = client_data.serializable_dataset_fn
    except (NotImplementedError, AttributeError, TypeError):
      dataset_fn = None
    if not callable(dataset_fn):
      raise errors.ConfigError(
          f'{type(client_data).__name__} has no serializable_dataset_fn, so '
          'its clients cannot be read inside a TFF computation; build it '
          'with ClientData.from_clients_and_tf_fn')
    ids = list(client_data.client_ids if client_ids is None else client_ids)
    if not ids:
      raise errors.ConfigError(f'ClientData {name!r} has no clients')
    self.source = client_data
    self.name = name
    self.num_classes = int(num_classes)
    self.element_fn = element_fn or pixels_and_label(x_key, y_key, pixel_max)
    self.client_ids: list[str] = [str(i) for i in ids]
    self.num_examples = None
    self.directory = None
    self._dataset_fn = dataset_fn
    self.image_shape = self._mapped_shape()
    self.identity = f'{name}:{_ids_digest(self.client_ids)}'
    _OPENED[self.identity] = self

  def _mapped_shape(self) -> tuple[int, ...]:
    """One image's shape, from the element spec alone (nothing is read)."""
    spec = self.source.element_type_structure
    try:
      with tf.Graph().as_default():
        zeros = tf.nest.map_structure(
            lambda s: tf.zeros([d or 1 for d in s.shape], s.dtype), spec)
        out = tf.data.Dataset.from_tensors(zeros).map(
            _whole(self.element_fn)).element_spec
    except (KeyError, TypeError, ValueError) as e:
      raise errors.ConfigError(
          f'the element function of ClientData {self.name!r} does not map '
          f'its elements {spec} to (image, label): '
          f'{str(e).splitlines()[0] if str(e) else type(e).__name__}'
      ) from None
    if not isinstance(out, tuple) or len(out) != 2 or (
        out[0].shape.rank != 3 or not out[0].shape.is_fully_defined()
        or out[1].shape.rank != 0):
      raise errors.ConfigError(
          f'the element function of ClientData {self.name!r} must return '
          f'(x [H, W, C], y scalar), got {out}')
    return tuple(int(d) for d in out[0].shape)

  def _mapped(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset`'s elements as float32 (x, y) pairs."""
    element_fn = _whole(self.element_fn)
    return dataset.map(lambda *e: tuple(
        tf.cast(v, d) for v, d in zip(element_fn(*e), (tf.float32, tf.int32))))

  def subset(self, client_ids: Sequence[str]) -> 'TFFClientData':
    """The same `ClientData` restricted to `client_ids` (a new identity)."""
    return TFFClientData(self.source, name=self.name,
                         num_classes=self.num_classes,
                         element_fn=self.element_fn, client_ids=client_ids)

  def client_dataset(self, client_id: Any) -> tf.data.Dataset:
    """One client's (x, y) examples, unbatched; `client_id` is its string
    id (a Python str or a tf.string tensor)."""
    return self._mapped(self._dataset_fn(client_id))

  def read_arrays(self, client_id: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Reads client `client_id`'s examples (graph- or eager-mode).

    Args:
      client_id: The key's first field: the client's index k in
        `client_ids`, as a decimal string tensor.

    Returns:
      (images [n, H, W, C] float32, labels [n] int32): only this client's.
    """
    index = tf.strings.to_number(client_id, tf.int32)
    cid = tf.gather(tf.constant(self.client_ids), index)
    batched = self.client_dataset(cid).batch(_BLOCK)
    x0 = tf.zeros([0, *self.image_shape], tf.float32)
    y0 = tf.zeros([0], tf.int32)
    x, y = batched.reduce(
        (x0, y0), lambda acc, b: (tf.concat([acc[0], b[0]], 0),
                                  tf.concat([acc[1], b[1]], 0)))
    x.set_shape([None, *self.image_shape])
    y.set_shape([None])
    return x, y

  def keys(self, client_indices: Sequence[int], *, seed: int,
           round_num: int) -> list[str]:
    """Keys for `dataset_computation`, one per sampled client index."""
    return [f'{int(i)}|{seed}|{round_num}' for i in client_indices]

  def arrays(self, client_ids: Sequence[str]) -> tuple[np.ndarray,
                                                       np.ndarray]:
    """The examples of `client_ids`, in that order, as numpy arrays (eager:
    for the few clients the server holds out, never the federation)."""
    xs, ys = [np.zeros([0, *self.image_shape], np.float32)], [
        np.zeros([0], np.int32)]
    for cid in client_ids:
      for x, y in self.client_dataset(cid).batch(4096).as_numpy_iterator():
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def source_of(clients: client_data_lib.FileClientData) -> str:
  """What a data-source iterator records to reopen `clients`: a
  `FileClientData`'s folder or a `TFFClientData`'s identity."""
  if isinstance(clients, TFFClientData):
    return SOURCE_PREFIX + clients.identity
  return clients.directory


def open_source(source: str) -> client_data_lib.FileClientData:
  """The client data of a `source_of` string.

  Raises:
    DataError: a `TFFClientData` that this process has not made (rebuild it
      with the same `ClientData` and name before resuming).
  """
  if not source.startswith(SOURCE_PREFIX):
    return client_data_lib.FileClientData(source)
  identity = source[len(SOURCE_PREFIX):]
  if identity not in _OPENED:
    raise errors.DataError(
        f'the ClientData {identity!r} of this data source is not open in '
        'this process; wrap the same ClientData with TFFClientData (same '
        'name) before resuming')
  return _OPENED[identity]


def central_test_set(test_data: Any,
                     clients: TFFClientData) -> tuple[np.ndarray, np.ndarray]:
  """A central test set as `(x, y)` arrays, read whole.

  Args:
    test_data: `(x, y)` numpy arrays (x normalised like the training data);
      a `tf.data.Dataset` of such `(x, y)` pairs, batched or not; a test
      `ClientData` (every client's examples, mapped by `clients`'
      element function); or a `TFFClientData`.
    clients: The training clients, for the element function and checks.

  Returns:
    (x [m, H, W, C] float32, y [m] int32).

  Raises:
    ConfigError: an unsupported type, or images of another shape, or labels
      out of [0, num_classes).
  """
  if isinstance(test_data, tff.simulation.datasets.ClientData):
    test_data = TFFClientData(test_data, name=clients.name + '_test',
                              num_classes=clients.num_classes,
                              element_fn=clients.element_fn)
  if isinstance(test_data, TFFClientData):
    test_data = test_data._mapped(  # pylint: disable=protected-access
        test_data.source.create_tf_dataset_from_all_clients())
  if isinstance(test_data, tf.data.Dataset):
    batches = list(test_data.as_numpy_iterator())
    if not batches or not isinstance(batches[0], tuple):
      raise errors.ConfigError(
          'a test tf.data.Dataset must yield (x, y) pairs')
    xs = [np.asarray(b[0]) for b in batches]
    ys = [np.asarray(b[1]) for b in batches]
    if xs[0].ndim == len(clients.image_shape):
      test_data = (np.stack(xs), np.stack(ys))
    else:
      test_data = (np.concatenate(xs), np.concatenate(ys))
  if not (isinstance(test_data, tuple) and len(test_data) == 2):
    raise errors.ConfigError(
        'test_data must be (x, y) arrays, a tf.data.Dataset of (x, y), or a '
        f'ClientData; got {type(test_data).__name__}')
  x = np.asarray(test_data[0], np.float32)
  y = np.asarray(test_data[1]).astype(np.int32)
  if x.shape[1:] != clients.image_shape or y.shape != x.shape[:1]:
    raise errors.ConfigError(
        f'test images {x.shape} and labels {y.shape} do not match the '
        f'training images {clients.image_shape}')
  if len(y) and (y.min() < 0 or y.max() >= clients.num_classes):
    raise errors.ConfigError(
        f'test labels must be in [0, {clients.num_classes}), got '
        f'[{y.min()}, {y.max()}]')
  return x, y


__all__ = ['TFFClientData', 'pixels_and_label', 'source_of', 'open_source',
           'central_test_set', 'ElementFn']
