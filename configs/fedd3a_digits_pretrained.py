"""FedD3A cross-silo digits starting from pretrained weights.

`configs/fedd3a_digits_silo.py` with the paper's pretrained start (Su, Li,
Xue, AAAI 2023, start every model from ImageNet weights): offline, the CNN
pretrained on Fashion-MNIST, resized to 32x32 and made RGB like the digit
domains, by `benchmarks/pretrain.py` (88.2% Fashion-MNIST test accuracy;
`benchmarks/results/pretrain_cnn.json`). No client domain (MNIST, USPS,
MNIST-M) and not the server pool (`digits`) is Fashion-MNIST. Make the
weights first (about 2 minutes on 2 CPU cores, cached under the data dir):

    .venv/bin/python -m benchmarks.pretrain --model=cnn --manual_dir=../shared/data

Measured (5 rounds, seed 0): no gain over the seeded start (84.1% vs
84.2%; benchmarks/README.md): the small CNN's Fashion-MNIST features do not
transfer to digits as ImageNet ResNet features do. Online, the paper's own
start is e.g.
`--config.model.name=keras:ResNet50 --config.model.weights=imagenet`
(slow on CPU).
"""

import os

import ml_collections

from configs import fedd3a_digits_silo


def get_config() -> ml_collections.ConfigDict:
  c = fedd3a_digits_silo.get_config()
  c.model.weights = os.path.join(
      os.path.expanduser(c.dataset.data_dir), 'tff_kd_pretrained',
      'cnn_batch_32x32x3_fashion_mnist_seed0.weights.h5')
  return c
