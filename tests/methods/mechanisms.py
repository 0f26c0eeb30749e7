"""Every KD method against its switched-off twin: the mechanism must show.

Accuracy above chance cannot tell a KD method from FedAvg on a 3-round toy
run (plain FedAvg passes "> 0.3" too). Each test here runs a method and its
twin with the mechanism switched off, with the same seed, clients and local
work (`train`'s program, scikit-learn's digits, 6 clients, 3 per round, 3
rounds), and checks the method's own mechanism metric moves the way the
method says it should while the twin's does not:

* FedDF vs distillation lr 0: the KD loss falls within every round;
* DaFKD vs `no_correlation`: eq. 7's weights leave uniform, and (oracle pool)
  put more mass on the clients that hold a sample's label than uniform
  weights do;
* FedD3A vs `weighting=avg`: the soft weights leave uniform; on real
  domains (shared data) the pool's own domain gets most of the weight;
* FedGen vs `local_alpha = local_beta = 0`: the clients' heads agree more
  with the generator (its teacher accuracy);
* FedFTG vs student lr 0: the student's agreement with the class-level
  teacher on generated samples rises.
"""

import functools
import os

import numpy as np
import pytest

from tests.conftest import SHARED_DATA
from tests.program.test_experiment import _config
from tff_kd.program import experiment

pytestmark = pytest.mark.slow

BASE = {
    'rounds': 3, 'export': False, 'partition.num_clients': 6,
    'clients_per_round': 3, 'partition.alpha': 0.1, 'partition.min_size': 20,
    'local.unit': 'epochs', 'local.amount': 2, 'local.batch_size': 16,
    'server_data.proxy': 'split', 'server_data.proxy_size': 300,
    'server_data.val_size': 200, 'distill.steps': 30,
    'distill.batch_size': 32, 'distill.eval_every': 10,
    'distill.val_fraction': 0.0,
}
DAFKD = {
    'method': 'dafkd', 'dafkd.pool_size': 128, 'dafkd.noise_dim': 16,
    'dafkd.generator': 'dcgan', 'dafkd.aggregation': 'examples',
    'distill.temperature': 20.0, 'distill.learning_rate': 1e-4,
}
LOG3 = np.log(3.0)


@functools.lru_cache(maxsize=None)
def _history(tmp_root: str, **overrides) -> list[dict]:
  config = _config(**{**BASE, **overrides})
  name = '_'.join(f'{k}={v}' for k, v in sorted(overrides.items()))
  return experiment.run(config, os.path.join(tmp_root, name),
                        progress=False).history


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('mechanisms'))
  return lambda **overrides: _history(root, **overrides)


def _metric(history, key):
  return np.array([h[key] for h in history])


def test_feddf_distillation_lowers_the_kd_loss(run):
  method = run(method='feddf')
  twin = run(method='feddf', **{'distill.learning_rate': 0.0})
  ratio = _metric(method, 'distill/last_loss') / _metric(
      method, 'distill/first_loss')
  twin_ratio = _metric(twin, 'distill/last_loss') / _metric(
      twin, 'distill/first_loss')
  assert np.all(ratio < 0.6), ratio
  assert np.all(twin_ratio > 0.9), twin_ratio
  # lr 0 leaves the averaged model: its labeled accuracy is unchanged.
  np.testing.assert_array_equal(_metric(twin, 'distill/val_accuracy_after'),
                                _metric(twin, 'distill/val_accuracy_before'))
  assert np.any(_metric(method, 'distill/val_accuracy_after') !=
                _metric(method, 'distill/val_accuracy_before'))


def test_dafkd_weights_leave_uniform(run):
  method = run(**DAFKD)
  twin = run(**DAFKD, **{'dafkd.no_correlation': True})
  np.testing.assert_allclose(_metric(twin, 'distill/alpha_entropy'), LOG3,
                             rtol=1e-6)
  np.testing.assert_allclose(_metric(twin, 'distill/holder_ratio'), 1.0,
                             rtol=1e-6)
  assert np.all(_metric(method, 'distill/alpha_entropy') < LOG3 - 0.005)


def test_dafkd_oracle_pool_weights_the_holders(run):
  method = run(**DAFKD, **{'dafkd.pool': 'real'})
  twin = run(**DAFKD, **{'dafkd.pool': 'real', 'dafkd.no_correlation': True})
  np.testing.assert_allclose(_metric(twin, 'distill/holder_ratio'), 1.0,
                             rtol=1e-6)
  ratio = _metric(method, 'distill/holder_ratio')
  assert ratio.mean() > 1.1 and ratio[-1] > 1.2, ratio


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


def test_fedgen_clients_agree_with_the_generator(run):
  method = run(method='fedgen')
  twin = run(method='fedgen',
             **{'fedgen.local_alpha': 0.0, 'fedgen.local_beta': 0.0})
  # Round 1 is identical (the regulariser starts in round 2).
  np.testing.assert_allclose(_metric(method, 'distill/teacher_accuracy')[0],
                             _metric(twin, 'distill/teacher_accuracy')[0])
  gain = (_metric(method, 'distill/teacher_accuracy')[1:] -
          _metric(twin, 'distill/teacher_accuracy')[1:])
  assert np.all(gain > 0.05), gain


def test_fedftg_fine_tuning_moves_the_student_to_the_teacher(run):
  # 10 student steps per iteration instead of 5: FedFTG's adversarial
  # fine-tuning amplifies float round-off (BUILD_NOTES, "Server step outside
  # the runtime"), and with 5 the rise per round moved with the process's
  # threading between +0.215/-0.008/+0.129 and +0.031/0/+0.078 (4 and 10 of
  # 128 samples). With 10: +0.184/+0.059/+0.074 in the suite,
  # +0.117/+0.020/+0.113 alone.
  steps = {'fedftg.student_steps': 10}
  method = run(method='fedftg', **steps)
  twin = run(method='fedftg', **steps, **{'fedftg.student_learning_rate': 0.0})
  rise = (_metric(method, 'distill/agreement_after') -
          _metric(method, 'distill/agreement_before'))
  np.testing.assert_array_equal(_metric(twin, 'distill/agreement_after'),
                                _metric(twin, 'distill/agreement_before'))
  # The mechanism is the mean rise and a rise in most rounds.
  assert rise.mean() > 0.05 and np.sum(rise > 0) >= 2, rise
