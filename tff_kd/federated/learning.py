"""FedAvg-style learning processes of Keras classifiers, composed from blocks.

One round of the composed process (`build_keras_learning_process`):

1. distributor: broadcast the server `ModelWeights` to the sampled clients;
2. client work (`build_client_work`): each client runs
   `tff_kd.core.local_training.train_locally` with this round's learning rate
   `lr * decay**round`, and returns the trainable delta and its final
   BatchNorm statistics, weighted by its number of examples;
3. aggregator: example-weighted mean of those updates;
4. finalizer (`build_weights_finalizer`): a `tff.learning.optimizers` server
   optimiser applies the mean delta (server lr 1 and plain SGD is FedAvg);
   the non-trainable statistics are replaced by their client mean.

Every stage is a real TFF computation and no stage chooses an execution
context, so the same process runs under the local C++ context, a test context
or a remote/multi-worker one. Measurements are grouped by stage
(`client_work/...`, `finalizer/...`) and include the bytes each round moves
down to and up from the clients.

The blocks live along TFF's `learning/templates` lines:
`tff_kd.federated.tff_types` (client inputs and type helpers),
`tff_kd.federated.client_works`, `tff_kd.federated.schedules` and
`tff_kd.federated.finalizers`; `tff_kd.federated.composer` composes them.
"""

import collections
from typing import NamedTuple, Optional

import numpy as np
import tensorflow_federated as tff

from tff_kd.core import local_training
from tff_kd.federated import client_works
from tff_kd.federated import composer
from tff_kd.federated import execution
from tff_kd.federated import finalizers
from tff_kd.federated import tff_types


class Training(NamedTuple):
  """The global model's FedAvg backbone every method shares.

  How clients train the global model and how the server applies their mean
  update; every method's builder takes one (`tff_kd.methods.common.training`
  builds it from a run's settings).

  Attributes:
    client_optimizer: Client `tff.learning.optimizers` optimizer.
    server_optimizer: Applies the clients' mean delta at the server
      (`build_sgdm(1.0)`: the plain average, FedAvg).
    learning_rate: Client learning rate at round 0 (> 0).
    learning_rate_decay: Client lr multiplier per round, in (0, 1]: round r
      trains with `learning_rate * learning_rate_decay**r`.
    client_execution: How each TFF client call runs its clients
      (`tff_kd.federated.execution`: one, or G in turn or fused, with keyed
      clients); a method whose clients cannot be grouped ignores it.
  """

  client_optimizer: tff.learning.optimizers.Optimizer
  server_optimizer: tff.learning.optimizers.Optimizer
  learning_rate: float
  learning_rate_decay: float = 1.0
  client_execution: execution.ClientExecution = execution.ONE_BY_ONE


def build_initial_weights_fn(model_fn: tff_types.ModelFn) -> tff.Computation:
  """A no-arg TFF computation: a freshly initialised model's weights."""

  @tff.tensorflow.computation
  def initial_weights():
    return local_training.model_weights(model_fn())

  return initial_weights


def build_keras_learning_process(
    model_fn: tff_types.ModelFn,
    element_spec: collections.OrderedDict,
    *,
    training: Training,
    proximal_strength: float = 0.0,
    dataset_fn: Optional[tff_types.DatasetFn] = None,
) -> tff.learning.templates.LearningProcess:
  """Composes broadcast, client work, weighted mean and finalizer.

  Args:
    model_fn: No-arg callable building the Keras classifier (logits).
    element_spec: Batch structure of the client datasets.
    training: The client and server optimisers, the client learning-rate
      schedule and how each TFF client call runs its clients (`Training`).
    proximal_strength: FedProx mu (0 for FedAvg).
    dataset_fn: Optional key -> dataset function; see `tff_types.client_data_type`.

  Returns:
    A `tff.learning.templates.LearningProcess` whose `next` takes
    `(state, {element_spec*}@CLIENTS)`, or `(state, {str}@CLIENTS)` of keys
    when `dataset_fn` is given (`{str[G]}@CLIENTS`, `tff_types.group_keys`, with
    `training.client_execution.clients_per_call` G > 1).
  """
  weights_type = tff_types.weights_type_of(model_fn)
  client_work = client_works.build_client_work(
      model_fn, element_spec, training.client_optimizer,
      learning_rate=training.learning_rate,
      learning_rate_decay=training.learning_rate_decay,
      proximal_strength=proximal_strength, dataset_fn=dataset_fn,
      client_execution=training.client_execution)
  aggregator = tff.aggregators.MeanFactory().create(
      weights_type, tff.TensorType(np.float32))
  return composer.compose_learning_process(
      build_initial_weights_fn(model_fn),
      tff.learning.templates.build_broadcast_process(weights_type),
      client_work,
      aggregator,
      finalizers.build_weights_finalizer(weights_type,
                                        training.server_optimizer))
