"""DaFKD (Wang et al., CVPR 2023) on Fashion-MNIST: `dafkd_mnist`'s settings.

Built offline from raw IDX files with
`--config.dataset.manual_dir=../shared/data/fashion_mnist`.
"""

import ml_collections

from configs import dafkd_mnist


def get_config() -> ml_collections.ConfigDict:
  c = dafkd_mnist.get_config()
  c.dataset.name = 'fashion_mnist'
  return c
