"""FedAvg as a TFF learning process.

McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017 (Algorithm 1). It only wires the shared
pieces of `tff_kd.federated.learning`; a server optimiser other than
SGD(lr=1) gives the FedOpt family (Reddi et al., ICLR 2021).
"""

import collections
from typing import Optional

import tensorflow_federated as tff

from tff_kd.federated import learning
from tff_kd.federated import schedules
from tff_kd.federated import tff_types
from tff_kd.methods import common


def build_fedavg_process(
    model_fn: tff_types.ModelFn,
    element_spec: collections.OrderedDict,
    *,
    training: learning.Training,
    dataset_fn: Optional[tff_types.DatasetFn] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds FedAvg with example-weighted averaging.

  Args:
    model_fn: No-arg callable building the Keras classifier (logits).
    element_spec: Batch structure of the client datasets.
    training: The client and server optimisers (a server
      `build_sgdm(1.0)` is plain FedAvg), the client learning-rate
      schedule and how each TFF client call runs its clients, with
      `dataset_fn` (`learning.Training`; with G > 1 clients per call,
      `next` takes [G] vectors of keys, `tff_types.group_keys`).
    dataset_fn: Optional key -> dataset function; clients then receive keys
      (see `tff_kd.federated.tff_types.client_data_type`).

  Returns:
    A `tff.learning.templates.LearningProcess`.
  """
  schedules.check_schedule(training.learning_rate,
                           training.learning_rate_decay)
  return learning.build_keras_learning_process(
      model_fn, element_spec, training=training, dataset_fn=dataset_fn)


def build_from_settings(
    inputs: common.ProcessInputs, settings: common.Settings
) -> tff.learning.templates.LearningProcess:
  """The registry's builder: fedavg from the run's validated settings."""
  return build_fedavg_process(inputs.model_fn, inputs.element_spec,
                              training=common.training(settings, inputs),
                              dataset_fn=inputs.dataset_fn)


METHOD = common.Method(
    'fedavg', build_from_settings, 'FedAvg (McMahan et al., 2017)',
    server_step=False, groups_clients=True, fuses_clients=True, smoke={})
