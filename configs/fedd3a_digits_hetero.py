"""FedD3A (Su, Li, Xue, AAAI 2023) with heterogeneous client models.

The paper's "Application to Heterogeneous Models" (Sec. 3) on the
cross-silo digits of `configs/fedd3a_digits_silo.py`: clients MNIST, USPS
and MNIST-M, server pool scikit-learn's `digits`. Client i keeps its own
model of architecture `fedd3a.client_models[i % 2]` across rounds (MNIST
and MNIST-M: the small CNN; USPS: ResNet-11), trained each round with
cross-entropy plus KD (weight `kd_weight`, temperature `kd_temperature`)
from the received global model; the global model is `model` (the CNN),
distilled on the server from the domain-weighted ensemble of the clients'
own models, starting from the previous global model (no averaging across
architectures). `test/accuracy*` is the global model's.

ResNet-11 is slow on CPU (minutes per round on 5,000 32x32 images); for a
quick run use e.g. `--config.fedd3a.client_models=cnn:batch,cnn:group`.
"""

import ml_collections

from configs import fedd3a_digits_silo


def get_config() -> ml_collections.ConfigDict:
  c = fedd3a_digits_silo.get_config()
  c.fedd3a.client_models = 'cnn,resnet11'
  c.fedd3a.kd_weight = 1.0
  c.fedd3a.kd_temperature = 1.0
  return c
