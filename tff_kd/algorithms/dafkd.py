"""DaFKD as a TFF learning process.

Wang, Li, Xu, Wang, Wu, Guo, "DaFKD: Domain-aware Federated Knowledge
Distillation", CVPR 2023: each client trains its classifier jointly with a
domain discriminator (eq. 9; the discriminator shares the classifier's
extractor, Sec. 3.4) against a global generator (eqs. 2-4); the server
averages classifiers (eq. 6) and generators (eq. 4), generates a pseudo pool
and distils the ensemble of client predictions weighted by the
discriminators' correlation factors (eqs. 7-8). Appendix B keeps the
discriminators on the clients (secure sums). This module validates and wires
the stages of `tff_kd.federated.dafkd` (data flow: see there).

State: `tff.learning.templates.LearningAlgorithmState` whose
`global_model_weights` is `(classifier ModelWeights, generator
ModelWeights)`; `get_model_weights` / `set_model_weights` see the classifier
(`composer.first_model_view`). The client work's state holds the round
number and every client's discriminator (`discriminator_store`).

Ablations (Table 3): `shared=False` gives each client a separate
discriminator network; `correlation=False` uniform teacher weights.
"""

import collections
import functools
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.core import dafkd as dafkd_tf
from tff_kd.core import distillation
from tff_kd.core import feddf as feddf_tf
from tff_kd.core import gan
from tff_kd.federated import composer
from tff_kd.federated import dafkd as dafkd_tff
from tff_kd.federated import feddf as feddf_tff
from tff_kd.federated import learning
from tff_kd.federated import server_data as server_data_lib
from tff_kd.models import classifiers
from tff_kd.models import generators

ENSEMBLES = ('probs', 'logits')
POOL_GENERATORS = ('aggregated', 'broadcast')
POOLS = ('generator', 'real')
AGGREGATIONS = ('mean', 'examples')
GENERATORS = ('mlp', 'dcgan')


def build_dafkd_process(
    classifier_fn: Callable[[], classifiers.Classifier],
    element_spec: collections.OrderedDict,
    dataset_fn: Optional[learning.DatasetFn],
    *,
    num_clients: int,
    clients_per_round: int,
    joint_optimizer: tff.learning.optimizers.Optimizer,
    generator_optimizer: tff.learning.optimizers.Optimizer,
    distill_optimizer: tff.learning.optimizers.Optimizer,
    distill_config: distillation.DistillConfig,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
    pool_size: int = 1280,
    noise_dim: int = 100,
    generator: str = 'mlp',
    generator_hidden: tuple[int, ...] = (256, 512),
    adv_weight: float = 1.0,
    gp_weight: float = 0.0,
    generator_form: str = 'non_saturating',
    discriminator_mode: str = 'inference',
    gan_steps: int = 0,
    gan_window: str = 'last',
    shared: bool = True,
    correlation: bool = True,
    ensemble: str = 'probs',
    private: bool = False,
    pool_generator: Optional[str] = None,
    aggregation: str = 'mean',
    pool: str = 'generator',
    server_data: Optional[server_data_lib.ServerData] = None,
    holder_share: float = 0.05,
    seed: int = 0,
) -> tff.learning.templates.LearningProcess:
  """Builds DaFKD (Algorithm 1) and its ablations.

  Args:
    classifier_fn: No-arg builder of the seeded `Classifier`.
    element_spec: Batch structure of the client datasets.
    dataset_fn: Key -> dataset (the fast path: keys carry the client id),
      or None: clients take `OrderedDict(client_id=int32, data=<dataset>)`;
      the id finds the client's discriminator.
    num_clients: K; client ids are 0..K-1.
    clients_per_round: M, the most clients per round.
    joint_optimizer: Client optimiser of eq. (9) (paper: lr 1e-3, weight
      decay 1e-3).
    generator_optimizer: Client optimiser of eq. (3).
    distill_optimizer: Server student optimiser (paper: lr 0.01).
    distill_config: Distillation settings (reference: T = 20, 1,600 steps).
    learning_rate: Joint learning rate at round 0 (> 0).
    learning_rate_decay: Its multiplier per round, in (0, 1].
    pool_size: Generated distillation images per round (reference: 1,280).
    noise_dim: Generator noise size (paper: 100).
    generator: 'mlp' (the paper's label and noise embeddings + FC +
      BatchNorm + LeakyReLU, `generators.build_image_generator`) or 'dcgan'
      (the reference code's, `generators.build_dcgan_generator`).
    generator_hidden: The MLP generator's FC widths.
    adv_weight: Weight of eq. (2) inside eq. (9) (paper: 1).
    gp_weight: Gradient-penalty weight (reference code 0.3; paper 0).
    generator_form: 'non_saturating' (-log f(g(z)), what GAN code and
      DaFKD's use) or 'minimax' (eq. 3 as printed; it saturates when the
      discriminator rejects the samples).
    discriminator_mode: BatchNorm mode of the discriminator in training
      (`gan.client_gan_step`): 'inference' (real and generated samples
      scored as the server scores them), 'real_train', 'batch' or
      'batch_update' (the reference code's).
    gan_steps: GAN terms only in `gan_steps` local steps of each round,
      plain cross-entropy steps in the others; 0 = every step (Algorithm 1).
    gan_window: Where those steps are: 'last' (the discriminator head ends
      the round trained on the extractor it is uploaded with) or 'first'
      (the reference code keeps the GAN terms to its first epochs).
    shared: Discriminator on the classifier's extractor (False: ablation).
    correlation: eq. (7) weights (False: uniform, ablation).
    ensemble: 'probs' (eq. 8) or 'logits' (reference code).
    private: Appendix B: discriminators stay on the clients; secure sums.
    pool_generator: 'aggregated' (theta_{t+1}, Algorithm 1 line 11) or
      'broadcast' (theta_t; the only one clients have in private mode).
      Default: 'broadcast' if private, else 'aggregated'.
    aggregation: 'mean' (the paper's 1/K_t, eqs. 4 and 6) or 'examples'
      (FedAvg's n_k / n weighting) of classifiers and generators.
    pool: 'generator' (DaFKD) or 'real': the oracle-pool ablation, in which
      the discriminators train against, and the server distils on, the real
      unlabeled images of `server_data`'s proxy pool instead of generated
      ones (Theorem 1's p_g = p holds by construction; the generator is not
      trained).
    server_data: The server's data: the proxy pool (needed by
      pool='real') and the labeled validation set, which turns on the
      per-round mechanism diagnostics (`federated.dafkd.diagnostic_metrics`)
      and is what `distill_config.validation='labeled'` and
      `accept='no_worse'` use.
    holder_share: A client holds a label when at least this share of its
      examples have it (diagnostics only).
    seed: Seed of the discriminator initialisation and the pools.

  Returns:
    A `tff.learning.templates.LearningProcess` taking `(state, keys)`.

  Raises:
    ConfigError: Bad hyper-parameters (before any TFF computation is built).
    DataError: A classifier that cannot take the generated images.
  """
  if pool_generator is None:
    pool_generator = 'broadcast' if private else 'aggregated'
  _validate(locals())
  distill_config.validate()
  with tf.Graph().as_default():
    clf = classifier_fn()
    input_shape = tuple(clf.model.input_shape[1:])
    num_classes = int(clf.model.output_shape[-1])
  if None in input_shape:
    raise errors.DataError(
        f'dafkd needs a classifier with a fixed input shape, got {input_shape}')

  if generator == 'dcgan':
    generator_fn = functools.partial(
        generators.build_dcgan_generator, noise_dim=noise_dim,
        num_classes=num_classes, image_shape=input_shape, seed=seed + 1)
  else:
    generator_fn = functools.partial(
        generators.build_image_generator, noise_dim=noise_dim,
        num_classes=num_classes, image_shape=input_shape,
        hidden=tuple(generator_hidden), seed=seed + 1)
  with tf.Graph().as_default():
    generator_fn()  # Raises ConfigError for shapes it cannot generate.
  settings = dafkd_tf.GanSettings(noise_dim, num_classes, adv_weight,
                                  gp_weight, generator_form,
                                  discriminator_mode, gan_steps, gan_window)
  real_pool_fn = server_data.read_pool if pool == 'real' else None
  validation_fn = (server_data.read_validation
                   if server_data is not None and server_data.val_size
                   else None)
  if real_pool_fn is not None:
    feddf_tf.check_pool_shape(server_data.image_shape, input_shape)
    pool_size = server_data.pool_size
  spec = dafkd_tff.ModelSpec(classifier_fn, generator_fn, shared, seed + 2,
                             settings)
  private_settings = (dafkd_tff.PrivateSettings(
      pool_size, seed, distill_config.temperature, correlation)
                      if private else None)
  client_work = dafkd_tff.build_client_work(
      spec, element_spec, dataset_fn, joint_optimizer=joint_optimizer,
      generator_optimizer=generator_optimizer, num_clients=num_clients,
      learning_rate=learning_rate, learning_rate_decay=learning_rate_decay,
      private=private_settings, negatives_fn=real_pool_fn, seed=seed)
  update_type = client_work.next.type_signature.result.result.member.update
  if private:
    aggregator = dafkd_tff.build_private_aggregator(update_type,
                                                    clients_per_round)
  else:
    aggregator = feddf_tff.build_stacking_aggregator(update_type,
                                                     clients_per_round)
  aggregate_type = aggregator.next.type_signature.result.result.member
  finalizer = dafkd_tff.build_finalizer(
      spec, aggregate_type, distill_optimizer, distill_config,
      pool_size=pool_size, seed=seed,
      pool_from_broadcast=pool_generator == 'broadcast', ensemble=ensemble,
      correlation=correlation, private=private,
      example_weighted=aggregation == 'examples', real_pool_fn=real_pool_fn,
      validation_fn=validation_fn, holder_share=holder_share)
  weights_type = dafkd_tff.models_type(spec)
  process = composer.compose_learning_process(
      dafkd_tff.build_initial_weights_fn(spec),
      tff.learning.templates.build_broadcast_process(weights_type),
      client_work, aggregator, finalizer)
  return composer.first_model_view(process)


def _validate(a: dict) -> None:
  """Checks every hyper-parameter; raises `ConfigError` naming the first bad."""

  def fail(message):
    raise errors.ConfigError(f'dafkd: {message}')

  def positive_int(name):
    v = a[name]
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
      fail(f'{name} must be an integer >= 1, got {v!r}')

  if a['classifier_fn'] is None:
    fail('needs a classifier builder with a feature extractor '
         '(ProcessInputs.classifier_fn)')
  for name in ('num_clients', 'clients_per_round', 'pool_size', 'noise_dim'):
    positive_int(name)
  if a['clients_per_round'] > a['num_clients']:
    fail(f"clients_per_round={a['clients_per_round']} is more than "
         f"num_clients={a['num_clients']}")
  hidden = tuple(a['generator_hidden'])
  if not hidden or any(not isinstance(h, (int, np.integer)) or h < 1
                       for h in hidden):
    fail(f'generator_hidden must be widths >= 1, got {hidden!r}')
  if not a['learning_rate'] > 0:
    fail(f"learning_rate must be > 0, got {a['learning_rate']!r}")
  if not 0 < a['learning_rate_decay'] <= 1:
    fail('learning_rate_decay must be in (0, 1], got '
         f"{a['learning_rate_decay']!r}")
  if (not isinstance(a['gan_steps'], (int, np.integer)) or
      isinstance(a['gan_steps'], bool) or a['gan_steps'] < 0):
    fail(f"gan_steps must be an integer >= 0 (0: every step), got "
         f"{a['gan_steps']!r}")
  for name in ('adv_weight', 'gp_weight'):
    if not a[name] >= 0:
      fail(f'{name} must be >= 0, got {a[name]!r}')
  if a['generator_form'] not in gan.GENERATOR_FORMS:
    fail(f"generator_form {a['generator_form']!r} is unknown; choose one of "
         f"{', '.join(gan.GENERATOR_FORMS)}")
  if a['discriminator_mode'] not in gan.DISCRIMINATOR_MODES:
    fail(f"discriminator_mode {a['discriminator_mode']!r} is unknown; "
         f"choose one of {', '.join(gan.DISCRIMINATOR_MODES)}")
  for name, choices in (('generator', GENERATORS), ('pool', POOLS),
                        ('aggregation', AGGREGATIONS),
                        ('gan_window', dafkd_tf.GAN_WINDOWS)):
    if a[name] not in choices:
      fail(f'{name} {a[name]!r} is unknown; choose one of '
           f"{', '.join(choices)}")
  server = a['server_data']
  if a['pool'] == 'real':
    if server is None:
      fail("pool='real' (the oracle pool) needs the server's proxy pool: "
           "set server_data.proxy and server_data.proxy_size")
    if a['private']:
      fail("pool='real' is an ablation of the plain (non-private) method")
  a['distill_config'].check_labeled(0 if server is None else server.val_size)
  if not 0 < a['holder_share'] <= 1:
    fail(f"holder_share must be in (0, 1], got {a['holder_share']!r}")
  if a['ensemble'] not in ENSEMBLES:
    fail(f"weights_on {a['ensemble']!r} is unknown; choose one of "
         f"{', '.join(ENSEMBLES)}")
  if a['pool_generator'] not in POOL_GENERATORS:
    fail(f"pool_generator {a['pool_generator']!r} is unknown; choose one of "
         f"{', '.join(POOL_GENERATORS)}")
  if a['private'] and a['ensemble'] != 'probs':
    fail("private mode (appendix B) sums soft predictions: it needs "
         "weights_on='probs'")
  if a['private'] and a['pool_generator'] != 'broadcast':
    fail("private mode draws the pool on the clients, which only have the "
         "broadcast generator: pool_generator must be 'broadcast'")


def discriminator_store(state) -> list[np.ndarray]:
  """Every client's discriminator values ([K, ...] arrays) from a state."""
  return [np.asarray(v) for v in state.client_work[1]]


def generator_weights(state) -> tff.learning.models.ModelWeights:
  """The global generator's `ModelWeights` from a DaFKD process state."""
  w = state.global_model_weights[1]
  return tff.learning.models.ModelWeights(list(w.trainable),
                                          list(w.non_trainable))
