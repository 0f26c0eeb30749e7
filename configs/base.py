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

  # Data held by the server (KD methods). Held-out slices are removed from
  # the training set before it is partitioned, whatever the method, so that
  # e.g. FedAvg and FedDF runs with the same settings train the same clients.
  c.server_data = ml_collections.ConfigDict(dict(
      # '' none | 'split' (an unlabeled slice held out of the training set) |
      # a dataset name (its training images, resized to the training shape;
      # labels are dropped), e.g. 'fashion_mnist' or 'usps' for MNIST.
      proxy='',
      proxy_size=0,  # Examples in the unlabeled distillation pool.
      # Labeled examples held out of the training set for the server:
      # FedDF's drop-worst and the distillation diagnostics.
      val_size=0,
  ))
  # Server-side distillation (tff_kd.core.distillation.DistillConfig).
  # FedDF's reference: Adam 1e-3, batch 128, up to 10,000 steps with cosine
  # decay, validation every 100 steps, patience 10 (1,000 steps), clipping
  # at 5. These defaults are CPU-sized: 200 steps per round.
  c.distill = ml_collections.ConfigDict(dict(
      steps=200,
      batch_size=128,
      learning_rate=1e-3,  # Adam.
      temperature=1.0,
      clip_norm=5.0,
      val_fraction=0.1,  # Of the pool, for early stopping (0: off).
      eval_every=50,
      patience=4,
      cosine_decay=True,
      student_training=True,
  ))
  c.feddf = ml_collections.ConfigDict(dict(
      drop_worst=False,  # Needs server_data.val_size > 0.
      # '' = homogeneous (model.name / model.norm). Otherwise a comma list of
      # prototypes `name[:norm]`, e.g. 'cnn,resnet11'; client i trains
      # prototype i % P.
      prototypes='',
  ))

  c.eval_every = 1
  c.eval_batch_size = 1000
  c.checkpoint_every = 1
  c.keep_checkpoints = 3
  c.export = True
  return c
