"""The shared method comparison on MNIST (`studies/compare_methods/compare_methods.py`).

Every method of the comparison starts from this config, so all of them train
the same clients on the same data with the same seeds and local work; the
benchmark only sets `method`, `seed` and each variant's own switches (e.g.
`dafkd.weighting='uniform'`). MNIST, 20 clients, 8 per round, Dir(0.1), the small
CNN, 30 rounds, 10 local epochs of SGD (lr 0.05, batch 32): long local work,
where client drift hurts FedAvg.

CPU-sized: the first 24,000 MNIST training images; 5,000 of them are the
server's unlabeled pool (used by FedDF; data-free methods ignore it) and 500
its labeled validation set (FedDF's drop-worst), held out of every method's
client data; the clients share the other 18,500.
"""

import ml_collections

from configs import feddf_mnist

# DaFKD distils on generated images with its own settings (configs/
# dafkd_mnist.py: T = 20, Adam lr 1e-4, BatchNorm statistics frozen);
# `studies/compare_methods/compare_methods.py` applies these to its DaFKD variants.
# Its clients' GAN steps (a DCGAN generator) are large ops, which run faster
# one client at a time with every core per op than with the runtime's
# defaults (one client per core, one thread per op: the fastest for the
# other methods' small models); the rounds compute the same maths, with a
# different round-off (studies/dafkd_pool/results/dafkd_breakdown.md).
METHOD_OVERRIDES = {
    'dafkd': {'distill.temperature': 20.0, 'distill.learning_rate': 1e-4,
              'distill.student_training': False,
              'runtime.concurrent_clients': 1, 'runtime.intra_op_threads': 0},
}


def get_config() -> ml_collections.ConfigDict:
  c = feddf_mnist.get_config()
  c.method = 'fedavg'
  c.dataset.train_limit = 24_000
  c.server_data.proxy_size = 5_000
  c.server_data.val_size = 500
  c.checkpoint_every = c.rounds
  c.export = False
  return c
