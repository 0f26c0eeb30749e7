"""FedD3A (Su, Li, Xue, AAAI 2023), cross-device digits: 5 clients a domain.

The cross-silo digits setting of `configs/fedd3a_digits_silo.py` (clients
MNIST, USPS, MNIST-M at 32x32x3; server pool the held-out `digits` domain)
with every domain split over 5 clients by Dir(beta) label skew, beta = 0.2
(`--config.partition.alpha=1.0` for the paper's milder setting): 15 clients,
5 sampled per round, as in the paper's cross-device experiment.
"""

import ml_collections

from configs import fedd3a_digits_silo


def get_config() -> ml_collections.ConfigDict:
  c = fedd3a_digits_silo.get_config()
  c.partition.clients_per_domain = 5
  c.partition.num_clients = 15
  c.partition.alpha = 0.2  # beta of the paper.
  c.partition.min_size = 10
  c.clients_per_round = 5
  c.rounds = 30
  return c
