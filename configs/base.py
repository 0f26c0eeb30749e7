"""Defaults shared by every experiment; other configs start from this one.

Every setting of an experiment lives here or in a config derived from it;
the `train` binary has no other knobs besides --method, --root_dir, --seed.
Override any key on the command line, e.g. `--config.rounds=60`.
"""

import ml_collections

from tff_kd import hparams as hp
from tff_kd.methods.dafkd import hparams as dafkd_hparams
from tff_kd.methods.fedd3a import hparams as fedd3a_hparams
from tff_kd.methods.feddf import hparams as feddf_hparams
from tff_kd.methods.fedftg import hparams as fedftg_hparams
from tff_kd.methods.fedgen import hparams as fedgen_hparams
from tff_kd.methods.fedprox import hparams as fedprox_hparams


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
      # Multi-domain data (FedD3A's digit domains): a comma list such as
      # 'mnist,usps,mnist_m' replaces `name`; every domain is resized and
      # channel-matched to `image_shape` ('H,W,C') and `train_limit` applies
      # per domain. Clients then come from `partition.kind='domain'`.
      domains='',
      image_shape='32,32,3',
  ))
  c.partition = ml_collections.ConfigDict(dict(
      kind='dirichlet',  # dirichlet | iid | fedgen
      num_clients=20,
      alpha=0.1,  # Dir(alpha) label skew.
      min_size=10,  # Dirichlet: every client gets at least this many.
      per_class=0,  # fedgen recipe: training samples taken per class.
      # domain: clients per domain (1 = cross-silo; > 1 = cross-device, each
      # domain split with Dir(alpha) label skew). num_clients must equal
      # clients_per_domain * the number of domains.
      clients_per_domain=1,
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
  # Each method's section holds the fields (and defaults) of its
  # tff_kd.hparams dataclass, which documents every key.
  c.fedprox = hp.config_section(fedprox_hparams.FedProxHparams)

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
      # False: the student trains in inference mode and keeps the averaged
      # model's BatchNorm statistics; True: FedDF's code (training mode,
      # the pool's statistics replace them).
      student_training=False,
      # Early stopping on 'pool' (KD loss on val_fraction of the pool) or
      # 'labeled' (cross-entropy on server_data's labeled validation set).
      validation='pool',
      # 'always' | 'no_worse': keep the student only if its accuracy on the
      # labeled validation set does not drop (needs server_data.val_size).
      accept='always',
  ))
  c.feddf = hp.config_section(feddf_hparams.FedDFHparams)

  # FedD3A (Su, Li, Xue, AAAI 2023). The distillation uses `distill`.
  c.fedd3a = hp.config_section(fedd3a_hparams.FedD3AHparams)

  # FedGen (Zhu et al., ICML 2021); defaults: its reference code on MNIST.
  c.fedgen = hp.config_section(fedgen_hparams.FedGenHparams)
  # FedFTG (Zhang et al., CVPR 2022); reference values where known.
  c.fedftg = hp.config_section(fedftg_hparams.FedFTGHparams)

  # DaFKD (Wang et al., CVPR 2023). Client optimiser: client_optimizer;
  # distillation: distill.*.
  c.dafkd = hp.config_section(dafkd_hparams.DaFKDHparams)

  # Where rounds run. workers='': TFF's local C++ runtime in this process
  # (one worker_binary child). 'host:port,...': TFF's remote runtime on
  # running worker services (`tff_kd_worker --port=N` on each machine); each
  # round's clients are split across them (tff_kd.program.runtime). A worker
  # unreachable for worker_timeout_s seconds stops the run with an error
  # naming it; the same command resumes once it is back.
  # server_device: where a KD method's server step (distillation, generator
  # training) runs. 'runtime': inside TFF's runtime, whose PyPI build has no
  # CUDA. 'driver': in this process's TensorFlow, which places it (a visible
  # GPU first); or a device string ('/GPU:0', '/CPU:0') to pin it there. The
  # driver modes give the same rounds but cannot be driven by
  # tff.learning.programs.train_model (tff_kd.program.server_stage).
  # concurrent_clients: client computations the local worker runs at a time
  # (0: one per usable core; -1: no limit, TFF's default). intra_op_threads:
  # threads inside each TensorFlow op in the local worker (0: TensorFlow's
  # default, every core). The defaults are the fastest measured for this
  # library's models (benchmarks/results/threads.md); remote workers take
  # theirs from `tff_kd_worker`'s flags.
  c.runtime = ml_collections.ConfigDict(dict(
      workers='',
      worker_timeout_s=60.0,
      server_device='runtime',
      concurrent_clients=0,
      intra_op_threads=1,
  ))

  c.eval_every = 1
  c.eval_batch_size = 1000
  c.checkpoint_every = 1
  c.keep_checkpoints = 3
  c.export = True
  return c
