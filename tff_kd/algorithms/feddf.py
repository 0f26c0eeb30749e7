"""FedDF as a TFF learning process (homogeneous and heterogeneous models).

Lin, Kong, Stich, Jaggi, "Ensemble Distillation for Robust Model Fusion in
Federated Learning", NeurIPS 2020: FedAvg's round, then server-side ensemble
distillation of all received client models (AVGLOGITS, optional
drop-worst) on an unlabeled proxy pool into each architecture prototype's
averaged model. This module only validates and wires the stages of
`tff_kd.federated.feddf` (data flow of one round: see there).

State: `tff.learning.templates.LearningAlgorithmState` whose
`global_model_weights` is a tuple of one `ModelWeights` per prototype (one
element for homogeneous FedDF). `get_model_weights` / `set_model_weights`
must use a single `ModelWeights` (TFF's signature, and what the program's
evaluation and export consume), so they read and write the *first*
prototype's model; read every prototype's model with `prototype_weights`.
"""

import collections
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.algorithms import hparams as hparams_lib
from tff_kd.core import distillation
from tff_kd.core import teachers as teachers_tf
from tff_kd.federated import composer
from tff_kd.federated import feddf as feddf_tff
from tff_kd.federated import learning
from tff_kd.federated import server_data as server_data_lib
from tff_kd.federated import stacking


def build_feddf_process(
    model_fns: Sequence[learning.ModelFn],
    element_spec: collections.OrderedDict,
    *,
    server_data: server_data_lib.ServerData,
    clients_per_round: int,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    distill_optimizer: tff.learning.optimizers.Optimizer,
    distill_config: distillation.DistillConfig,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
    hparams: hparams_lib.FedDFHparams = hparams_lib.FedDFHparams(),
    dataset_fn: Optional[learning.DatasetFn] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds FedDF with one or several architecture prototypes.

  Args:
    model_fns: One no-arg Keras classifier builder per prototype (logits);
      client i trains prototype i % len(model_fns). All must have the same
      input shape and number of classes.
    element_spec: Batch structure of the client datasets.
    server_data: The server's proxy pool (and labeled validation set).
    clients_per_round: M, the most clients per round (teacher slots).
    client_optimizer: Client `tff.learning.optimizers` optimizer.
    server_optimizer: Applied to each prototype's mean delta before
      distillation (`build_sgdm(1.0)`: the plain average, as in FedDF).
    distill_optimizer: Student optimiser (FedDF: Adam, lr 1e-3).
    distill_config: Distillation settings (steps, batch, T, clipping, early
      stopping, cosine decay).
    learning_rate: Client learning rate at round 0 (> 0).
    learning_rate_decay: Client lr multiplier per round, in (0, 1].
    hparams: `config.feddf`: `drop_worst` drops teachers at or below
      random-guess accuracy on the server validation set (needs
      `server_data.val_size > 0`); `prototypes` is what `model_fns` were
      built from.
    dataset_fn: Key -> dataset function (the fast path), or None: clients
      take datasets, and with several prototypes `OrderedDict(client_id,
      data)` (a client's prototype is its id modulo their number).

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ConfigError: bad settings (e.g. zero distillation steps).
    DataError: proxy images whose shape does not match the models.
  """
  model_fns = tuple(model_fns)
  if not model_fns:
    raise errors.ConfigError('feddf needs at least one model prototype')
  if not 0 < learning_rate:
    raise errors.ConfigError(
        f'client learning rate must be > 0, got {learning_rate}')
  if not 0 < learning_rate_decay <= 1:
    raise errors.ConfigError('client learning-rate decay must be in (0, 1], '
                             f'got {learning_rate_decay}')
  if not isinstance(clients_per_round, int) or clients_per_round < 1:
    raise errors.ConfigError(
        f'clients_per_round must be >= 1, got {clients_per_round!r}')
  hparams.validate()
  distill_config.validate()
  distill_config.check_labeled(server_data.val_size)
  if hparams.drop_worst and not server_data.val_size:
    raise errors.ConfigError(
        'feddf.drop_worst needs a labeled server validation set '
        '(server_data.val_size > 0)')
  check_models(model_fns, server_data)

  client_work = feddf_tff.build_prototype_client_work(
      model_fns, element_spec, client_optimizer,
      learning_rate=learning_rate, learning_rate_decay=learning_rate_decay,
      dataset_fn=dataset_fn)
  aggregator, stack_type = stacking.build_client_stack(
      client_work, clients_per_round)
  finalizer = feddf_tff.build_fusion_finalizer(
      model_fns, stack_type, server_optimizer, distill_optimizer,
      server_data, distill_config, drop_worst=hparams.drop_worst)
  weights_type = feddf_tff.prototypes_weights_type(model_fns)
  process = composer.compose_learning_process(
      feddf_tff.build_initial_weights_fn(model_fns),
      tff.learning.templates.build_broadcast_process(weights_type),
      client_work, aggregator, finalizer)
  return composer.first_model_view(process)


def check_models(model_fns: Sequence[learning.ModelFn],
                 server_data: server_data_lib.ServerData,
                 *, what: str = 'feddf prototypes') -> None:
  """Raises unless the models share input shape and classes with the pool.

  Raises:
    ConfigError: models with different input shapes or class counts.
    DataError: pool images whose shape is not the models' input.
  """
  shapes, classes = [], []
  with tf.Graph().as_default():
    for fn in model_fns:
      model = fn()
      shapes.append(tuple(model.input_shape[1:]))
      classes.append(model.output_shape[-1])
  if len(set(shapes)) > 1 or len(set(classes)) > 1:
    raise errors.ConfigError(
        f'{what} must share input shape and classes, got input '
        f'shapes {shapes} and {classes} classes')
  teachers_tf.check_pool_shape(server_data.image_shape, shapes[0])


def prototype_weights(state) -> list[tff.learning.models.ModelWeights]:
  """Every prototype's global `ModelWeights` from a FedDF process state."""
  return [
      tff.learning.models.ModelWeights(
          trainable=list(w.trainable), non_trainable=list(w.non_trainable))
      for w in state.global_model_weights
  ]


def with_prototype_weights(
    state, weights: Sequence[tff.learning.models.ModelWeights]):
  """A state whose prototypes' models are replaced by `weights` (in order).

  `process.set_model_weights` only reaches prototype 0; this rebuilds the
  Python state for all of them.
  """
  current = list(state.global_model_weights)
  if len(weights) != len(current):
    raise errors.ConfigError(
        f'{len(weights)} weights given for {len(current)} prototypes')
  new = tuple(
      tff.learning.models.ModelWeights(
          trainable=[np.asarray(v) for v in w.trainable],
          non_trainable=[np.asarray(v) for v in w.non_trainable])
      for w in weights)
  return tff.learning.templates.LearningAlgorithmState(
      new, state.distributor, state.client_work, state.aggregator,
      state.finalizer)
