"""FedGen (Zhu et al., ICML 2021) on MNIST: 20 clients, 8 per round, Dir(0.1).

The MNIST setting of `configs/mnist.py` with the small CNN (FedGen's, whose
32-d feature the generator imitates) and FedGen's reference generator
settings (`configs/base.py`, section `fedgen`): 50 server Adam steps per
round at lr 3e-4, regulariser coefficients 10 * 0.98^round. Local work is
`configs/mnist.py`'s (1 epoch, batch 32, SGD 0.05), so runs compare with
FedAvg on that config; the reference's 20 steps are
`--config.local.unit=steps --config.local.amount=20`. Not
`configs/fedgen_mnist.py`: that is FedAvg on FedGen's benchmark workload.
"""

import ml_collections

from configs import mnist


def get_config() -> ml_collections.ConfigDict:
  c = mnist.get_config()
  c.method = 'fedgen'
  return c
