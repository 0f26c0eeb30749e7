"""FedAvg as a TFF learning process.

McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017 (Algorithm 1). It only wires the shared
pieces of `tff_kd.federated.learning`; a server optimiser other than
SGD(lr=1) gives the FedOpt family (Reddi et al., ICLR 2021).
"""

import collections
from typing import Optional

import ml_collections
import tensorflow_federated as tff

from tff_kd.federated import learning

from tff_kd.federated import schedules

from tff_kd.federated import tff_types
from tff_kd.methods import common


def build_fedavg_process(
    model_fn: tff_types.ModelFn,
    element_spec: collections.OrderedDict,
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
    dataset_fn: Optional[tff_types.DatasetFn] = None,
    clients_per_call: int = 1,
    fuse_clients: bool = False,
) -> tff.learning.templates.LearningProcess:
  """Builds FedAvg with example-weighted averaging.

  Args:
    model_fn: No-arg callable building the Keras classifier (logits).
    element_spec: Batch structure of the client datasets.
    client_optimizer: Client `tff.learning.optimizers` optimizer.
    server_optimizer: Server optimizer (`build_sgdm(1.0)` is plain FedAvg).
    learning_rate: Client learning rate at round 0 (> 0).
    learning_rate_decay: Client lr multiplier per round, in (0, 1].
    dataset_fn: Optional key -> dataset function; clients then receive keys
      (see `tff_kd.federated.tff_types.client_data_type`).
    clients_per_call: Clients per TFF client, with `dataset_fn`
      (`tff_kd.federated.client_works.build_client_work`); `next` then takes
      [clients_per_call] vectors of keys (`tff_types.group_keys`).
    fuse_clients: Train each call's clients as one batched computation
      (`runtime.fuse_clients`, `tff_kd.core.fused`).

  Returns:
    A `tff.learning.templates.LearningProcess`.
  """
  schedules.check_schedule(learning_rate, learning_rate_decay)
  return learning.build_keras_learning_process(
      model_fn, element_spec, client_optimizer=client_optimizer,
      server_optimizer=server_optimizer, learning_rate=learning_rate,
      learning_rate_decay=learning_rate_decay, dataset_fn=dataset_fn,
      clients_per_call=clients_per_call, fuse_clients=fuse_clients)


def build_from_config(
    inputs: common.ProcessInputs, config: ml_collections.ConfigDict
) -> tff.learning.templates.LearningProcess:
  """The registry's builder: fedavg from an experiment config."""
  return build_fedavg_process(inputs.model_fn, inputs.element_spec,
                              **common.grouping_kwargs(inputs, config),
                              **common.common_kwargs(inputs, config))


METHOD = common.Method(
    'fedavg', build_from_config, 'FedAvg (McMahan et al., 2017)',
    server_step=False, groups_clients=True, smoke={})
