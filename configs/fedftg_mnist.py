"""FedFTG (Zhang et al., CVPR 2022) on MNIST: 20 clients, 8 per round, Dir(0.1).

The MNIST setting of `configs/mnist.py` with the small CNN. The server
fine-tunes the FedAvg model each round with a conditional image generator:
10 iterations of one generator step and 5 student steps (`configs/base.py`,
section `fedftg`: generator Adam 0.01, student SGD 0.1, both x 0.998 per
round).
"""

import ml_collections

from configs import mnist


def get_config() -> ml_collections.ConfigDict:
  c = mnist.get_config()
  c.method = 'fedftg'
  return c
