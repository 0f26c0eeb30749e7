"""Dataset loaders on the real shared files, a synthetic MNIST-M and errors.

MNIST is built once per module by tfds from the raw IDX files (~25 s); USPS
is read from the real `usps.h5`; MNIST-M is a tiny archive written here with
the real archive's layout, since decoding the real 128 MB one is too slow.
"""

import io
import os
import shutil
import tarfile

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import SHARED_DATA
from tff_kd import errors
from tff_kd.data import datasets

MNIST_DIR = os.path.join(SHARED_DATA, 'mnist')
USPS_FILE = os.path.join(SHARED_DATA, 'usps', 'usps.h5')

# From shared/data/README.md.
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851,
                      5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
USPS_TRAIN_COUNTS = [1194, 1005, 731, 658, 652, 556, 664, 645, 542, 644]
USPS_TEST_COUNTS = [359, 264, 198, 166, 200, 160, 170, 147, 166, 177]
USPS_SHA256 = ('734f88c541104a956d88be2c95d03b4a463ffd74ccc2ba9c80841fb98e3f'
               'cb36')


def _require(path):
  if not os.path.exists(path):
    pytest.skip(f'shared data file {path} is missing')


def _one_line(exc_info):
  message = str(exc_info.value)
  assert message and '\n' not in message, repr(message)
  return message


def _check_arrays(ds, n_train, n_test, shape):
  assert ds.x_train.shape == (n_train, *shape)
  assert ds.x_test.shape == (n_test, *shape)
  assert ds.x_train.dtype == ds.x_test.dtype == np.float32
  assert ds.y_train.dtype == ds.y_test.dtype == np.int32
  assert ds.y_train.shape == (n_train,) and ds.y_test.shape == (n_test,)
  for x in (ds.x_train, ds.x_test):
    assert x.min() >= -1.0 and x.max() <= 1.0


# -------------------------------------------------------------------- digits


def test_digits_shapes_range_and_labels():
  ds = datasets.load_dataset('digits')
  assert ds.name == 'digits' and ds.num_classes == 10
  _check_arrays(ds, 1437, 360, (8, 8, 1))
  # sklearn's pixels are 0..16, so both ends of [-1, 1] occur.
  assert ds.x_train.min() == -1.0 and ds.x_train.max() == 1.0
  assert set(np.unique(ds.y_train)) == set(range(10))
  assert ds.train_domains is None and ds.domain_names == ()


def test_digits_test_split_is_fixed_stratified_and_whole():
  from sklearn import datasets as sk_datasets  # pylint: disable=g-import-not-at-top
  a = datasets.load_dataset('digits')
  b = datasets.load_dataset('digits')
  for name in ('x_train', 'y_train', 'x_test', 'y_test'):
    np.testing.assert_array_equal(getattr(a, name), getattr(b, name))

  digits = sk_datasets.load_digits()
  # Stratified 20% test split: every class within one sample of 20%.
  n_class = np.bincount(digits.target)
  assert np.all(np.abs(np.bincount(a.y_test) - 0.2 * n_class) <= 1)
  # Train + test are exactly the 1,797 normalised sklearn images (as a
  # multiset of (image, label) rows): nothing lost, nothing duplicated.
  def rows(x, y):
    return np.unique(np.concatenate([x.reshape(len(x), -1), y[:, None]], 1),
                     axis=0, return_counts=True)
  got = rows(np.concatenate([a.x_train, a.x_test]),
             np.concatenate([a.y_train, a.y_test]).astype(np.float32))
  want = rows((digits.images.astype(np.float32) / 16 - 0.5) / 0.5,
              digits.target.astype(np.float32))
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_array_equal(got[1], want[1])


def test_train_limit_keeps_the_first_examples():
  full = datasets.load_dataset('digits')
  ds = datasets.load_dataset('digits', train_limit=50)
  np.testing.assert_array_equal(ds.x_train, full.x_train[:50])
  np.testing.assert_array_equal(ds.y_train, full.y_train[:50])
  assert len(ds.x_test) == 360  # The test split is never cut.


# --------------------------------------------------------------------- mnist


@pytest.fixture(scope='module')
def mnist(mnist_data_dir):
  return datasets.load_dataset('mnist', data_dir=mnist_data_dir,
                               manual_dir=MNIST_DIR)


def test_mnist_from_raw_files(mnist):
  _check_arrays(mnist, 60000, 10000, (28, 28, 1))
  assert mnist.num_classes == 10
  assert mnist.x_train.min() == -1.0 and mnist.x_train.max() == 1.0
  np.testing.assert_array_equal(np.bincount(mnist.y_train), MNIST_TRAIN_COUNTS)
  np.testing.assert_array_equal(np.bincount(mnist.y_test), MNIST_TEST_COUNTS)
  # Pixels are k/255 before normalisation.
  k = (mnist.x_test[:50] * 0.5 + 0.5) * 255
  np.testing.assert_allclose(k, np.round(k), atol=1e-3)


def test_mnist_train_limit_reuses_prepared_data(mnist, mnist_data_dir):
  ds = datasets.load_dataset('mnist', data_dir=mnist_data_dir,
                             manual_dir=MNIST_DIR, train_limit=100)
  np.testing.assert_array_equal(ds.x_train, mnist.x_train[:100])
  np.testing.assert_array_equal(ds.y_train, mnist.y_train[:100])
  assert len(ds.y_test) == 10000


def test_mnist_second_load_reads_the_cache_without_tfds(mnist, mnist_data_dir,
                                                        monkeypatch):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  cache = os.path.join(mnist_data_dir, 'tff_kd_cache', 'tfds_mnist.npz')
  assert os.path.exists(cache)

  def no_tfds(*args, **kwargs):
    raise AssertionError('tfds must not be asked again')

  monkeypatch.setattr(tfds, 'builder', no_tfds)
  again = datasets.load_dataset('mnist', data_dir=mnist_data_dir,
                                manual_dir=MNIST_DIR)
  np.testing.assert_array_equal(again.x_train, mnist.x_train)
  np.testing.assert_array_equal(again.y_test, mnist.y_test)


def test_mnist_cache_is_stale_once_the_prepared_files_change(
    mnist, mnist_data_dir, monkeypatch):
  info = [os.path.join(d, f)
          for d, _, files in os.walk(os.path.join(mnist_data_dir, 'mnist'))
          for f in files if f == 'dataset_info.json'][0]
  stat = os.stat(info)
  calls = []
  real = datasets._prepare_tfds  # pylint: disable=protected-access

  def counted(*args):
    calls.append(args[0])
    return real(*args)

  monkeypatch.setattr(datasets, '_prepare_tfds', counted)
  try:
    os.utime(info, (stat.st_atime, stat.st_mtime + 10))
    again = datasets.load_dataset('mnist', data_dir=mnist_data_dir,
                                  manual_dir=MNIST_DIR, train_limit=10)
  finally:
    os.utime(info, (stat.st_atime, stat.st_mtime))
  assert calls == ['mnist']
  np.testing.assert_array_equal(again.x_train, mnist.x_train[:10])


def test_normalise_in_place_equals_the_formula():
  x = np.random.default_rng(0).random((5, 4, 4, 1), dtype=np.float32)
  want = ((x - 0.5) / 0.5).astype(np.float32)
  np.testing.assert_array_equal(datasets.normalise(x), want)
  y = x.copy()
  out = datasets.normalise(y, in_place=True)
  assert out is y
  np.testing.assert_array_equal(out, want)
  readonly = x.copy()
  readonly.flags.writeable = False
  np.testing.assert_array_equal(
      datasets.normalise(readonly, in_place=True), want)
  np.testing.assert_array_equal(readonly, x)


def test_fashion_mnist_in_the_same_data_dir_is_not_mnist(mnist,
                                                         mnist_data_dir):
  # Regression: tfds names extracted files after the archive alone, and
  # Fashion-MNIST's raw files have MNIST's names; with a shared extract
  # folder, Fashion-MNIST built after MNIST was MNIST.
  fashion_dir = os.path.join(os.path.dirname(MNIST_DIR), 'fashion_mnist')
  _require(fashion_dir)
  fashion = datasets.load_dataset('fashion_mnist', data_dir=mnist_data_dir,
                                  manual_dir=fashion_dir, train_limit=1000)
  assert not np.array_equal(fashion.x_test[:100], mnist.x_test[:100])
  # Fashion-MNIST's test set has exactly 1,000 images per class.
  np.testing.assert_array_equal(np.bincount(fashion.y_test), [1000] * 10)


def test_corrupt_mnist_raw_file_is_a_data_error(tmp_path):
  _require(MNIST_DIR)
  raw = tmp_path / 'raw'
  raw.mkdir()
  for name in os.listdir(MNIST_DIR):
    if name.endswith('.gz'):
      shutil.copyfile(os.path.join(MNIST_DIR, name), raw / name)
  with open(raw / 'train-images-idx3-ubyte.gz', 'r+b') as f:
    f.truncate(1000)
  with pytest.raises(errors.DataError) as e:
    datasets.load_dataset('mnist', data_dir=str(tmp_path / 'tfds'),
                          manual_dir=str(raw))
  message = _one_line(e)
  assert "'mnist'" in message and str(raw) in message
  assert 'train-images-idx3-ubyte.gz' in message


def test_missing_tfds_manual_dir_is_a_data_error(tmp_path):
  missing = str(tmp_path / 'no_such_dir')
  with pytest.raises(errors.DataError) as e:
    datasets.load_dataset('mnist', data_dir=str(tmp_path / 'tfds'),
                          manual_dir=missing)
  assert missing in _one_line(e)


@pytest.mark.parametrize('subfolder', [True, False])
def test_tfds_manual_dir_may_hold_a_dataset_subfolder(tmp_path, monkeypatch,
                                                      subfolder):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  root = tmp_path / 'raw'
  (root / ('mnist' if subfolder else 'other')).mkdir(parents=True)
  for name in datasets._IDX_FILES:  # pylint: disable=protected-access
    (root / 'mnist' / name if subfolder else root / name).write_bytes(b'')
  seen = []

  class Builder:

    def is_prepared(self):
      return False

    def download_and_prepare(self, download_dir, download_config):
      # Each dataset extracts into its own folder (see
      # test_fashion_mnist_in_the_same_data_dir_is_not_mnist).
      assert download_dir.endswith(os.path.join('tff_kd', 'mnist'))
      seen.append(str(download_config.manual_dir))
      raise RuntimeError('no network here')

  monkeypatch.setattr(tfds, 'builder', lambda *a, **k: Builder())
  with pytest.raises(errors.DataError, match='no network here') as e:
    datasets.load_dataset('mnist', data_dir=str(tmp_path / 'tfds'),
                          manual_dir=str(root))
  # Like usps/ and mnist_m/, so that one manual_dir serves load_domains.
  want = str(root / 'mnist') if subfolder else str(root)
  assert seen == [want]
  assert want in _one_line(e)


# ---------------------------------------------------------------------- usps


@pytest.fixture(scope='module')
def usps_data_dir(tmp_path_factory):
  _require(USPS_FILE)
  return str(tmp_path_factory.mktemp('usps_cache'))


@pytest.fixture(scope='module')
def usps(usps_data_dir):
  return datasets.load_dataset('usps', data_dir=usps_data_dir,
                               manual_dir=SHARED_DATA)


def test_usps_file_checksum():
  _require(USPS_FILE)
  assert datasets.sha256(USPS_FILE) == USPS_SHA256


def test_usps_from_real_file(usps):
  import h5py  # pylint: disable=g-import-not-at-top
  _check_arrays(usps, 7291, 2007, (16, 16, 1))
  assert usps.num_classes == 10
  np.testing.assert_array_equal(np.bincount(usps.y_train), USPS_TRAIN_COUNTS)
  np.testing.assert_array_equal(np.bincount(usps.y_test), USPS_TEST_COUNTS)
  with h5py.File(USPS_FILE, 'r') as f:
    raw = np.asarray(f['test']['data'][:5])
    raw_y = np.asarray(f['test']['target'][:5])
  np.testing.assert_allclose(usps.x_test[:5].reshape(5, 256),
                             2 * raw - 1, atol=1e-6)
  np.testing.assert_array_equal(usps.y_test[:5], raw_y)


def test_usps_manual_dir_may_be_the_subfolder(usps):
  ds = datasets.load_dataset('usps', manual_dir=os.path.dirname(USPS_FILE))
  np.testing.assert_array_equal(ds.x_train, usps.x_train)
  np.testing.assert_array_equal(ds.y_test, usps.y_test)


def test_usps_cache_is_written_and_reused(usps, usps_data_dir, monkeypatch):
  import h5py  # pylint: disable=g-import-not-at-top
  cache = os.path.join(usps_data_dir, 'tff_kd_cache', 'usps.npz')
  assert os.path.isfile(cache)

  def no_decoding(*args, **kwargs):
    raise AssertionError('usps.h5 was decoded again despite the cache')

  monkeypatch.setattr(h5py, 'File', no_decoding)
  again = datasets.load_dataset('usps', data_dir=usps_data_dir,
                                manual_dir=SHARED_DATA)
  for name in ('x_train', 'y_train', 'x_test', 'y_test'):
    np.testing.assert_array_equal(getattr(again, name), getattr(usps, name))


def test_usps_cache_follows_the_source_file(usps, tmp_path):
  manual = tmp_path / 'raw'
  manual.mkdir()
  shutil.copyfile(USPS_FILE, manual / 'usps.h5')
  data_dir = str(tmp_path / 'data')
  datasets.load_dataset('usps', data_dir=data_dir, manual_dir=str(manual))
  cache = os.path.join(data_dir, 'tff_kd_cache', 'usps.npz')
  # A broken cache is rebuilt.
  with open(cache, 'wb') as f:
    f.write(b'not an npz')
  ds = datasets.load_dataset('usps', data_dir=data_dir,
                             manual_dir=str(manual))
  np.testing.assert_array_equal(ds.x_test, usps.x_test)
  # A replaced source file is decoded again instead of read from the cache.
  with open(manual / 'usps.h5', 'wb') as f:
    f.write(np.random.default_rng(0).bytes(4096))
  with pytest.raises(errors.DataError, match='not a readable USPS file'):
    datasets.load_dataset('usps', data_dir=data_dir, manual_dir=str(manual))


def test_usps_resized_to_mnist_shape(usps, usps_data_dir):
  ds = datasets.load_dataset('usps', data_dir=usps_data_dir,
                             manual_dir=SHARED_DATA, image_shape=(28, 28, 1))
  _check_arrays(ds, 7291, 2007, (28, 28, 1))
  want = tf.image.resize(usps.x_test[:3] * 0.5 + 0.5, (28, 28)).numpy()
  np.testing.assert_allclose(ds.x_test[:3], 2 * want - 1, atol=1e-5)
  np.testing.assert_array_equal(ds.y_train, usps.y_train)


def test_usps_resized_to_rgb(usps, usps_data_dir):
  ds = datasets.load_dataset('usps', data_dir=usps_data_dir,
                             manual_dir=SHARED_DATA, image_shape=(32, 32, 3),
                             train_limit=64)
  _check_arrays(ds, 64, 2007, (32, 32, 3))
  # Grey is repeated into three equal channels.
  np.testing.assert_array_equal(ds.x_train[..., 0], ds.x_train[..., 1])
  np.testing.assert_array_equal(ds.x_train[..., 0], ds.x_train[..., 2])
  assert ds.x_train.std() > 0.1


def test_resize_rejects_other_channel_counts():
  with pytest.raises(errors.ConfigError, match='got 2'):
    datasets.resize_images(np.zeros((1, 4, 4, 1), np.float32), (4, 4, 2))


# ------------------------------------------------------ mnist_m (synthetic)


def _write_mnist_m(root, splits):
  """Writes root/mnist_m/mnist_m.tar.gz with the real archive's layout.

  Args:
    root: Folder to write into.
    splits: {'train'|'test': [(file name, uint8 image, label), ...]}, in the
      order of the label files.
  """
  folder = os.path.join(root, 'mnist_m')
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, 'mnist_m.tar.gz')

  def add(tar, name, data=None):
    info = tarfile.TarInfo(name)
    if data is None:
      info.type = tarfile.DIRTYPE
      tar.addfile(info)
    else:
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))

  with tarfile.open(path, 'w:gz') as tar:
    add(tar, 'mnist_m')
    for split, items in sorted(splits.items()):
      add(tar, f'mnist_m/mnist_m_{split}')
      for name, image, _ in sorted(items, key=lambda t: t[0]):
        add(tar, f'mnist_m/mnist_m_{split}/{name}',
            tf.io.encode_png(image).numpy())
      add(tar, f'mnist_m/mnist_m_{split}_labels.txt',
          ''.join(f'{n} {y}\n' for n, _, y in items).encode())
  return path


def _images(n, seed):
  return np.random.default_rng(seed).integers(0, 256, (n, 32, 32, 3),
                                              dtype=np.uint8)


def test_mnist_m_decodes_pngs_with_their_labels(tmp_path):
  train, test = _images(3, 0), _images(2, 1)
  # Label files list names out of order: images follow the label file.
  _write_mnist_m(tmp_path, {
      'train': [('00000002.png', train[2], 5), ('00000000.png', train[0], 3),
                ('00000001.png', train[1], 9)],
      'test': [('00000000.png', test[0], 0), ('00000001.png', test[1], 7)],
  })
  data_dir = str(tmp_path / 'data')
  ds = datasets.load_dataset('mnist_m', data_dir=data_dir,
                             manual_dir=str(tmp_path))
  _check_arrays(ds, 3, 2, (32, 32, 3))
  expected = lambda x: (x.astype(np.float32) / 255.0 - 0.5) / 0.5  # noqa: E731
  np.testing.assert_allclose(ds.x_train, expected(train[[2, 0, 1]]),
                             atol=1e-6)
  np.testing.assert_allclose(ds.x_test, expected(test), atol=1e-6)
  np.testing.assert_array_equal(ds.y_train, [5, 3, 9])
  np.testing.assert_array_equal(ds.y_test, [0, 7])
  assert ds.num_classes == 10
  assert os.path.isfile(os.path.join(data_dir, 'tff_kd_cache', 'mnist_m.npz'))


def test_mnist_m_to_grey_uses_luma_weights(tmp_path):
  red = np.zeros((1, 32, 32, 3), np.uint8)
  red[..., 0] = 255
  _write_mnist_m(tmp_path, {'train': [('00000000.png', red[0], 1)],
                            'test': [('00000000.png', red[0], 2)]})
  ds = datasets.load_dataset('mnist_m', manual_dir=str(tmp_path / 'mnist_m'),
                             image_shape=(28, 28, 1))
  assert ds.x_train.shape == (1, 28, 28, 1)
  np.testing.assert_allclose(ds.x_train, 2 * 0.2989 - 1, atol=1e-4)


def test_mnist_m_with_a_missing_png_is_a_data_error(tmp_path):
  # A label file that names a PNG the archive does not hold.
  path = _write_mnist_m(tmp_path, {
      'train': [('00000000.png', _images(1, 0)[0], 1)],
      'test': [('00000000.png', _images(1, 1)[0], 2)]})
  with tarfile.open(path, 'w:gz') as tar:
    data = b'00000005.png 4\n'
    info = tarfile.TarInfo('mnist_m/mnist_m_train_labels.txt')
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
  with pytest.raises(errors.DataError) as e:
    datasets.load_dataset('mnist_m', manual_dir=str(tmp_path))
  message = _one_line(e)
  assert path in message and 'MNIST-M' in message


def test_truncated_mnist_m_archive_is_a_data_error(tmp_path):
  path = _write_mnist_m(tmp_path, {
      'train': [('00000000.png', _images(1, 0)[0], 1)],
      'test': [('00000000.png', _images(1, 1)[0], 2)]})
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)
  with pytest.raises(errors.DataError) as e:
    datasets.load_dataset('mnist_m', manual_dir=str(tmp_path))
  assert path in _one_line(e)


# -------------------------------------------------------------------- errors


def test_unknown_dataset_is_a_data_error():
  with pytest.raises(errors.DataError) as e:
    datasets.load_dataset('imagenet_tiny')
  message = _one_line(e)
  assert "'imagenet_tiny'" in message and 'usps' in message


def test_usps_without_manual_dir_is_a_data_error():
  with pytest.raises(errors.DataError) as e:
    datasets.load_dataset('usps')
  message = _one_line(e)
  assert 'manual_dir' in message and 'usps.h5' in message


def test_missing_usps_file_is_a_data_error(tmp_path):
  with pytest.raises(errors.DataError) as e:
    datasets.load_dataset('usps', manual_dir=str(tmp_path))
  message = _one_line(e)
  assert 'usps.h5' in message and str(tmp_path) in message


def test_corrupt_usps_file_is_a_data_error(tmp_path):
  path = tmp_path / 'usps.h5'
  path.write_bytes(np.random.default_rng(0).bytes(5000))
  with pytest.raises(errors.DataError) as e:
    datasets.load_dataset('usps', data_dir=str(tmp_path / 'data'),
                          manual_dir=str(tmp_path))
  message = _one_line(e)
  assert str(path) in message and 'USPS' in message
  # Nothing was cached for the broken file.
  assert not os.path.exists(tmp_path / 'data' / 'tff_kd_cache' / 'usps.npz')


def test_usps_file_with_wrong_layout_is_a_data_error(tmp_path):
  import h5py  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'usps.h5'
  with h5py.File(path, 'w') as f:
    f.create_dataset('train/data', data=np.zeros((2, 256), np.float32))
  with pytest.raises(errors.DataError) as e:
    datasets.load_dataset('usps', manual_dir=str(tmp_path))
  assert str(path) in _one_line(e)


# ------------------------------------------------------------------- domains


def test_load_domains_tags_and_concatenates(usps, usps_data_dir):
  ds = datasets.load_domains(['usps', 'digits'], (16, 16, 1),
                             data_dir=usps_data_dir, manual_dir=SHARED_DATA)
  digits = datasets.load_dataset('digits', image_shape=(16, 16, 1))
  assert ds.name == 'usps+digits'
  assert ds.domain_names == ('usps', 'digits')
  assert ds.num_classes == 10
  np.testing.assert_array_equal(ds.train_domains,
                                np.repeat([0, 1], [7291, 1437]))
  np.testing.assert_array_equal(ds.test_domains,
                                np.repeat([0, 1], [2007, 360]))
  assert ds.train_domains.dtype == np.int32
  np.testing.assert_array_equal(ds.x_train[:7291], usps.x_train)
  np.testing.assert_array_equal(ds.x_train[7291:], digits.x_train)
  np.testing.assert_array_equal(ds.y_test[:2007], usps.y_test)
  np.testing.assert_array_equal(ds.y_test[2007:], digits.y_test)


def test_load_domains_per_domain_train_limit():
  ds = datasets.load_domains(['digits', 'digits'], (8, 8, 1), train_limit=10)
  np.testing.assert_array_equal(ds.train_domains, np.repeat([0, 1], 10))
  np.testing.assert_array_equal(ds.x_train[:10], ds.x_train[10:])
  assert len(ds.x_test) == 720


def test_load_domains_rejects_different_label_sets(tmp_path):
  img = _images(2, 0)
  _write_mnist_m(tmp_path, {'train': [('00000000.png', img[0], 2)],
                            'test': [('00000000.png', img[1], 1)]})
  with pytest.raises(errors.DataError, match=r'\[3, 10\] classes'):
    datasets.load_domains(['mnist_m', 'digits'], (8, 8, 1),
                          manual_dir=str(tmp_path))
  with pytest.raises(errors.ConfigError):
    datasets.load_domains([], (8, 8, 1))


def test_missing_idx_file_fails_fast_without_network(tmp_path):
  manual = tmp_path / 'raw'
  manual.mkdir()
  (manual / 'train-images-idx3-ubyte.gz').write_bytes(b'')
  with pytest.raises(errors.DataError,
                     match='t10k-labels-idx1-ubyte.gz in manual_dir'):
    datasets.load_dataset('mnist', data_dir=str(tmp_path / 'tfds'),
                          manual_dir=str(manual))


def test_cache_writers_sharing_a_data_dir_do_not_clash(tmp_path):
  # Two runs (or two test workers) that fill the same cache at once: each
  # writes a file of its own and replaces the cache atomically, so the cache
  # ends readable and no temporary file is left behind.
  import threading  # pylint: disable=g-import-not-at-top
  arrays = {'x': np.arange(200_000, dtype=np.float32)}
  errors_seen = []

  def write():
    try:
      for _ in range(5):
        datasets._write_cache(str(tmp_path), 'shared', 'key-1', arrays)
    except Exception as e:  # pylint: disable=broad-except
      errors_seen.append(e)

  threads = [threading.Thread(target=write) for _ in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors_seen
  cached = datasets._read_cache(str(tmp_path), 'shared', 'key-1')
  np.testing.assert_array_equal(cached['x'], arrays['x'])
  assert os.listdir(tmp_path / 'tff_kd_cache') == ['shared.npz']
