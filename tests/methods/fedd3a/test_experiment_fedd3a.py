"""`train --method=fedd3a` in-process on real digit domains; domain configs.

Clients come from two real digit domains (USPS and scikit-learn's digits,
both fast to read), the server's unlabeled pool from a third (MNIST), all at
16x16x1. tfds prepares MNIST once in the configured data_dir
(~/tensorflow_datasets unless TFDS_DATA_DIR is set) from the shared raw
files; later runs reuse it.
"""

import os

import numpy as np
import pytest

from configs import fedd3a_digits_device
from configs import fedd3a_digits_silo
from tests.conftest import SHARED_DATA
from tests.helpers import digits_config as _config
from tff_kd import data as data_lib
from tff_kd import errors
from tff_kd.program import setup
from tff_kd.program import experiment

DATA_DIR = os.environ.get('TFDS_DATA_DIR', '~/tensorflow_datasets')


def _domain_config(**overrides):
  base = {
      'method': 'fedd3a', 'rounds': 1,
      'dataset.domains': 'usps,digits', 'dataset.image_shape': '16,16,1',
      'dataset.train_limit': 300, 'dataset.manual_dir': SHARED_DATA,
      'dataset.data_dir': DATA_DIR,
      'partition.kind': 'domain', 'partition.clients_per_domain': 1,
      'partition.num_clients': 2, 'clients_per_round': 2,
      'local.batch_size': 32,
      'server_data.proxy': 'mnist', 'server_data.proxy_size': 200,
      'distill.steps': 6, 'distill.batch_size': 32, 'distill.eval_every': 3,
      'fedd3a.alpha': 10.0, 'export': False,
  }
  base.update(overrides)
  return _config(**base)


def _need_shared_data():
  for path in ('usps/usps.h5', 'mnist/train-images-idx3-ubyte.gz'):
    if not os.path.exists(os.path.join(SHARED_DATA, path)):
      pytest.skip(f'shared data file {path} is missing')


@pytest.mark.parametrize('overrides,match', [
    ({'dataset.domains': 'usps,svhn'},
     "dataset.domains entry 'svhn' is unknown"),
    ({'dataset.domains': 'usps,usps'}, 'lists a domain twice'),
    ({'dataset.image_shape': '16,16'}, "image_shape must be 'H,W,C'"),
    ({'dataset.image_shape': '16,16,2'}, "image_shape must be 'H,W,C'"),
    ({'partition.kind': 'dirichlet'},
     "dataset.domains needs partition.kind='domain'"),
    ({'dataset.domains': ''}, "partition.kind='domain' needs dataset.domains"),
    ({'partition.num_clients': 3},
     'num_clients=3 but 2 domains with clients_per_domain=1 make 2'),
    ({'partition.clients_per_domain': 0}, 'clients_per_domain must be an integer >= 1'),
    ({'fedd3a.alpha': 0.0}, r'fedd3a.alpha .* > 0, got 0.0'),
    ({'fedd3a.weighting': 'best'}, "fedd3a.weighting 'best' is unknown"),
    ({'server_data.proxy': ''}, 'fedd3a needs a proxy pool'),
])
def test_bad_domain_settings_fail_before_compute(tmp_path, overrides, match):
  with pytest.raises(errors.ConfigError, match=match):
    experiment.run(_domain_config(**overrides), str(tmp_path), progress=False)
  assert not os.listdir(tmp_path)


def test_shipped_fedd3a_configs_validate():
  silo = fedd3a_digits_silo.get_config()
  device = fedd3a_digits_device.get_config()
  for c in (silo, device):
    experiment.from_config(c)
    assert c.server_data.proxy not in experiment.from_config(c).dataset.domain_names
  assert experiment.from_config(silo).dataset.domain_names == ['mnist', 'usps', 'mnist_m']
  assert (silo.partition.num_clients, device.partition.num_clients) == (3, 15)
  assert device.partition.alpha == 0.2


def test_domain_partition_gives_single_domain_clients():
  rng = np.random.default_rng(0)
  dataset = data_lib.Dataset(
      'a+b', np.zeros((200, 2, 2, 1), np.float32),
      rng.integers(0, 10, 200).astype(np.int32), np.zeros((1, 2, 2, 1)),
      np.zeros(1, np.int32), 10, np.repeat([0, 1], 100).astype(np.int32))
  c = _domain_config(**{'partition.clients_per_domain': 3,
                        'partition.num_clients': 6, 'partition.alpha': 0.3,
                        'partition.min_size': 5})
  settings = experiment.from_config(c)
  parts, _ = setup._partition(settings, dataset)  # pylint: disable=protected-access
  assert len(parts) == 6
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)),
                                np.arange(200))
  for i, p in enumerate(parts):  # Clients 0-2: domain 0; 3-5: domain 1.
    assert set(dataset.train_domains[p]) == {i // 3}


def test_fedd3a_cross_silo_run_reports_each_domain(tmp_path):
  _need_shared_data()
  result = experiment.run(_domain_config(), str(tmp_path), progress=False)
  final = result.final
  accs = [final['test/accuracy_usps'], final['test/accuracy_digits']]
  assert final['test/accuracy'] == pytest.approx(np.mean(accs))
  row = result.history[-1]
  assert row['distill/num_teachers'] == 2.0
  # The per-client weights are per-pool means of columns that sum to 1.
  assert row['distill/client_weight_0'] + row['distill/client_weight_1'] == (
      pytest.approx(1.0, abs=1e-6))
  # (The weights' mechanism: tests/methods/fedd3a/test_mechanism.py.)


def test_cross_device_domain_clients_train_end_to_end(tmp_path):
  # FedAvg (a cheap process to build) on the cross-device split: Dir(beta)
  # label skew inside each domain, per-domain evaluation.
  _need_shared_data()
  c = _domain_config(**{
      'method': 'fedavg', 'server_data.proxy': '',
      'partition.clients_per_domain': 2,
      'partition.num_clients': 4, 'partition.alpha': 0.5,
      'partition.min_size': 5, 'clients_per_round': 3})
  final = experiment.run(c, str(tmp_path), progress=False).final
  assert final['test/accuracy'] == pytest.approx(np.mean(
      [final['test/accuracy_usps'], final['test/accuracy_digits']]))


def test_holding_out_server_images_keeps_the_domain_ids_aligned():
  """Regression: the held-out slices must leave the clients' domain ids
  aligned with their images (they were not filtered: the domain partition
  then indexed past the training set)."""
  rng = np.random.default_rng(1)
  domains = np.repeat([0, 1], 100).astype(np.int32)
  dataset = data_lib.Dataset(
      'a+b', domains.astype(np.float32).reshape(200, 1, 1, 1),
      rng.integers(0, 10, 200).astype(np.int32), np.zeros((1, 1, 1, 1)),
      np.zeros(1, np.int32), 10, domains)
  c = _domain_config(**{'server_data.val_size': 30,
                        'server_data.proxy': 'split',
                        'server_data.proxy_size': 20})
  settings = experiment.from_config(c)
  clients, _, val_x, _ = setup._hold_out(settings, dataset)  # pylint: disable=protected-access
  assert len(clients.train_domains) == len(clients.y_train) == 150
  # Each image's single pixel is its domain id.
  np.testing.assert_array_equal(clients.x_train[:, 0, 0, 0],
                                clients.train_domains)
  settings = experiment.from_config(c)
  parts, _ = setup._partition(settings, clients)  # pylint: disable=protected-access
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)),
                                np.arange(150))
