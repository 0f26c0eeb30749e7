"""FedProx as a TFF learning process: FedAvg with a proximal local term.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020
(eq. 2, the proximal local objective mu/2 ||w - w_global||^2). A variant of
FedAvg: it reuses FedAvg's schedule check and the shared Keras process of
`tff_kd.federated.learning` with a proximal strength.
"""

import collections
from typing import Optional

import tensorflow_federated as tff

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
    training: learning.Training,
    dataset_fn: Optional[tff_types.DatasetFn] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds FedProx: FedAvg whose clients add mu/2 ||w - w_global||^2.

  Args:
    model_fn: No-arg callable building the Keras classifier (logits).
    element_spec: Batch structure of the client datasets.
    hparams: `config.fedprox` (mu, the proximal strength).
    training: The client and server optimisers, the client learning-rate
      schedule and how each TFF client call runs its clients, with
      `dataset_fn` (`learning.Training`; with G > 1 clients per call,
      `next` takes [G] vectors of keys, `tff_types.group_keys`).
    dataset_fn: Optional key -> dataset function; clients then receive keys
      (see `tff_kd.federated.tff_types.client_data_type`).

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ConfigError: a bad hyper-parameter.
  """
  schedules.check_schedule(training.learning_rate,
                           training.learning_rate_decay)
  return learning.build_keras_learning_process(
      model_fn, element_spec, training=training,
      proximal_strength=hparams.mu, dataset_fn=dataset_fn)


def build_from_settings(
    inputs: common.ProcessInputs, settings: common.Settings
) -> tff.learning.templates.LearningProcess:
  """The registry's builder: fedprox from the run's validated settings."""
  return build_fedprox_process(
      inputs.model_fn, inputs.element_spec,
      hparams=settings.hparams, training=common.training(settings, inputs),
      dataset_fn=inputs.dataset_fn)


METHOD = common.Method(
    'fedprox', build_from_settings, 'FedProx (Li et al., 2020)',
    server_step=False, groups_clients=True, fuses_clients=True,
    hparams=hparams_lib.FedProxHparams, smoke={})
