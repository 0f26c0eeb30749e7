"""`train --method=feddf` in-process on digits: heterogeneous end to end.

Also the FedDF config checks, which all fail before any compute.
"""

import glob
import json
import os

import pytest

from configs import feddf_mnist
from configs import feddf_mnist_hetero
from tests.conftest import SHARED_DATA
from tests.helpers import digits_config as _config
from tff_kd import data as data_lib
from tff_kd import errors
from tff_kd.program import setup
from tff_kd.program import experiment


def _feddf_config(**overrides):
  base = {
      'method': 'feddf', 'clients_per_round': 4,
      'server_data.proxy': 'split', 'server_data.proxy_size': 300,
      'server_data.val_size': 100, 'feddf.drop_worst': True,
      'distill.steps': 40, 'distill.batch_size': 64,
      'distill.eval_every': 10, 'export': False,
  }
  base.update(overrides)
  return _config(**base)


@pytest.mark.parametrize('overrides,match', [
    ({'server_data.proxy': ''}, 'feddf needs a proxy pool'),
    ({'server_data.proxy': 'nodata'}, "server_data.proxy 'nodata' is unknown"),
    ({'server_data.proxy_size': 0}, 'proxy_size must be >= 1, got 0'),
    ({'server_data.val_size': 0}, 'drop_worst needs server_data.val_size'),
    ({'distill.steps': 0}, 'distill.steps must be an integer >= 1, '
                           'got 0'),
    ({'feddf.client_models': 'cnn,vgg'}, "client_models entry 'vgg' is not"),
    ({'feddf.client_models': 'cnn:layer'}, "client_models entry 'cnn:layer'"),
])
def test_bad_feddf_settings_fail_before_compute(tmp_path, overrides, match):
  with pytest.raises(errors.ConfigError, match=match):
    experiment.run(_feddf_config(**overrides), str(tmp_path), progress=False)
  assert not os.listdir(tmp_path)


def test_holding_out_more_than_the_training_set(tmp_path):
  c = _feddf_config(**{'server_data.proxy_size': 5000})
  with pytest.raises(errors.ConfigError, match='holds out 5100 training'):
    experiment.run(c, str(tmp_path), progress=False)


def test_shipped_feddf_configs_validate():
  for module in (feddf_mnist, feddf_mnist_hetero):
    experiment.from_config(module.get_config())
  c = feddf_mnist_hetero.get_config()
  assert experiment.from_config(c).prototypes == [('cnn', 'batch'), ('resnet11', 'batch')]


def test_other_dataset_as_proxy_is_resized_and_unlabeled(tmp_path):
  manual = os.path.join(SHARED_DATA, 'usps')
  if not os.path.exists(os.path.join(manual, 'usps.h5')):
    pytest.skip('usps.h5 is not available')
  c = _feddf_config(**{'server_data.proxy': 'usps',
                       'server_data.proxy_size': 50,
                       'dataset.manual_dir': manual,
                       'dataset.data_dir': str(tmp_path / 'tfds')})
  digits = data_lib.load_dataset('digits')
  settings = experiment.from_config(c)
  clients, proxy, val_x, val_y = setup._hold_out(settings, digits)  # pylint: disable=protected-access
  assert proxy is None  # Nothing of the training set goes to the pool ...
  assert len(val_y) == 100  # ... only the labeled validation slice.
  assert len(clients.y_train) == len(digits.y_train) - 100
  server = setup._server_data(  # pylint: disable=protected-access
      settings, clients, proxy, val_x, val_y, str(tmp_path / 'server'))
  assert server.pool_size == 50 and server.image_shape == (8, 8, 1)
  assert server.proxy_name == 'usps' and server.val_size == 100
  assert not os.path.exists(tmp_path / 'server' / 'pool.y')


@pytest.mark.slow
def test_heterogeneous_feddf_distils_into_both_prototypes(tmp_path):
  c = _feddf_config(**{'feddf.client_models': 'cnn:batch,cnn:group',
                       'rounds': 3})
  result = experiment.run(c, str(tmp_path), progress=False)
  digits = data_lib.load_dataset('digits')
  # Both students learn the ensemble of all 4 teachers (both
  # architectures): their KD loss falls in every round.
  for h in result.history:
    assert h['distill/num_teachers'] == 4
    assert h['distill/teachers_kept'] == 4  # drop_worst is off.
    assert h['distill/num_clients_p0'] + h['distill/num_clients_p1'] == 4
    for p in ('p0', 'p1'):
      assert h[f'distill/last_loss_{p}'] < 0.7 * h[f'distill/first_loss_{p}'], (
          p, h)
  assert 'test/accuracy_p1' in result.final
  # The server's 400 examples are held out of the clients' data.
  [manifest] = glob.glob(os.path.join(tmp_path, 'client_data', '*',
                                      'manifest.json'))
  with open(manifest) as f:
    assert sum(json.load(f)['num_examples']) == len(digits.y_train) - 400
  with open(os.path.join(tmp_path, 'metrics.csv')) as f:
    header = f.readline()
  assert 'distill/samples_per_second' in header and 'test/accuracy_p1' in header
