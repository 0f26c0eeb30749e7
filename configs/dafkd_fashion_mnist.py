"""DaFKD (Wang et al., CVPR 2023) on Fashion-MNIST: `dafkd_mnist`'s settings.

Including its distillation learning rate (Adam 1e-4, the reference code's;
the paper's 0.01: `--config.distill.learning_rate=0.01`).

Built offline from raw IDX files with
`--config.dataset.manual_dir=../shared/data/fashion_mnist`.
"""

import ml_collections

from configs import dafkd_mnist


def get_config() -> ml_collections.ConfigDict:
  c = dafkd_mnist.get_config()
  c.dataset.name = 'fashion_mnist'
  return c
