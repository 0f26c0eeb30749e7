"""MNIST, 20 clients, 8 per round, Dir(0.1), the small CNN (FedGen's).

Built offline from raw IDX files with
`--config.dataset.manual_dir=../shared/data/mnist`.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  c = base.get_config()
  c.dataset.name = 'mnist'
  c.rounds = 30
  c.partition.num_clients = 20
  c.partition.alpha = 0.1
  c.clients_per_round = 8
  c.local.unit = 'epochs'
  c.local.amount = 1
  c.local.batch_size = 32
  c.client_optimizer.learning_rate = 0.05
  return c
