"""FedD3A as a TFF learning process (homogeneous or heterogeneous models).

Su, Li and Xue, "Domain Discrepancy Aware Distillation for Model Aggregation
in Federated Learning", AAAI 2023: each client uploads, with its model, the
subspace projection P of its data's batch-mean features under the global
backbone (eq. 5); the server weights the client models per unlabeled server
sample by how close the sample's feature lies to each client's subspace
(eq. 6), and distils that weighted ensemble (eq. 7) into the averaged model
(eq. 8). This module validates the settings and wires the stages of
`tff_kd.federated.fedd3a` (data flow of one round: see there; the maths:
`tff_kd.core.fedd3a` and `tff_kd.core.projection`).

Heterogeneous variant (the paper's "Application to Heterogeneous Models",
selected by `client_model_fns`): client k trains its own persistent model of
architecture k % A with CE + KD from the received global model, still
builds P with the received global backbone, and uploads its model and P;
the server distils the domain-weighted ensemble of those models into the
previous global model (there is nothing to average across architectures).

State: `tff.learning.templates.LearningAlgorithmState` with one global
`ModelWeights`, so `get_model_weights` / `set_model_weights` are TFF's and
see the global model (`config.model`'s architecture). The heterogeneous
clients' own models live in the client work's state
(`local_model_rows`).
"""

import collections
from typing import Optional, Sequence

import numpy as np
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.algorithms import feddf as feddf_lib
from tff_kd.algorithms import hparams as hparams_lib
from tff_kd.core import distillation
from tff_kd.core import fedd3a as fedd3a_tf
from tff_kd.federated import composer
from tff_kd.federated import fedd3a as fedd3a_tff
from tff_kd.federated import learning
from tff_kd.federated import server_data as server_data_lib
from tff_kd.federated import stacking


def build_fedd3a_process(
    classifier_fn: fedd3a_tff.ClassifierFn,
    element_spec: collections.OrderedDict,
    *,
    server_data: server_data_lib.ServerData,
    clients_per_round: int,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    distill_optimizer: tff.learning.optimizers.Optimizer,
    distill_config: distillation.DistillConfig,
    learning_rate: float,
    hparams: hparams_lib.FedD3AHparams = hparams_lib.FedD3AHparams(),
    learning_rate_decay: float = 1.0,
    num_clients: int = 0,
    dataset_fn: Optional[learning.DatasetFn] = None,
    client_model_fns: Sequence[learning.ModelFn] = (),
) -> tff.learning.templates.LearningProcess:
  """Builds FedD3A.

  Args:
    classifier_fn: No-arg builder of the global `tff_kd.models.Classifier`
      (logits model plus its shared-variable backbone `features`).
    element_spec: Batch structure of the client datasets.
    server_data: The server's unlabeled pool (another domain).
    clients_per_round: M, the most clients per round (stack rows).
    client_optimizer: Client `tff.learning.optimizers` optimizer.
    server_optimizer: Applies the mean delta before distillation
      (`build_sgdm(1.0)`: the plain average, Algorithm 1 line 7). Unused
      with heterogeneous clients.
    distill_optimizer: Student optimiser.
    distill_config: Distillation settings.
    learning_rate: Client learning rate at round 0 (> 0).
    hparams: `config.fedd3a` (`hparams_lib.FedD3AHparams`: alpha,
      weighting, ensemble, projection_batches, score_backbone; kd_weight
      and kd_temperature for heterogeneous clients, whose models
      `client_models` names and `client_model_fns` builds).
    learning_rate_decay: Client lr multiplier per round, in (0, 1].
    num_clients: K of the federation, for the per-client weight report (0:
      no report); with heterogeneous clients, the rows of the local-model
      store (required, >= the number of architectures).
    dataset_fn: Key -> dataset function (clients then receive keys, and the
      per-client report knows their ids; required with heterogeneous
      clients).
    client_model_fns: Empty: homogeneous FedD3A. Otherwise one Keras model
      builder (logits) per client architecture; client k uses entry
      k % len(client_model_fns). Same input shape and classes as the
      global model. With heterogeneous clients, both of
      `hparams.score_backbone`'s backbones are the previous global model.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ConfigError: a bad hyper-parameter (alpha <= 0, unknown weighting, ...).
    DataError: a server pool whose images do not match the model input.
  """
  hparams.validate()
  distill_config.check_labeled(server_data.val_size)
  if not 0 < learning_rate:
    raise errors.ConfigError(
        f'client learning rate must be > 0, got {learning_rate}')
  if not 0 < learning_rate_decay <= 1:
    raise errors.ConfigError('client learning-rate decay must be in (0, 1], '
                             f'got {learning_rate_decay}')
  if (isinstance(clients_per_round, bool) or
      not isinstance(clients_per_round, int) or clients_per_round < 1):
    raise errors.ConfigError(
        f'clients_per_round must be >= 1, got {clients_per_round!r}')
  if not isinstance(num_clients, int) or num_clients < 0:
    raise errors.ConfigError(f'num_clients must be >= 0, got {num_clients!r}')
  distill_config.validate()
  model_fn = fedd3a_tff.model_fn_of(classifier_fn)
  client_model_fns = tuple(client_model_fns)
  if client_model_fns:
    return _build_hetero(
        classifier_fn, client_model_fns, element_spec,
        server_data=server_data, clients_per_round=clients_per_round,
        client_optimizer=client_optimizer,
        distill_optimizer=distill_optimizer, distill_config=distill_config,
        learning_rate=learning_rate, alpha=float(hparams.alpha),
        weighting=hparams.weighting, ensemble=hparams.ensemble,
        projection_batches=hparams.projection_batches,
        learning_rate_decay=learning_rate_decay, num_clients=num_clients,
        dataset_fn=dataset_fn, kd_weight=float(hparams.kd_weight),
        kd_temperature=float(hparams.kd_temperature))
  _, _, input_shape = fedd3a_tff.classifier_specs(classifier_fn)
  fedd3a_tf.check_pool(server_data.image_shape, input_shape)

  client_work = fedd3a_tff.build_client_work(
      classifier_fn, element_spec, client_optimizer,
      learning_rate=learning_rate, learning_rate_decay=learning_rate_decay,
      alpha=float(hparams.alpha),
      projection_batches=hparams.projection_batches, dataset_fn=dataset_fn)
  aggregator, stack_type = stacking.build_client_stack(
      client_work, clients_per_round)
  finalizer = fedd3a_tff.build_finalizer(
      classifier_fn, stack_type, server_optimizer, distill_optimizer,
      server_data, distill_config, weighting=hparams.weighting,
      ensemble=hparams.ensemble,
      num_clients=num_clients if dataset_fn is not None else 0,
      score_backbone=hparams.score_backbone)
  weights_type = client_work.next.type_signature.parameter[1].member
  return composer.compose_learning_process(
      learning.build_initial_weights_fn(model_fn),
      tff.learning.templates.build_broadcast_process(weights_type),
      client_work, aggregator, finalizer)


def _build_hetero(classifier_fn, client_model_fns, element_spec, *,
                  server_data, clients_per_round, client_optimizer,
                  distill_optimizer, distill_config, learning_rate, alpha,
                  weighting, ensemble, projection_batches,
                  learning_rate_decay, num_clients, dataset_fn, kd_weight,
                  kd_temperature) -> tff.learning.templates.LearningProcess:
  """Heterogeneous FedD3A (arguments as `build_fedd3a_process`'s)."""
  if num_clients < len(client_model_fns):
    raise errors.ConfigError(
        f'heterogeneous fedd3a keeps one local model per client: '
        f'num_clients must be >= the {len(client_model_fns)} client '
        f'architectures, got {num_clients}')
  model_fn = fedd3a_tff.model_fn_of(classifier_fn)
  feddf_lib.check_models((model_fn,) + client_model_fns, server_data,
                         what='fedd3a global and client models')
  client_work = fedd3a_tff.build_hetero_client_work(
      classifier_fn, client_model_fns, element_spec, client_optimizer,
      dataset_fn, num_clients=num_clients, learning_rate=learning_rate,
      alpha=alpha, kd_weight=kd_weight, kd_temperature=kd_temperature,
      learning_rate_decay=learning_rate_decay,
      projection_batches=projection_batches)
  aggregator, stack_type = stacking.build_client_stack(
      client_work, clients_per_round)
  finalizer = fedd3a_tff.build_hetero_finalizer(
      classifier_fn, client_model_fns, stack_type, distill_optimizer,
      server_data, distill_config, weighting=weighting, ensemble=ensemble,
      num_clients=num_clients)
  weights_type = client_work.next.type_signature.parameter[1].member
  return composer.compose_learning_process(
      learning.build_initial_weights_fn(model_fn),
      tff.learning.templates.build_broadcast_process(weights_type),
      client_work, aggregator, finalizer)


def local_model_rows(state, architecture: int) -> list[np.ndarray]:
  """The heterogeneous clients' stored local models of one architecture.

  Returns the store's leaves (trainable, then non-trainable variables of
  the architecture's model), each [R, ...] with row r holding client
  r * A + architecture.
  """
  return [np.asarray(v) for v in state.client_work[1][architecture]]
