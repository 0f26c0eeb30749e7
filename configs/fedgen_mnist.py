"""The FedGen reference workload (Zhu et al., ICML 2021, its README example).

20 users; per class 1,500 training samples split by Dir(0.1); 10 users per
round doing 20 SGD steps of batch 32 with lr 0.01 * 0.99**round; the 26k
parameter CNN. Used by studies/speed/fedgen_workload.py.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  c = base.get_config()
  c.dataset.name = 'mnist'
  c.rounds = 200
  c.partition.kind = 'fedgen'
  c.partition.num_clients = 20
  c.partition.alpha = 0.1
  c.partition.per_class = 1500
  c.partition.min_size = 1
  c.clients_per_round = 10
  c.local.unit = 'steps'
  c.local.amount = 20
  c.local.batch_size = 32
  c.client_optimizer.learning_rate = 0.01
  c.client_optimizer.lr_decay = 0.99
  return c
