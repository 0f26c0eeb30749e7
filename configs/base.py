"""Defaults shared by every experiment; other configs start from this one.

Every setting of an experiment lives here or in a config derived from it;
the `train` binary has no other knobs besides --method, --root_dir, --seed.
Override any key on the command line, e.g. `--config.rounds=60`.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.method = 'fedavg'
  c.seed = 0
  c.rounds = 30

  c.dataset = ml_collections.ConfigDict(dict(
      name='mnist',
      data_dir='~/tensorflow_datasets',  # tfds data_dir and decoded caches.
      manual_dir='',  # Raw files for offline tfds builds / USPS / MNIST-M.
      train_limit=0,  # > 0 keeps only the first N training examples.
  ))
  c.partition = ml_collections.ConfigDict(dict(
      kind='dirichlet',  # dirichlet | iid | fedgen
      num_clients=20,
      alpha=0.1,  # Dir(alpha) label skew.
      min_size=10,  # Dirichlet: every client gets at least this many.
      per_class=0,  # fedgen recipe: training samples taken per class.
  ))
  c.clients_per_round = 8
  c.model = ml_collections.ConfigDict(dict(name='cnn', norm='batch'))
  c.local = ml_collections.ConfigDict(dict(
      unit='steps',  # steps | epochs
      amount=20,
      batch_size=32,
  ))
  c.client_optimizer = ml_collections.ConfigDict(dict(
      name='sgd', learning_rate=0.01, momentum=0.0, lr_decay=1.0))
  c.server_optimizer = ml_collections.ConfigDict(dict(
      name='sgd', learning_rate=1.0, momentum=0.0))
  c.fedprox = ml_collections.ConfigDict(dict(mu=0.01))

  c.eval_every = 1
  c.eval_batch_size = 1000
  c.checkpoint_every = 1
  c.keep_checkpoints = 3
  c.export = True
  return c
