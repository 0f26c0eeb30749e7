"""FedD3A (Su, Li, Xue, AAAI 2023), cross-silo digits: one client per domain.

The paper's cross-silo setting on Digit-5 (Sec. 4): every client domain is
one client, and the server's unlabeled pool is a different, held-out domain.
SVHN and SynthDigits are not available offline here, so the domains are the
ones in `shared/data` plus scikit-learn's bundled 8x8 digits: clients MNIST,
USPS and MNIST-M, server pool `digits` (all 1,437 of its training images,
labels dropped). Every image is resized (bilinear) to 32x32 and made RGB
(grey repeated), Digit-5's shape; MNIST-M keeps its colour.

Rotate the server domain by override, e.g.
`--config.dataset.domains=mnist,mnist_m,digits --config.server_data.proxy=usps
--config.server_data.proxy_size=5000`.

Evaluation: the global model on each client domain's whole test set
(`test/accuracy_<domain>`); `test/accuracy` is their unweighted mean (the
paper's "average performance of the aggregated model on all clients").

Paper settings kept: 1 local epoch per round, every client every round,
momentum SGD lr 0.01, FedProx mu 0.1 (for baselines), KL distillation from
the average. CPU-sized: the small CNN instead of an ImageNet-pretrained
ResNet18, the first 5,000 training images of each domain, 20 rounds, at most
100 Adam steps of distillation per round (about 9 passes over the pool) with
early stopping, and a constant client learning rate instead of the cosine
schedule.
"""

import os

import ml_collections

from configs import base

SHARED_DATA = os.path.normpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), '..', '..', 'shared', 'data'))


def get_config() -> ml_collections.ConfigDict:
  c = base.get_config()
  c.method = 'fedd3a'
  c.rounds = 20
  c.dataset.domains = 'mnist,usps,mnist_m'
  c.dataset.image_shape = '32,32,3'
  c.dataset.manual_dir = SHARED_DATA
  c.dataset.train_limit = 5_000  # Per domain.
  c.partition.kind = 'domain'
  c.partition.clients_per_domain = 1
  c.partition.num_clients = 3
  c.clients_per_round = 3
  c.model.name = 'cnn'
  c.model.norm = 'batch'
  c.local.unit = 'epochs'
  c.local.amount = 1
  c.local.batch_size = 32
  c.client_optimizer.learning_rate = 0.01
  c.client_optimizer.momentum = 0.9
  c.fedprox.mu = 0.1
  c.server_data.proxy = 'digits'
  c.server_data.proxy_size = 1_437
  c.distill.steps = 100
  # Features of the trained CNN have squared norms of ~100-200; alpha = 10
  # sits between the batch means' energy and the noise (BUILD_NOTES.md).
  c.fedd3a.alpha = 10.0
  c.fedd3a.weighting = 'soft'
  c.fedd3a.variant = 'paper'  # Eq. 7, the paper's protocol (docs/variants.md).
  c.checkpoint_every = 5
  c.export = False
  return c
