"""FedD3A cross-silo digits starting from pretrained weights.

`configs/fedd3a_digits_silo.py` with the paper's pretrained start (Su, Li,
Xue, AAAI 2023, start every model from ImageNet weights), offline: the CNN
pretrained on Fashion-MNIST, resized to 32x32 and made RGB like the digit
domains (`model.weights='pretrain:fashion_mnist'`,
`tff_kd.models.pretraining`). No client domain (MNIST, USPS, MNIST-M) and
not the server pool (`digits`) is Fashion-MNIST. The first run makes the
weights (5 epochs, about 2 minutes on 2 CPU cores, with a progress bar) and
caches them under the data dir's `tff_kd_pretrained/`; later runs read them.

Measured (5 rounds, seed 0): no gain over the seeded start (84.1% vs
84.2%; studies/fedd3a_protocol/README.md): the small CNN's Fashion-MNIST features do not
transfer to digits as ImageNet ResNet features do. Online, the paper's own
start is e.g.
`--config.model.name=keras:ResNet50 --config.model.weights=imagenet`
(slow on CPU).
"""

import ml_collections

from configs import fedd3a_digits_silo


def get_config() -> ml_collections.ConfigDict:
  c = fedd3a_digits_silo.get_config()
  c.model.weights = 'pretrain:fashion_mnist'
  return c
