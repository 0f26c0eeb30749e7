"""Image classification datasets as normalised numpy arrays.

Sources:

* tensorflow-datasets: `mnist`, `fashion_mnist`, `emnist` (the balanced
  47-class split), `svhn_cropped`, `cifar10`. With `manual_dir` tfds builds
  MNIST and Fashion-MNIST offline from the canonical raw IDX files; the
  others need the network or an already prepared `data_dir`.
* raw files, for the digit-domain experiments of FedD3A (Su, Li, Xue, AAAI
  2023): `usps` from `usps.h5` (16x16 grey in [0, 1]) and `mnist_m` from
  `mnist_m.tar.gz` (32x32 RGB PNGs, Ganin & Lempitsky's MNIST-M).

Decoded arrays are cached as `.npz` under `data_dir/tff_kd_cache`, keyed by
the sizes and modification times of their sources (the raw file, or the
files of the prepared tfds dataset): MNIST then loads in ~0.1 s instead of
~4 s through tfds.
* `digits`: scikit-learn's bundled 8x8 digits (1,797 images), which need no
  download: the quick start uses it.

* `tff:<name>`: TFF's federated simulation datasets (`tff:emnist`,
  `tff:emnist_digits_only`, `tff:cifar100`), split by writer / by TFF's
  client partition: `load_tff` returns their train and test
  `tff.simulation.datasets.ClientData` (the program wraps them with
  `tff_kd.federated.tff_client_data`). They download once into
  `<data_dir>/tff` when the machine is online.

Every loader returns pixels scaled to [0, 1] and then normalised as
(p - 0.5) / 0.5, float32 NHWC, and int32 labels. The test split is never
split across clients: evaluation always uses all of it.

Every failure a user can cause (an unknown name, a missing or corrupt file,
no network) raises `tff_kd.errors.DataError` with a one-line message.
"""

import hashlib
import os
import tarfile
import uuid
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_kd import errors


class Dataset(NamedTuple):
  """A labelled train/test split.

  Attributes:
    name: Dataset name.
    x_train: float32 [n, H, W, C], normalised to [-1, 1].
    y_train: int32 [n].
    x_test: float32 [m, H, W, C].
    y_test: int32 [m].
    num_classes: Number of labels.
    train_domains: For multi-domain datasets, int32 [n] domain ids.
    test_domains: For multi-domain datasets, int32 [m] domain ids.
    domain_names: Names of the domains, indexed by domain id.
  """

  name: str
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int
  train_domains: Optional[np.ndarray] = None
  test_domains: Optional[np.ndarray] = None
  domain_names: tuple[str, ...] = ()


def normalise(pixels01: np.ndarray, *, in_place: bool = False) -> np.ndarray:
  """[0, 1] pixels -> float32 in [-1, 1] (mean 0.5, std 0.5 normalisation).

  Args:
    pixels01: Pixels in [0, 1].
    in_place: Overwrite `pixels01` when it is float32 (no new array: on
      MNIST's training set, allocating one costs ~0.5 s of page faults).
  """
  if in_place and isinstance(pixels01, np.ndarray) and (
      pixels01.dtype == np.float32) and pixels01.flags.writeable:
    out = pixels01
    out -= np.float32(0.5)
  else:
    out = np.subtract(np.asarray(pixels01, np.float32), np.float32(0.5),
                      dtype=np.float32)
  out *= np.float32(2.0)  # Exactly / 0.5.
  return out


def _find_file(manual_dir: Optional[str], subdir: str, filename: str,
               dataset: str) -> str:
  """`manual_dir/filename` or `manual_dir/subdir/filename`, else DataError."""
  if not manual_dir:
    raise errors.DataError(
        f'dataset {dataset!r} is read from {filename}; set '
        'dataset.manual_dir to the folder holding it')
  root = os.path.expanduser(manual_dir)
  for path in (os.path.join(root, filename),
               os.path.join(root, subdir, filename)):
    if os.path.isfile(path):
      return path
  raise errors.DataError(
      f'{filename} for dataset {dataset!r} not found in {root} or '
      f'{os.path.join(root, subdir)}')


def _cache_path(data_dir: Optional[str], name: str) -> Optional[str]:
  if not data_dir:
    return None
  return os.path.join(os.path.expanduser(data_dir), 'tff_kd_cache',
                      f'{name}.npz')


def _files_key(paths: Sequence[str]) -> str:
  """A key that changes when any of `paths` is replaced or changed."""
  parts = []
  for path in sorted(paths):
    stat = os.stat(path)
    parts.append(f'{os.path.basename(path)}:{stat.st_size}-'
                 f'{int(stat.st_mtime)}')
  return ';'.join(parts)


def _read_cache(data_dir: Optional[str], name: str,
                key: str) -> Optional[dict]:
  """The arrays cached under `key`, or None (no, stale or broken cache)."""
  path = _cache_path(data_dir, name)
  if path and os.path.exists(path):
    try:
      with np.load(path) as cached:
        if str(cached['key']) == key:
          return {k: cached[k] for k in cached.files if k != 'key'}
    except (OSError, ValueError, KeyError):
      pass  # A broken cache is rebuilt from the source.
  return None


def _write_cache(data_dir: Optional[str], name: str, key: str,
                 arrays: dict) -> None:
  path = _cache_path(data_dir, name)
  if path:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # A name of this writer's own: runs (or test workers) that share a
    # data_dir may fill the same cache at once; each replace is atomic.
    tmp = f'{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp.npz'
    try:
      np.savez(tmp, key=key, **arrays)
      os.replace(tmp, path)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)


def _cached(data_dir: Optional[str], name: str, source: str,
            decode: Callable[[], dict]) -> dict:
  """Decodes `source` once; later calls read `data_dir/tff_kd_cache`.

  The cache is keyed by the source file's size and mtime, so a replaced
  source file is decoded again.
  """
  key = _files_key([source])
  arrays = _read_cache(data_dir, name, key)
  if arrays is None:
    arrays = decode()
    _write_cache(data_dir, name, key, arrays)
  return arrays


def _load_usps(data_dir: Optional[str], manual_dir: Optional[str]) -> dict:
  path = _find_file(manual_dir, 'usps', 'usps.h5', 'usps')

  def decode():
    import h5py  # pylint: disable=g-import-not-at-top
    try:
      with h5py.File(path, 'r') as f:
        out = {}
        for split in ('train', 'test'):
          x = np.asarray(f[split]['data'], np.float32).reshape(-1, 16, 16, 1)
          out[f'x_{split}'] = x
          out[f'y_{split}'] = np.asarray(f[split]['target'], np.int32)
        return out
    except (OSError, KeyError, ValueError) as e:
      raise errors.DataError(f'{path} is not a readable USPS file: '
                             f'{_first_line(e)}') from None

  return _cached(data_dir, 'usps', path, decode)


def _load_mnist_m(data_dir: Optional[str], manual_dir: Optional[str]) -> dict:
  path = _find_file(manual_dir, 'mnist_m', 'mnist_m.tar.gz', 'mnist_m')

  def decode():
    try:
      with tarfile.open(path, 'r:gz') as tar:
        members = {m.name: m for m in tar.getmembers() if m.isfile()}
        out = {}
        for split in ('train', 'test'):
          labels_name = f'mnist_m/mnist_m_{split}_labels.txt'
          lines = tar.extractfile(members[labels_name]).read().decode()
          names, labels = zip(*(line.split() for line in lines.splitlines()
                                if line.strip()))
          images = np.stack([
              tf.io.decode_png(tar.extractfile(
                  members[f'mnist_m/mnist_m_{split}/{n}']).read(),
                               channels=3).numpy() for n in names])
          out[f'x_{split}'] = images.astype(np.float32) / 255.0
          out[f'y_{split}'] = np.asarray(labels, np.int32)
        return out
    except (OSError, KeyError, EOFError, ValueError, tarfile.TarError,
            tf.errors.OpError) as e:
      raise errors.DataError(f'{path} is not a readable MNIST-M archive: '
                             f'{_first_line(e)}') from None

  return _cached(data_dir, 'mnist_m', path, decode)


def _load_digits(data_dir: Optional[str], manual_dir: Optional[str]) -> dict:
  del data_dir, manual_dir  # Bundled with scikit-learn.
  from sklearn import datasets as sk_datasets  # pylint: disable=g-import-not-at-top
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top
  digits = sk_datasets.load_digits()
  x = (digits.images / 16.0).astype(np.float32)[..., None]
  x_train, x_test, y_train, y_test = model_selection.train_test_split(
      x, digits.target.astype(np.int32), test_size=0.2, random_state=0,
      stratify=digits.target)
  return dict(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


# tfds name and the config it is loaded with.
_TFDS = {
    'mnist': 'mnist',
    'fashion_mnist': 'fashion_mnist',
    'emnist': 'emnist/balanced',
    'svhn_cropped': 'svhn_cropped',
    'cifar10': 'cifar10',
}
# Datasets tfds builds offline from the canonical raw IDX files.
_IDX_DATASETS = ('mnist', 'fashion_mnist')
_IDX_FILES = ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz',
              't10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz')
_RAW = {'usps': _load_usps, 'mnist_m': _load_mnist_m, 'digits': _load_digits}
DATASETS: tuple[str, ...] = tuple(_TFDS) + tuple(_RAW)


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def _tfds_root(data_dir: Optional[str]) -> str:
  return os.path.expanduser(
      data_dir or os.environ.get('TFDS_DATA_DIR', '~/tensorflow_datasets'))


def _tfds_key(name: str, data_dir: Optional[str]) -> Optional[str]:
  """The cache key of a prepared tfds dataset: its files' names, sizes and
  mtimes (None if it is not prepared)."""
  folder = os.path.join(_tfds_root(data_dir), _TFDS[name])
  paths = [os.path.join(d, f) for d, _, files in os.walk(folder)
           for f in files if not f.endswith('.lock')]
  return _files_key(paths) if paths else None


def _load_tfds(name: str, data_dir: Optional[str],
               manual_dir: Optional[str]) -> dict:
  if manual_dir and not os.path.isdir(os.path.expanduser(manual_dir)):
    raise errors.DataError(f'dataset.manual_dir {manual_dir} does not exist')
  cache_name = f'tfds_{name}'
  key = _tfds_key(name, data_dir)
  arrays = key and _read_cache(data_dir, cache_name, key)
  if not arrays:
    arrays = _prepare_tfds(name, data_dir, manual_dir)
    key = _tfds_key(name, data_dir)
    if key:
      _write_cache(data_dir, cache_name, key, arrays)
  arrays = dict(arrays)
  for split in ('train', 'test'):
    x = arrays[f'x_{split}'].astype(np.float32)
    x /= np.float32(255.0)
    if name == 'emnist':
      # tfds stores EMNIST transposed relative to the usual orientation.
      x = np.transpose(x, (0, 2, 1, 3))
    arrays[f'x_{split}'] = x
  return arrays


def _prepare_tfds(name: str, data_dir: Optional[str],
                  manual_dir: Optional[str]) -> dict:
  """Builds (if needed) and reads a tfds dataset: uint8 images, int32
  labels."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder(_TFDS[name], data_dir=data_dir and
                         os.path.expanduser(data_dir))
  if manual_dir and os.path.isdir(os.path.join(
      os.path.expanduser(manual_dir), name)):
    # Like usps/ and mnist_m/: one manual_dir serves several datasets (as in
    # `load_domains`), and tfds would otherwise try the network.
    manual_dir = os.path.join(manual_dir, name)
  if manual_dir and name in _IDX_DATASETS and not builder.is_prepared():
    missing = [f for f in _IDX_FILES if not os.path.isfile(
        os.path.join(os.path.expanduser(manual_dir), f))]
    if missing:
      # Checked here: tfds would silently fall back to the network.
      raise errors.DataError(
          f'{name!r} needs {", ".join(missing)} in manual_dir {manual_dir}')
  # One download/extract folder per dataset: tfds names extracted files
  # after the archive's file name alone, and MNIST and Fashion-MNIST ship
  # files of the same names, so with the shared default folder a
  # Fashion-MNIST build silently reused MNIST's extracted images.
  config = tfds.download.DownloadConfig(
      manual_dir=manual_dir and os.path.expanduser(manual_dir))
  try:
    builder.download_and_prepare(
        download_dir=os.path.join(_tfds_root(data_dir), 'downloads',
                                  'tff_kd', name),
        download_config=config)
    arrays = {}
    for split in ('train', 'test'):
      d = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
      arrays[f'x_{split}'] = np.asarray(d['image'], np.uint8)
      arrays[f'y_{split}'] = d['label'].astype(np.int32)
  except Exception as e:  # pylint: disable=broad-except
    # tfds raises download, checksum, IO and parse errors of many types.
    raise errors.DataError(
        f'could not load {name!r} with tensorflow-datasets (data_dir='
        f'{data_dir}, manual_dir={manual_dir or "none"}): '
        f'{_first_line(e)}') from None
  return arrays


def load_dataset(name: str, *, data_dir: Optional[str] = None,
                 manual_dir: Optional[str] = None,
                 train_limit: Optional[int] = None,
                 image_shape: Optional[Sequence[int]] = None) -> Dataset:
  """Loads a dataset as normalised arrays.

  Args:
    name: One of `DATASETS`.
    data_dir: tfds data folder, also used for decoded raw-file caches.
    manual_dir: Folder of raw files: tfds' manual_dir for MNIST and
      Fashion-MNIST (its `mnist/`, `fashion_mnist/` subfolder when that
      exists), and where `usps.h5` / `mnist_m.tar.gz` are found (in it or in
      its `usps/`, `mnist_m/` subfolder).
    train_limit: Keep only the first N training examples.
    image_shape: Optional (H, W, C) to resize and channel-match to.

  Returns:
    A `Dataset`.

  Raises:
    DataError: unknown name, missing/corrupt files, or a failed download.
  """
  if name in _TFDS:
    arrays = _load_tfds(name, data_dir, manual_dir)
  elif name in _RAW:
    arrays = _RAW[name](data_dir, manual_dir)
  else:
    raise errors.DataError(
        f"dataset {name!r} is unknown; choose one of {', '.join(DATASETS)}")
  x_train, y_train = arrays['x_train'], arrays['y_train']
  if train_limit:
    x_train, y_train = x_train[:train_limit], y_train[:train_limit]
  x_test = arrays['x_test']
  if image_shape:
    x_train = resize_images(x_train, image_shape)
    x_test = resize_images(x_test, image_shape)
  num_classes = int(max(y_train.max(), arrays['y_test'].max())) + 1
  # The loaders' arrays are fresh (decoded or read from the cache) and used
  # only here, so they are normalised in place.
  return Dataset(name, normalise(x_train, in_place=True),
                 y_train.astype(np.int32),
                 normalise(x_test, in_place=True),
                 arrays['y_test'].astype(np.int32),
                 num_classes)


def resize_images(x01: np.ndarray, image_shape: Sequence[int],
                  batch_size: int = 4096) -> np.ndarray:
  """Bilinear resize of [0, 1] images to (H, W) and channel match to C.

  Grey images are repeated to 3 channels; RGB images become grey by the
  ITU-R 601 luma weights when C is 1.
  """
  h, w, c = (int(v) for v in image_shape)
  if c not in (1, 3):
    raise errors.ConfigError(f'image channels must be 1 or 3, got {c}')
  out = []
  for start in range(0, len(x01), batch_size):
    batch = tf.convert_to_tensor(x01[start:start + batch_size], tf.float32)
    if batch.shape[1:3] != (h, w):
      batch = tf.image.resize(batch, (h, w), method='bilinear')
    if batch.shape[-1] == 1 and c == 3:
      batch = tf.repeat(batch, 3, axis=-1)
    elif batch.shape[-1] == 3 and c == 1:
      batch = tf.image.rgb_to_grayscale(batch)
    out.append(tf.clip_by_value(batch, 0.0, 1.0).numpy())
  return np.concatenate(out) if out else np.zeros((0, h, w, c), np.float32)


def load_domains(names: Sequence[str], image_shape: Sequence[int], *,
                 data_dir: Optional[str] = None,
                 manual_dir: Optional[str] = None,
                 train_limit: Optional[int] = None) -> Dataset:
  """Several datasets resized to one shape, tagged with domain ids.

  Args:
    names: Dataset names; domain id i is `names[i]`.
    image_shape: Common (H, W, C).
    data_dir: As for `load_dataset`.
    manual_dir: As for `load_dataset`.
    train_limit: Per-domain limit on training examples.

  Returns:
    A `Dataset` whose `train_domains` / `test_domains` give each sample's
    domain.
  """
  if not names:
    raise errors.ConfigError('load_domains needs at least one dataset name')
  parts = [load_dataset(n, data_dir=data_dir, manual_dir=manual_dir,
                        train_limit=train_limit, image_shape=image_shape)
           for n in names]
  classes = {p.num_classes for p in parts}
  if len(classes) != 1:
    raise errors.DataError(f'domains {list(names)} have different label '
                           f'sets: {sorted(classes)} classes')
  dom = lambda split: np.concatenate([  # noqa: E731
      np.full(len(getattr(p, f'y_{split}')), i, np.int32)
      for i, p in enumerate(parts)])
  return Dataset(
      '+'.join(names),
      np.concatenate([p.x_train for p in parts]),
      np.concatenate([p.y_train for p in parts]),
      np.concatenate([p.x_test for p in parts]),
      np.concatenate([p.y_test for p in parts]),
      classes.pop(), dom('train'), dom('test'), tuple(names))


class TFFSource(NamedTuple):
  """One of TFF's simulation datasets (`TFF_DATASETS`).

  Attributes:
    loader: Its `tff.simulation.datasets` module's name.
    kwargs: `load_data`'s keyword arguments besides `cache_dir`.
    origin: The LZMA file TFF downloads; its name less `.lzma` is the
      file kept in the cache folder.
    num_classes: Number of labels.
    x_key: The image's key in an element.
    y_key: The label's key.
    pixel_max: The image's white value.
  """

  loader: str
  kwargs: dict
  origin: str
  num_classes: int
  x_key: str
  y_key: str
  pixel_max: float

  @property
  def file_name(self) -> str:
    """The decompressed file `load_data` reads from the cache folder."""
    return os.path.splitext(self.origin.rsplit('/', 1)[-1])[0]


_TFF_BUCKET = 'https://storage.googleapis.com/tff-datasets-public/'
TFF_DATASETS: dict[str, TFFSource] = {
    'tff:emnist': TFFSource('emnist', dict(only_digits=False),
                            _TFF_BUCKET + 'emnist_all.sqlite.lzma', 62,
                            'pixels', 'label', 1.0),
    'tff:emnist_digits_only': TFFSource(
        'emnist', dict(only_digits=True),
        _TFF_BUCKET + 'emnist_all.sqlite.lzma', 10, 'pixels', 'label', 1.0),
    'tff:cifar100': TFFSource('cifar100', {},
                              _TFF_BUCKET + 'cifar100.sqlite.lzma', 100,
                              'image', 'label', 255.0),
}
# Seconds a download may wait on the network (connecting or reading):
# offline, loading fails within this instead of hanging.
TFF_DOWNLOAD_TIMEOUT_S = 20.0


def tff_cache_dir(data_dir: Optional[str]) -> str:
  """Where `load_tff` keeps TFF's dataset files: `<data_dir>/tff`."""
  return os.path.join(_tfds_root(data_dir), 'tff')


def load_tff(name: str, *, data_dir: Optional[str] = None):
  """TFF's federated train and test `ClientData` of a `TFF_DATASETS` name.

  Reads `<data_dir>/tff/<file>` (`TFFSource.file_name`), downloading it
  first if it is missing: TFF downloads and decompresses the LZMA file
  (hundreds of MB for EMNIST). Nothing else is read here: the clients'
  examples are read when they are used.

  Args:
    name: A key of `TFF_DATASETS`.
    data_dir: The data folder (default `~/tensorflow_datasets`).

  Returns:
    (train ClientData, test ClientData, its `TFFSource`).

  Raises:
    DataError: an unknown name, or the file is missing and cannot be
      downloaded (offline): the message names the folder to fill.
  """
  if name not in TFF_DATASETS:
    raise errors.DataError(
        f"dataset {name!r} is unknown; choose one of "
        f"{', '.join(TFF_DATASETS)}")
  # pylint: disable=g-import-not-at-top
  import importlib
  import socket
  from tensorflow_federated.python.simulation.datasets import download
  # pylint: enable=g-import-not-at-top
  source = TFF_DATASETS[name]
  cache = tff_cache_dir(data_dir)
  path = os.path.join(cache, source.file_name)
  if not os.path.isfile(path):
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(TFF_DOWNLOAD_TIMEOUT_S)
    try:
      download.get_compressed_file(origin=source.origin, cache_dir=cache)
    except Exception as e:  # pylint: disable=broad-except
      # urllib, socket, LZMA and file errors; a partial file is no cache.
      if os.path.exists(path):
        os.remove(path)
      raise errors.DataError(
          f'{name} needs {source.file_name} in {cache} and could not '
          f'download it ({_first_line(e)}); offline, put the file there '
          f'(from {source.origin}, decompressed with unxz)') from None
    finally:
      socket.setdefaulttimeout(previous)
  module = importlib.import_module(
      f'tensorflow_federated.python.simulation.datasets.{source.loader}')
  try:
    train, test = module.load_data(cache_dir=cache, **source.kwargs)
  except Exception as e:  # pylint: disable=broad-except
    raise errors.DataError(
        f'could not read {name} from {path}: {_first_line(e)}; delete the '
        'file to download it again') from None
  return train, test, source


def sha256(path: str) -> str:
  """Hex sha256 of a file (to check raw files against published sums)."""
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      h.update(block)
  return h.hexdigest()


__all__ = ['Dataset', 'DATASETS', 'load_dataset', 'load_domains',
           'load_tff', 'normalise', 'resize_images', 'sha256',
           'tff_cache_dir', 'TFF_DATASETS', 'TFFSource']
