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
  c.feddf = ml_collections.ConfigDict(dict(
      drop_worst=False,  # Needs server_data.val_size > 0.
      # '' = homogeneous (model.name / model.norm). Otherwise a comma list of
      # prototypes `name[:norm]`, e.g. 'cnn,resnet11'; client i trains
      # prototype i % P.
      prototypes='',
  ))

  # FedD3A (Su, Li, Xue, AAAI 2023). The distillation uses `distill`.
  c.fedd3a = ml_collections.ConfigDict(dict(
      alpha=1.0,  # Ridge of eq. 5, > 0, in squared feature units.
      weighting='soft',  # soft (eq. 6) | onehot | avg | random (Table 1).
      ensemble='probs',  # probs (eq. 7) | logits.
      projection_batches=0,  # Local batches P is built from; 0 = all.
      # Backbone of the server samples' features in eq. 6: broadcast (w_t,
      # the space the clients' P_k were built in) | aggregated (the
      # averaged model after local training).
      score_backbone='broadcast',
      # Heterogeneous clients: '' = every client trains `model`. Otherwise a
      # comma list `name[:norm]` (e.g. 'cnn,resnet11'); client i keeps its
      # own model of entry i % A across rounds, trained with CE + kd_weight
      # * KD (temperature kd_temperature) from the received global model.
      client_models='',
      kd_weight=1.0,
      kd_temperature=1.0,
  ))

  # FedGen (Zhu et al., ICML 2021); defaults: its reference code on MNIST.
  c.fedgen = ml_collections.ConfigDict(dict(
      generator_steps=50,  # Server Adam steps per round.
      generator_batch_size=32,
      generator_learning_rate=3e-4,
      noise='gaussian',  # gaussian (the paper) | uniform (reference code).
      noise_dim=32,
      hidden=256,
      output_activation='',  # '' = linear (reference) | e.g. 'relu'.
      teacher_ensemble='per_head',  # per_head (reference) | logits (paper).
      teacher_weight=1.0,
      diversity_weight=1.0,
      local_alpha=10.0,  # Clients' generated-feature CE, x 0.98^round.
      local_beta=10.0,  # Clients' latent KL (0 = the paper's objective).
      coefficient_decay=0.98,
      local_gen_batch_size=32,
      start_round=1,  # Clients' regulariser is off before this round.
      # Local steps the coefficients are for (reference: 20); longer client
      # rounds scale them by reference_steps / steps (0: never).
      reference_steps=20,
  ))
  # FedFTG (Zhang et al., CVPR 2022); reference values where known.
  c.fedftg = ml_collections.ConfigDict(dict(
      iterations=10,  # Generator step + student steps, per round.
      student_steps=5,  # Through distillation.distill.
      batch_size=64,  # Generated samples per step.
      generator_learning_rate=0.01,  # Adam.
      student_learning_rate=0.1,  # SGD.
      lr_decay=0.998,  # Per round, both learning rates.
      temperature=1.0,
      student_training=False,  # False: BatchNorm statistics frozen.
      noise='gaussian',  # gaussian | uniform.
      noise_dim=100,
      transfer_weight=1.0,  # beta_tran (hard-sample term).
      diversity_weight=1.0,  # beta_div.
      mask='agree',  # agree | none.
      ensemble='logits',  # Class-level ensemble of logits | probs.
      # Generator steps per iteration (0: one per teacher, the reference's).
      generator_steps=0,
      # Student KD loss over batch x classes (mean, the reference's: SGD's
      # step is C times smaller) | batchmean.
      kl_reduction='mean',
  ))

  # DaFKD (Wang et al., CVPR 2023). Client optimiser: client_optimizer
  # (paper: lr 1e-3, weight decay 1e-3 -> name=adam plus weight_decay, i.e.
  # AdamW); distillation: distill.* (paper: lr 0.01; reference: T = 20).
  c.dafkd = ml_collections.ConfigDict(dict(
      pool_size=1280,  # Generated distillation images per round (reference).
      noise_dim=100,
      generator_hidden='256,512',  # FC+BN+LeakyReLU widths.
      generator_learning_rate=1e-3,  # Adam (paper 1e-3).
      generator_beta_1=0.5,  # Reference code's Adam betas (0.5, 0.99).
      generator_beta_2=0.99,
      generator='mlp',  # mlp (the paper's) | dcgan (the reference code's).
      generator_form='non_saturating',  # non_saturating | minimax (eq. 3).
      # BatchNorm mode of everything the discriminator scores in training:
      # inference (as the server scores; default) | real_train | batch |
      # batch_update (the reference code). See core.gan.client_gan_step.
      discriminator_mode='inference',
      # GAN terms (eq. 2 in eq. 9, eq. 3) only in gan_steps local steps of
      # a round, plain CE steps in the others; 0 = every step (Algorithm 1).
      gan_steps=0,
      # Where those steps are: first (reference code: first epochs) | last
      # (the head ends the round in step with the extractor it uploads).
      gan_window='last',
      adv_weight=1.0,  # Weight of eq. 2 in eq. 9.
      gp_weight=0.0,  # Gradient penalty (reference code 0.3, paper 0).
      weight_decay=0.0,  # > 0 needs client_optimizer.name=adam (AdamW).
      no_sharing=False,  # Ablation: separate discriminator network.
      no_correlation=False,  # Ablation: uniform teacher weights.
      weights_on='probs',  # probs (eq. 8) | logits (reference code).
      private=False,  # Appendix B; needs a secure-sum (test) context.
      pool_generator='',  # '' auto | aggregated | broadcast.
      # Averaging of classifiers and generators: mean (the paper's 1/K_t) |
      # examples (FedAvg's n_k / n).
      aggregation='mean',
      # generator (DaFKD) | real: the oracle-pool ablation (negatives and
      # distillation pool are the server's real proxy images).
      pool='generator',
      # Diagnostics (with server_data.val_size > 0): a client holds a label
      # when at least this share of its examples have it.
      holder_share=0.05,
  ))

  # Where rounds run. workers='': TFF's local C++ runtime in this process
  # (one worker_binary child). 'host:port,...': TFF's remote runtime on
  # running worker services (`tff_kd_worker --port=N` on each machine); each
  # round's clients are split across them (tff_kd.program.runtime). A worker
  # unreachable for worker_timeout_s seconds stops the run with an error
  # naming it; the same command resumes once it is back.
  c.runtime = ml_collections.ConfigDict(dict(
      workers='',
      worker_timeout_s=60.0,
  ))

  c.eval_every = 1
  c.eval_batch_size = 1000
  c.checkpoint_every = 1
  c.keep_checkpoints = 3
  c.export = True
  return c
