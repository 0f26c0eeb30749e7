"""Quick start: FedAvg on scikit-learn's bundled 8x8 digits (no download).

20 clients with Dir(0.5) label skew, 8 per round, 1 local epoch; runs in
about a minute on 2 CPU cores.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  c = base.get_config()
  c.dataset.name = 'digits'
  c.rounds = 30
  c.partition.num_clients = 20
  c.partition.alpha = 0.5
  c.partition.min_size = 20
  c.clients_per_round = 8
  c.local.unit = 'epochs'
  c.local.amount = 1
  c.local.batch_size = 16
  c.client_optimizer.learning_rate = 0.05
  return c
