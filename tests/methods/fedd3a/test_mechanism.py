"""The mechanism against its switched-off twin (tests/methods/mechanisms.py).

FedD3A vs `weighting=avg`: the soft weights leave uniform; on real domains
(shared data) the pool's own domain gets most of the weight.
"""

import os

import numpy as np
import pytest

from tests.conftest import SHARED_DATA
from tests.helpers import digits_config as _config
from tests.methods.mechanisms import _metric
from tests.methods.mechanisms import LOG3
from tests.methods.mechanisms import run
from tff_kd.program import experiment

pytestmark = pytest.mark.slow


def test_fedd3a_soft_weights_leave_uniform(run):
  method = run(method='fedd3a')
  twin = run(method='fedd3a', **{'fedd3a.weighting': 'avg'})
  np.testing.assert_allclose(_metric(twin, 'distill/weight_entropy'), LOG3,
                             rtol=1e-6)
  assert np.all(_metric(method, 'distill/weight_entropy') < LOG3 - 0.05)
  # Uniform weights: the soft ensemble and FedDF's coincide.
  np.testing.assert_array_equal(_metric(twin, 'distill/ensemble_accuracy'),
                                _metric(twin, 'distill/uniform_accuracy'))


def test_fedd3a_weights_the_pool_domain_on_real_domains(tmp_path):
  for path in ('usps/usps.h5', 'mnist/train-images-idx3-ubyte.gz'):
    if not os.path.exists(os.path.join(SHARED_DATA, path)):
      pytest.skip(f'shared data file {path} is missing')
  # Clients: USPS (id 0) and MNIST (id 1); the server's unlabeled pool is
  # USPS images: FedD3A's eq. 6 must favour the USPS client.
  config = _config(**{
      'method': 'fedd3a', 'rounds': 2, 'export': False,
      'dataset.domains': 'usps,mnist', 'dataset.image_shape': '16,16,1',
      'dataset.train_limit': 600, 'dataset.manual_dir': SHARED_DATA,
      'dataset.data_dir': os.environ.get('TFDS_DATA_DIR',
                                         '~/tensorflow_datasets'),
      'partition.kind': 'domain', 'partition.num_clients': 2,
      'clients_per_round': 2, 'local.unit': 'epochs', 'local.amount': 1,
      'local.batch_size': 32, 'server_data.proxy': 'usps',
      'server_data.proxy_size': 300, 'distill.steps': 10,
      'distill.batch_size': 32, 'fedd3a.alpha': 10.0})
  history = experiment.run(config, str(tmp_path), progress=False).history
  weights = _metric(history, 'distill/client_weight_0')
  assert np.all(weights > 0.6), weights
