"""The one registry of methods: feeds `--method`, configs, notebooks, tests.

A method is registered with a builder that turns the experiment's shared
inputs (`ProcessInputs`) and its config into a
`tff.learning.templates.LearningProcess`. Builders validate their own
hyper-parameters; the registry only maps names.
"""

import collections
from typing import Callable, NamedTuple, Optional

import ml_collections
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.algorithms import fedavg
from tff_kd.federated import learning


class ProcessInputs(NamedTuple):
  """What every method builder receives besides its config.

  Attributes:
    model_fn: No-arg callable building the Keras classifier (logits).
    element_spec: Batch structure of the client datasets.
    num_classes: Number of labels.
    dataset_fn: Optional key -> dataset function; when given, the process's
      clients receive string keys and build their datasets themselves.
  """

  model_fn: learning.ModelFn
  element_spec: collections.OrderedDict
  num_classes: int
  dataset_fn: Optional[learning.DatasetFn] = None


Builder = Callable[[ProcessInputs, ml_collections.ConfigDict],
                   tff.learning.templates.LearningProcess]


class Method(NamedTuple):
  name: str
  build: Builder
  description: str


def build_optimizer(
    config: ml_collections.ConfigDict) -> tff.learning.optimizers.Optimizer:
  """A `tff.learning.optimizers` optimizer from `{name, learning_rate, ...}`."""
  if config.name == 'sgd':
    return tff.learning.optimizers.build_sgdm(
        learning_rate=config.learning_rate,
        momentum=config.get('momentum') or None)
  if config.name == 'adam':
    return tff.learning.optimizers.build_adam(
        learning_rate=config.learning_rate,
        beta_1=config.get('beta_1', 0.9), beta_2=config.get('beta_2', 0.999))
  raise errors.ConfigError(
      f"optimizer {config.name!r} is unknown; choose one of sgd, adam")


def _common(inputs: ProcessInputs,
            config: ml_collections.ConfigDict) -> dict:
  return dict(
      dataset_fn=inputs.dataset_fn,
      client_optimizer=build_optimizer(config.client_optimizer),
      server_optimizer=build_optimizer(config.server_optimizer),
      learning_rate=config.client_optimizer.learning_rate,
      learning_rate_decay=config.client_optimizer.lr_decay)


def _build_fedavg(inputs: ProcessInputs, config: ml_collections.ConfigDict):
  return fedavg.build_fedavg_process(inputs.model_fn, inputs.element_spec,
                                     **_common(inputs, config))


def _build_fedprox(inputs: ProcessInputs, config: ml_collections.ConfigDict):
  return fedavg.build_fedprox_process(
      inputs.model_fn, inputs.element_spec,
      proximal_strength=config.fedprox.mu, **_common(inputs, config))


METHODS: dict[str, Method] = {
    m.name: m for m in (
        Method('fedavg', _build_fedavg, 'FedAvg (McMahan et al., 2017)'),
        Method('fedprox', _build_fedprox, 'FedProx (Li et al., 2020)'),
    )
}


def get_method(name: str) -> Method:
  """Looks a method up by name.

  Raises:
    ConfigError: naming the unknown method and the registered ones.
  """
  if name not in METHODS:
    raise errors.ConfigError(
        f"method {name!r} is unknown; choose one of {', '.join(METHODS)}")
  return METHODS[name]
