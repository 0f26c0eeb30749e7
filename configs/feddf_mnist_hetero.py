"""FedDF with heterogeneous models (Lin et al., NeurIPS 2020, Algorithm 3).

`configs/feddf_mnist.py` with two architecture prototypes: even clients
train the small CNN, odd clients ResNet-11. Each prototype is averaged over
its own clients and distilled from all clients' models. `test/accuracy`
is the CNN's, `test/accuracy_p1` ResNet-11's. ResNet-11 is slow on CPU:
expect minutes per round with 10 local epochs.
"""

import ml_collections

from configs import feddf_mnist


def get_config() -> ml_collections.ConfigDict:
  c = feddf_mnist.get_config()
  c.feddf.client_models = 'cnn,resnet11'
  return c
