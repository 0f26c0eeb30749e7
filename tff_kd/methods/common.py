"""What every method's builder receives, and helpers the builders share.

Each method package (`tff_kd/methods/<m>/`) registers one `Method`: its
builder turns the experiment's shared inputs (`ProcessInputs`) and its
config into a `tff.learning.templates.LearningProcess`; its hparams class
is its config section (`tff_kd.hparams`).
"""

import collections
import types
from typing import Any, Callable, Mapping, NamedTuple, Optional

import ml_collections
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd import hparams as hp
from tff_kd import models
from tff_kd.core import distillation
from tff_kd.federated import server_data as server_data_lib
from tff_kd.federated import tff_types


class ProcessInputs(NamedTuple):
  """What every method builder receives besides its config.

  Attributes:
    model_fn: No-arg callable building the Keras classifier (logits).
    element_spec: Batch structure of the client datasets.
    num_classes: Number of labels.
    dataset_fn: Optional key -> dataset function; when given, the process's
      clients receive string keys and build their datasets themselves.
    server_data: The server's proxy pool and validation set, for methods
      with server-side distillation (`Method.needs_server_data`).
    prototype_fns: For heterogeneous methods, one model builder per
      architecture prototype (`model_fn` is the first); empty otherwise.
    classifier_fn: No-arg callable building the same classifier as
      `model_fn` as a `tff_kd.models.Classifier` (model plus its
      shared-variable feature extractor and head), for methods that use the
      feature space (DaFKD, FedD3A, FedGen).
    num_clients: K, the number of clients of the federation (e.g. for
      per-client state kept at the server); 0 if unknown.
  """

  model_fn: tff_types.ModelFn
  element_spec: collections.OrderedDict
  num_classes: int
  dataset_fn: Optional[tff_types.DatasetFn] = None
  server_data: Optional[server_data_lib.ServerData] = None
  prototype_fns: tuple[tff_types.ModelFn, ...] = ()
  classifier_fn: Optional[Callable[[], models.Classifier]] = None
  num_clients: int = 0

Builder = Callable[[ProcessInputs, ml_collections.ConfigDict],
                   tff.learning.templates.LearningProcess]

class Method(NamedTuple):
  """A registered method.

  Attributes:
    name: The `--method` value.
    build: The builder.
    description: One line, with the paper.
    needs_server_data: The builder needs `ProcessInputs.server_data`.
    server_step: The server runs one TF step of its own (distillation,
      generator training) that `runtime.server_device` can move out of the
      TFF runtime (`tff_kd.runtime.server_stage`).
    hparams: The `hp.Hparams` class of the method's config section
      (`hparams.SECTION`); None for a method with no section of its own.
    uses_distill: The server distils with `config.distill`.
    secure_sum: Whether a config makes the process use secure sums (DaFKD's
      private mode), which only TFF's test context simulates
      (`tff_kd.runtime.context.set_context_for`); None: never.
    groups_clients: The method's clients may be grouped several to a TFF
      client (`runtime.clients_per_call`): its aggregation is a weighted
      mean of updates and it keeps no per-client state or stack.
    global_model_per_architecture: The method keeps one global model per
      entry of its section's `client_models` (FedDF's heterogeneous
      prototypes); the program builds one model function and one evaluator
      per entry. False: one global model (FedD3A's `client_models` are
      per-client local models).
    smoke: Dotted-key config overrides (on the small digits setting of the
      tests, e.g. `{'fedgen.hidden': 16}`) that make a fast 2-round run of
      the method: tiny pools, few distillation or generator steps. Every
      contract test (resume, NaN clients, `train_model`, server device, bad
      values) runs each registered method from it.
  """

  name: str
  build: Builder
  description: str
  needs_server_data: bool = False
  server_step: bool = True
  hparams: Optional[type[hp.Hparams]] = None
  uses_distill: bool = False
  secure_sum: Optional[Callable[[ml_collections.ConfigDict], bool]] = None
  groups_clients: bool = False
  global_model_per_architecture: bool = False
  smoke: Mapping[str, Any] = types.MappingProxyType({})

def build_optimizer(
    config: ml_collections.ConfigDict) -> tff.learning.optimizers.Optimizer:
  """A `tff.learning.optimizers` optimizer from `{name, learning_rate, ...}`."""
  if config.name == 'sgd':
    return tff.learning.optimizers.build_sgdm(
        learning_rate=config.learning_rate,
        momentum=config.get('momentum') or None)
  if config.name == 'adam' and config.get('weight_decay'):
    return tff.learning.optimizers.build_adamw(
        learning_rate=config.learning_rate, weight_decay=config.weight_decay)
  if config.name == 'adam':
    return tff.learning.optimizers.build_adam(
        learning_rate=config.learning_rate)
  raise errors.ConfigError(
      f"optimizer {config.name!r} is unknown; choose one of sgd, adam")

def common_kwargs(inputs: ProcessInputs,
                  config: ml_collections.ConfigDict) -> dict:
  """The keyword arguments every builder takes from the shared config."""
  return dict(
      dataset_fn=inputs.dataset_fn,
      client_optimizer=build_optimizer(config.client_optimizer),
      server_optimizer=build_optimizer(config.server_optimizer),
      learning_rate=config.client_optimizer.learning_rate,
      learning_rate_decay=config.client_optimizer.lr_decay)


def clients_per_call(inputs: ProcessInputs,
                     config: ml_collections.ConfigDict) -> int:
  """`runtime.clients_per_call` for keyed clients, else 1 (clients that
  take datasets, e.g. under `tff.learning.programs.train_model`, are one
  TFF client each)."""
  return config.runtime.clients_per_call if inputs.dataset_fn else 1


def grouping_kwargs(inputs: ProcessInputs,
                    config: ml_collections.ConfigDict) -> dict:
  """`clients_per_call` and `fuse_clients` for the builders that group
  clients (FedAvg, FedProx): `runtime.fuse_clients` needs keyed clients
  too, and falls back to one client per call without them, as
  `clients_per_call` does."""
  return dict(clients_per_call=clients_per_call(inputs, config),
              fuse_clients=bool(config.runtime.fuse_clients and
                                inputs.dataset_fn))


def distill_config(config: ml_collections.ConfigDict
                   ) -> distillation.DistillConfig:
  """The validated `config.distill`, seeded by `config.seed`."""
  return distillation.DistillConfig.from_config(config.distill).replace(
      seed=config.seed)
