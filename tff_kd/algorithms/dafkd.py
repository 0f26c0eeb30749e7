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

Hyper-parameters: `tff_kd.algorithms.hparams.DaFKDHparams` (`config.dafkd`).
Ablations (Table 3): `no_sharing=True` gives each client a separate
discriminator network; `no_correlation=True` uniform teacher weights.
"""

import collections
import functools
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.algorithms import hparams as hparams_lib
from tff_kd.core import dafkd as dafkd_tf
from tff_kd.core import distillation
from tff_kd.core import teachers as teachers_tf
from tff_kd.federated import composer
from tff_kd.federated import dafkd as dafkd_tff
from tff_kd.federated import learning
from tff_kd.federated import server_data as server_data_lib
from tff_kd.federated import stacking
from tff_kd.models import classifiers
from tff_kd.models import generators


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
    hparams: hparams_lib.DaFKDHparams = hparams_lib.DaFKDHparams(),
    server_data: Optional[server_data_lib.ServerData] = None,
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
    generator_optimizer: Client optimiser of eq. (3) (the registry builds
      Adam from `hparams.generator_learning_rate` and its betas).
    distill_optimizer: Server student optimiser (paper: lr 0.01).
    distill_config: Distillation settings (reference: T = 20, 1,600 steps).
    learning_rate: Joint learning rate at round 0 (> 0).
    learning_rate_decay: Its multiplier per round, in (0, 1].
    hparams: `config.dafkd` (`hparams_lib.DaFKDHparams`): the generator,
      the GAN terms of eqs. (2), (3) and (9), the ablations, private mode,
      the pool and the diagnostics' `holder_share`.
    server_data: The server's data: the proxy pool (needed by
      `hparams.pool='real'`) and the labeled validation set, which turns on the
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
  hparams.validate()
  _validate(locals())
  distill_config.validate()
  h = hparams
  noise_dim, pool_size, private = h.noise_dim, h.pool_size, h.private
  with tf.Graph().as_default():
    clf = classifier_fn()
    input_shape = tuple(clf.model.input_shape[1:])
    num_classes = int(clf.model.output_shape[-1])
  if None in input_shape:
    raise errors.DataError(
        f'dafkd needs a classifier with a fixed input shape, got {input_shape}')

  if h.generator == 'dcgan':
    generator_fn = functools.partial(
        generators.build_dcgan_generator, noise_dim=noise_dim,
        num_classes=num_classes, image_shape=input_shape, seed=seed + 1)
  else:
    generator_fn = functools.partial(
        generators.build_image_generator, noise_dim=noise_dim,
        num_classes=num_classes, image_shape=input_shape,
        hidden=h.hidden_widths, seed=seed + 1)
  with tf.Graph().as_default():
    generator_fn()  # Raises ConfigError for shapes it cannot generate.
  settings = dafkd_tf.GanSettings(noise_dim, num_classes, h.adv_weight,
                                  h.gp_weight, h.generator_form,
                                  h.discriminator_mode, h.gan_steps,
                                  h.gan_window)
  real_pool_fn = server_data.read_pool if h.pool == 'real' else None
  validation_fn = (server_data.read_validation
                   if server_data is not None and server_data.val_size
                   else None)
  if real_pool_fn is not None:
    teachers_tf.check_pool_shape(server_data.image_shape, input_shape)
    pool_size = server_data.pool_size
  spec = dafkd_tff.ModelSpec(classifier_fn, generator_fn, not h.no_sharing,
                             seed + 2, settings)
  private_settings = (dafkd_tff.PrivateSettings(
      pool_size, seed, distill_config.temperature, not h.no_correlation)
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
    aggregator = stacking.build_stacking_aggregator(update_type,
                                                     clients_per_round)
  aggregate_type = aggregator.next.type_signature.result.result.member
  finalizer = dafkd_tff.build_finalizer(
      spec, aggregate_type, distill_optimizer, distill_config,
      pool_size=pool_size, seed=seed,
      pool_from_broadcast=h.resolved_pool_generator == 'broadcast',
      ensemble=h.weights_on, correlation=not h.no_correlation,
      private=private, example_weighted=h.aggregation == 'examples',
      real_pool_fn=real_pool_fn, validation_fn=validation_fn,
      holder_share=h.holder_share)
  weights_type = dafkd_tff.models_type(spec)
  process = composer.compose_learning_process(
      dafkd_tff.build_initial_weights_fn(spec),
      tff.learning.templates.build_broadcast_process(weights_type),
      client_work, aggregator, finalizer)
  return composer.first_model_view(process)


def _validate(a: dict) -> None:
  """Checks the arguments besides `hparams` (validated already); raises
  `ConfigError` naming the first bad one."""

  def fail(message):
    raise errors.ConfigError(f'dafkd: {message}')

  if a['classifier_fn'] is None:
    fail('needs a classifier builder with a feature extractor '
         '(ProcessInputs.classifier_fn)')
  for name in ('num_clients', 'clients_per_round'):
    hparams_lib.positive_int(name, a[name])
  if a['clients_per_round'] > a['num_clients']:
    fail(f"clients_per_round={a['clients_per_round']} is more than "
         f"num_clients={a['num_clients']}")
  if not a['learning_rate'] > 0:
    fail(f"learning_rate must be > 0, got {a['learning_rate']!r}")
  if not 0 < a['learning_rate_decay'] <= 1:
    fail('learning_rate_decay must be in (0, 1], got '
         f"{a['learning_rate_decay']!r}")
  server = a['server_data']
  if a['hparams'].pool == 'real' and server is None:
    fail("pool='real' (the oracle pool) needs the server's proxy pool: "
         "set server_data.proxy and server_data.proxy_size")
  a['distill_config'].check_labeled(0 if server is None else server.val_size)


def discriminator_store(state) -> list[np.ndarray]:
  """Every client's discriminator values ([K, ...] arrays) from a state."""
  return [np.asarray(v) for v in state.client_work[1]]


def generator_weights(state) -> tff.learning.models.ModelWeights:
  """The global generator's `ModelWeights` from a DaFKD process state."""
  w = state.global_model_weights[1]
  return tff.learning.models.ModelWeights(list(w.trainable),
                                          list(w.non_trainable))
