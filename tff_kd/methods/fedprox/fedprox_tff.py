"""FedProx as a TFF learning process: FedAvg with a proximal local term.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020
(eq. 2, the proximal local objective mu/2 ||w - w_global||^2). A variant of
FedAvg: it reuses FedAvg's schedule check and the shared Keras process of
`tff_kd.federated.learning` with a proximal strength.
"""

import collections
from typing import Optional

import ml_collections
import tensorflow_federated as tff

from tff_kd import hparams as hp
from tff_kd.federated import learning
from tff_kd.federated import schedules
from tff_kd.federated import tff_types
from tff_kd.methods import common
from tff_kd.methods.fedprox import hparams as hparams_lib


def build_fedprox_process(
    model_fn: tff_types.ModelFn,
    element_spec: collections.OrderedDict,
    *,
    hparams: hparams_lib.FedProxHparams = hparams_lib.FedProxHparams(),
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
    dataset_fn: Optional[tff_types.DatasetFn] = None,
    clients_per_call: int = 1,
    fuse_clients: bool = False,
) -> tff.learning.templates.LearningProcess:
  """Builds FedProx: FedAvg whose clients add mu/2 ||w - w_global||^2.

  Args:
    model_fn: No-arg callable building the Keras classifier (logits).
    element_spec: Batch structure of the client datasets.
    hparams: `config.fedprox` (mu, the proximal strength).
    client_optimizer: Client `tff.learning.optimizers` optimizer.
    server_optimizer: Server optimizer.
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

  Raises:
    ConfigError: a bad hyper-parameter.
  """
  hparams.validate()
  schedules.check_schedule(learning_rate, learning_rate_decay)
  return learning.build_keras_learning_process(
      model_fn, element_spec, client_optimizer=client_optimizer,
      server_optimizer=server_optimizer, learning_rate=learning_rate,
      learning_rate_decay=learning_rate_decay,
      proximal_strength=hparams.mu, dataset_fn=dataset_fn,
      clients_per_call=clients_per_call, fuse_clients=fuse_clients)


def build_from_config(
    inputs: common.ProcessInputs, config: ml_collections.ConfigDict
) -> tff.learning.templates.LearningProcess:
  """The registry's builder: fedprox from an experiment config."""
  return build_fedprox_process(
      inputs.model_fn, inputs.element_spec,
      hparams=hp.section_hparams(config, hparams_lib.FedProxHparams),
      **common.grouping_kwargs(inputs, config),
      **common.common_kwargs(inputs, config))


METHOD = common.Method(
    'fedprox', build_from_config, 'FedProx (Li et al., 2020)',
    server_step=False, groups_clients=True, hparams=hparams_lib.FedProxHparams, smoke={})
