"""Training on a TFF `ClientData`: its own clients, read per round.

The `ClientData` is built in the test with `from_clients_and_tf_fn`: 300
"writers" of 5 scikit-learn digits each, every client's examples in its own
pair of tensor files that the dataset function reads when the client's
dataset is iterated. Deleting the files of clients that are not sampled
proves that nothing but the sampled clients is ever read.
"""

import copy
import csv
import json
import os

import numpy as np
import pytest
from sklearn import datasets
import tensorflow as tf
import tensorflow_federated as tff

from tests import helpers
from tff_kd import data as data_lib
from tff_kd import errors
from tff_kd.data import datasets as datasets_lib
from tff_kd.federated import tff_client_data
from tff_kd.program import checkpoints
from tff_kd.program import experiment
from tff_kd.program import sampling
from tff_kd.program import tff_programs

NUM_CLIENTS, PER_CLIENT = 300, 5


def _ids(num_clients: int = NUM_CLIENTS) -> list[str]:
  return [f'writer_{i:04d}' for i in range(num_clients)]


def _write(folder: str, keep=None) -> None:
  """Writes each client's 8x8 pixels in [0, 1] and int64 labels."""
  d = datasets.load_digits()
  x = (d.images / 16.0).astype(np.float32)
  y = d.target.astype(np.int64)
  os.makedirs(folder, exist_ok=True)
  for i, cid in enumerate(_ids()):
    if keep is None or i in keep:
      part = slice(i * PER_CLIENT, (i + 1) * PER_CLIENT)
      for suffix, arr in (('x', x[part]), ('y', y[part])):
        tf.io.write_file(os.path.join(folder, f'{cid}.{suffix}'),
                         tf.io.serialize_tensor(arr))


def _client_data(folder: str, num_clients: int = NUM_CLIENTS):
  """A `ClientData` of EMNIST's element structure ('pixels', 'label')."""

  def dataset_fn(client_id):
    def read(cid):
      path = tf.strings.join([folder, '/', cid])
      x = tf.io.parse_tensor(tf.io.read_file(path + '.x'), tf.float32)
      y = tf.io.parse_tensor(tf.io.read_file(path + '.y'), tf.int64)
      return {'pixels': tf.ensure_shape(x, [None, 8, 8]),
              'label': tf.ensure_shape(y, [None])}
    # Nothing is read until the dataset is iterated.
    return tf.data.Dataset.from_tensors(client_id).map(read).unbatch()

  return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
      _ids(num_clients), dataset_fn)


def _test_set():
  d = datasets.load_digits()
  n = NUM_CLIENTS * PER_CLIENT
  x = data_lib.normalise(d.images[n:] / 16.0)[..., None]
  return x, d.target[n:].astype(np.int32)


def _wrap(folder: str, name: str = 'writers', **kwargs):
  return tff_client_data.TFFClientData(
      _client_data(folder, **kwargs), name=name, num_classes=10)


def _config(**overrides):
  return helpers.digits_config(**{'clients_per_round': 5, 'export': False,
                                  **overrides})


def test_fedavg_reads_only_sampled_clients_and_resumes_exactly(tmp_path):
  config = _config(rounds=2)
  sampled = set()
  for r in range(2):
    sampled.update(sampling.sample_clients(NUM_CLIENTS, 5, seed=config.seed,
                                           round_num=r).tolist())
  # Only the clients sampled in rounds 1 and 2 have files: any other read
  # fails the run with NotFound.
  folder = str(tmp_path / 'clients')
  _write(folder, keep=sampled)
  clients, test = _wrap(folder), _test_set()

  resumed, straight = str(tmp_path / 'resumed'), str(tmp_path / 'straight')
  first = experiment.run(_config(rounds=1), resumed, progress=False,
                         client_data=clients, test_data=test)
  more = experiment.run(config, resumed, progress=False, client_data=clients,
                        test_data=test)
  whole = experiment.run(config, straight, progress=False,
                         client_data=clients, test_data=test)
  assert more.resumed_after == 1 and [h['round'] for h in more.history] == [2]
  assert more.final == whole.final
  assert ([h['train/loss'] for h in first.history + more.history] ==
          [h['train/loss'] for h in whole.history])
  assert whole.history[0]['train/num_examples'] == 5 * PER_CLIENT
  # One prepare reads both run folders' newest checkpoints.
  exp = experiment.prepare(config, str(tmp_path / 'probe'),
                           client_data=clients, test_data=test)
  a, b = (checkpoints.load_or_initialize(exp, checkpoints.manager_for(
      exp.settings, root)) for root in (resumed, straight))
  assert a[1] == b[1] == 2
  for x, y in zip(tf.nest.flatten(a[0]), tf.nest.flatten(b[0])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

  with open(os.path.join(straight, 'metrics.csv')) as f:
    rows = list(csv.DictReader(f))
  assert [int(r['round']) for r in rows] == [1, 2]
  assert 0.0 <= float(rows[-1]['test/accuracy']) <= 1.0
  with open(os.path.join(straight, 'config.json')) as f:
    saved = json.load(f)
  assert saved['dataset']['client_data'] == clients.identity
  assert saved['partition']['num_clients'] == NUM_CLIENTS
  assert not os.path.exists(os.path.join(straight, 'client_data'))

  # Other clients (or another name) in the same folder are refused.
  other = exp.settings.replace(dataset=exp.settings.dataset.replace(
      client_data=_wrap(folder, num_clients=NUM_CLIENTS - 1).identity))
  with pytest.raises(errors.CheckpointError, match='dataset.client_data'):
    checkpoints.check_resumable(other, straight)


@pytest.mark.slow
def test_feddf_holds_out_whole_clients_for_the_server(tmp_path):
  folder = str(tmp_path / 'clients')
  _write(folder)
  clients = _wrap(folder)
  config = helpers.smoke_config('feddf', clients_per_round=5,
                                **{'server_data.val_size': 10})
  root = str(tmp_path / 'run')
  result = experiment.run(config, root, progress=False, client_data=clients,
                          test_data=_test_set())
  assert config.partition.num_clients == 6  # The caller's is untouched.
  # 100 pool + 10 validation examples: 22 clients of 5 leave the federation.
  with open(os.path.join(root, 'config.json')) as f:
    assert json.load(f)['partition']['num_clients'] == NUM_CLIENTS - 22
  (server,) = os.listdir(os.path.join(root, 'server_data'))
  with open(os.path.join(root, 'server_data', server,
                         'server_manifest.json')) as f:
    manifest = json.load(f)
  assert (manifest['pool_size'], manifest['val_size']) == (100, 10)
  assert [h['round'] for h in result.history] == [1, 2]
  assert any(k.startswith('distill/') for k in result.history[-1])


def _keyed_batches(clients, key: str, local) -> list[dict]:
  """The keyed path's batches, built and run in a fresh graph as inside a
  TFF computation: made eagerly, the dataset's shuffle would also take TF's
  global seed (which other tests set) into its order."""
  with tf.Graph().as_default():
    iterator = tf.compat.v1.data.make_initializable_iterator(
        clients.dataset_from_key(tf.constant(key), local))
    batch = iterator.get_next()
    batches = []
    with tf.compat.v1.Session() as session:
      session.run(iterator.initializer)
      while True:
        try:
          batches.append(session.run(batch))
        except tf.errors.OutOfRangeError:
          return batches


def test_train_model_source_reads_the_sampled_clients(tmp_path):
  folder = str(tmp_path / 'clients')
  _write(folder, keep=set(sampling.sample_clients(NUM_CLIENTS, 3, seed=0,
                                                  round_num=0).tolist()))
  clients = _wrap(folder)
  local = experiment.from_config(_config()).local_work
  source = tff_programs.ClientDataSource(clients, local, seed=0)
  iterator = source.iterator()
  restored = tff_programs.ClientDataSourceIterator.from_bytes(
      iterator.to_bytes())
  keys = clients.keys(sampling.sample_clients(NUM_CLIENTS, 3, seed=0,
                                              round_num=0), seed=0,
                      round_num=0)
  for got, key in zip(restored.select(3), keys):
    want = _keyed_batches(clients, key, local)
    got = list(got)
    assert len(got) == len(want)
    for a, b in zip(got, want):
      np.testing.assert_array_equal(a['x'].numpy(), b['x'])
      np.testing.assert_array_equal(a['y'].numpy(), b['y'])
  assert source.federated_type.member.element.x.shape == (None, 8, 8, 1)


def test_bad_client_data_is_refused_before_any_compute(tmp_path):
  folder = str(tmp_path / 'clients')
  raw = _client_data(folder)
  with pytest.raises(errors.ConfigError, match='wrap the ClientData'):
    experiment.prepare(_config(), str(tmp_path), client_data=raw,
                       test_data=_test_set())
  clients = _wrap(folder)
  with pytest.raises(errors.ConfigError, match='needs test_data'):
    experiment.prepare(_config(), str(tmp_path), client_data=clients)
  with pytest.raises(errors.ConfigError, match='do not match'):
    experiment.prepare(_config(), str(tmp_path), client_data=clients,
                       test_data=(np.zeros([4, 28, 28, 1]), np.zeros([4])))
  with pytest.raises(errors.ConfigError, match='does not map'):
    tff_client_data.TFFClientData(raw, name='w', num_classes=10,
                                  x_key='image')
  with pytest.raises(errors.ConfigError, match='clients_per_round=400'):
    experiment.prepare(_config(clients_per_round=400), str(tmp_path),
                       client_data=clients, test_data=_test_set())
  assert not os.path.exists(folder)  # Nothing was read (or written).


def test_tff_dataset_offline_names_the_folder_to_fill(tmp_path, monkeypatch):
  # No network: a refused connection fails at once, as an offline machine's
  # unresolvable host does, and never waits on a download.
  source = datasets_lib.TFF_DATASETS['tff:emnist']
  monkeypatch.setitem(
      datasets_lib.TFF_DATASETS, 'tff:emnist', source._replace(
          origin='http://127.0.0.1:9/emnist_all.sqlite.lzma'))
  config = _config(**{'dataset.name': 'tff:emnist',
                      'dataset.data_dir': str(tmp_path)})
  cache = os.path.join(str(tmp_path), 'tff')
  with pytest.raises(errors.DataError,
                     match=f'tff:emnist needs emnist_all.sqlite in {cache} '
                     'and could not download it'):
    experiment.prepare(config, str(tmp_path / 'run'))
  assert os.listdir(cache) == []  # No partial file left as a cache.


def test_tff_dataset_settings():
  experiment.from_config(_config(**{'dataset.name': 'tff:emnist'}))
  with pytest.raises(errors.ConfigError, match='do not apply to a ClientData'):
    experiment.from_config(_config(**{'dataset.name': 'tff:emnist',
                                          'dataset.train_limit': 10}))
  with pytest.raises(errors.ConfigError, match="dataset 'tff:nope' is unknown"):
    experiment.from_config(_config(**{'dataset.name': 'tff:nope'}))


def test_test_set_forms_give_the_same_arrays(tmp_path):
  folder = str(tmp_path / 'clients')
  _write(folder, keep={0, 1, 2})
  clients = _wrap(folder)
  test_clients = _client_data(folder, num_clients=3)
  x, y = tff_client_data.central_test_set(test_clients, clients)
  assert x.shape == (15, 8, 8, 1) and y.dtype == np.int32
  assert x.min() >= -1.0 and x.max() <= 1.0 and x.min() < 0.0
  for other in ((x, y), tf.data.Dataset.from_tensor_slices((x, y)),
                tf.data.Dataset.from_tensor_slices((x, y)).batch(4)):
    got = tff_client_data.central_test_set(other, clients)
    np.testing.assert_array_equal(got[0], x)
    np.testing.assert_array_equal(got[1], y)
  # The keyed path reads the same examples, client by client (the
  # ClientData's all-clients dataset shuffles the clients' order).
  def rows(x, y):
    return sorted(xi.tobytes() + yi.tobytes() for xi, yi in zip(x, y))

  keyed = [clients.read_arrays(tf.constant(str(k))) for k in range(3)]
  assert rows(x, y) == rows(np.concatenate([k[0].numpy() for k in keyed]),
                            np.concatenate([k[1].numpy() for k in keyed]))
  d = datasets.load_digits()
  np.testing.assert_array_equal(
      keyed[1][0].numpy(), data_lib.normalise(d.images[5:10] / 16.0)[..., None])
