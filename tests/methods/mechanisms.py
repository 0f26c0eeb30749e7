"""Every KD method against its switched-off twin: the shared runs.

Accuracy above chance cannot tell a KD method from FedAvg on a 3-round toy
run (plain FedAvg passes "> 0.3" too). Each test here runs a method and its
twin with the mechanism switched off, with the same seed, clients and local
work (`train`'s program, scikit-learn's digits, 6 clients, 3 per round, 3
rounds), and checks the method's own mechanism metric moves the way the
method says it should while the twin's does not. The tests live beside
each method (tests/methods/<m>/test_mechanism.py); this module holds their
settings and the `run` fixture:

* FedDF vs distillation lr 0: the KD loss falls within every round;
* DaFKD vs `weighting='uniform'`: eq. 7's weights leave uniform, and (oracle pool)
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

from tests.helpers import digits_config as _config
from tff_kd.program import experiment

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
