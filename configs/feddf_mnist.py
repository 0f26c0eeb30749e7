"""FedDF (Lin et al., NeurIPS 2020), homogeneous: MNIST, the small CNN.

The MNIST setting of `configs/mnist.py` (20 clients, 8 per round, Dir(0.1))
with long local work (10 epochs), where client drift hurts FedAvg. The
server holds an unlabeled pool of 10,000 MNIST training images and 500
labeled ones for drop-worst; both are removed from the clients' data. A
same-domain pool is the easy case; `--config.server_data.proxy=fashion_mnist`
(or `usps`) gives an out-of-domain one. Distillation is CPU-sized: at most
200 Adam steps per round (FedDF's reference: up to 10,000).
"""

import ml_collections

from configs import mnist


def get_config() -> ml_collections.ConfigDict:
  c = mnist.get_config()
  c.method = 'feddf'
  c.local.unit = 'epochs'
  c.local.amount = 10
  c.server_data.proxy = 'split'
  c.server_data.proxy_size = 10_000
  c.server_data.val_size = 500
  c.feddf.drop_worst = True
  return c
