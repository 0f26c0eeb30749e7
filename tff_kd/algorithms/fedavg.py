"""FedAvg and FedProx baselines as TFF learning processes.

FedAvg: McMahan et al., "Communication-Efficient Learning of Deep Networks
from Decentralized Data", AISTATS 2017 (Algorithm 1). FedProx: Li et al.,
"Federated Optimization in Heterogeneous Networks", MLSys 2020 (eq. 2, the
proximal local objective). Both only wire the shared pieces of
`tff_kd.federated.learning`; a server optimiser other than SGD(lr=1) gives
the FedOpt family (Reddi et al., ICLR 2021).
"""

import collections
from typing import Optional

import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.algorithms import hparams as hparams_lib
from tff_kd.federated import learning


def build_fedavg_process(
    model_fn: learning.ModelFn,
    element_spec: collections.OrderedDict,
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
    dataset_fn: Optional[learning.DatasetFn] = None,
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
      (see `tff_kd.federated.learning.client_data_type`).

  Returns:
    A `tff.learning.templates.LearningProcess`.
  """
  _check_schedule(learning_rate, learning_rate_decay)
  return learning.build_keras_learning_process(
      model_fn, element_spec, client_optimizer=client_optimizer,
      server_optimizer=server_optimizer, learning_rate=learning_rate,
      learning_rate_decay=learning_rate_decay, dataset_fn=dataset_fn)


def build_fedprox_process(
    model_fn: learning.ModelFn,
    element_spec: collections.OrderedDict,
    *,
    hparams: hparams_lib.FedProxHparams = hparams_lib.FedProxHparams(),
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
    dataset_fn: Optional[learning.DatasetFn] = None,
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
      (see `tff_kd.federated.learning.client_data_type`).

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ConfigError: a bad hyper-parameter.
  """
  hparams.validate()
  _check_schedule(learning_rate, learning_rate_decay)
  return learning.build_keras_learning_process(
      model_fn, element_spec, client_optimizer=client_optimizer,
      server_optimizer=server_optimizer, learning_rate=learning_rate,
      learning_rate_decay=learning_rate_decay,
      proximal_strength=hparams.mu, dataset_fn=dataset_fn)


def _check_schedule(learning_rate: float, decay: float) -> None:
  if not learning_rate > 0:
    raise errors.ConfigError(
        f'client learning rate must be > 0, got {learning_rate}')
  if not 0 < decay <= 1:
    raise errors.ConfigError(
        f'client learning-rate decay must be in (0, 1], got {decay}')
