"""What every method's builder receives, and helpers the builders share.

Each method package (`tff_kd/methods/<m>/`) registers one `Method`: its
builder turns the experiment's shared inputs (`ProcessInputs`) and the
run's validated settings into a `tff.learning.templates.LearningProcess`;
its hparams class is its config section (`tff_kd.hparams`).
"""

import collections
import types
from typing import Any, Callable, Mapping, NamedTuple, Optional

import tensorflow_federated as tff

from tff_kd import errors
from tff_kd import hparams as hp
from tff_kd import models
from tff_kd.federated import execution
from tff_kd.federated import learning
from tff_kd.federated import server_data as server_data_lib
from tff_kd.federated import tff_types


class ProcessInputs(NamedTuple):
  """What every method builder receives besides the run's settings.

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
    client_execution: How each TFF client call runs its clients
      (`tff_kd.federated.execution`): the program sets it from
      `runtime.clients_per_call` and `runtime.client_execution` for keyed
      clients of methods that group clients (`Method.groups_clients`), and
      the builders of those methods hand it to their client work.
  """

  model_fn: tff_types.ModelFn
  element_spec: collections.OrderedDict
  num_classes: int
  dataset_fn: Optional[tff_types.DatasetFn] = None
  server_data: Optional[server_data_lib.ServerData] = None
  prototype_fns: tuple[tff_types.ModelFn, ...] = ()
  classifier_fn: Optional[Callable[[], models.Classifier]] = None
  num_clients: int = 0
  client_execution: execution.ClientExecution = execution.ONE_BY_ONE

# A run's validated settings, `tff_kd.program.settings.Settings` (the
# program layer's type; methods read its sections, never a config).
Settings = Any
Builder = Callable[[ProcessInputs, Settings],
                   tff.learning.templates.LearningProcess]

class Method(NamedTuple):
  """A registered method.

  Attributes:
    name: The `--method` value.
    build: The builder: `(ProcessInputs, Settings) -> LearningProcess`,
      reading the run's validated settings (`settings.hparams` is the
      method's own section).
    description: One line, with the paper.
    needs_server_data: The builder needs `ProcessInputs.server_data`.
    server_step: The server runs one TF step of its own (distillation,
      generator training) that `runtime.server_device` can move out of the
      TFF runtime (`tff_kd.runtime.server_stage`).
    hparams: The `hp.Hparams` class of the method's config section
      (`hparams.SECTION`); None for a method with no section of its own.
    uses_distill: The server distils with `config.distill`.
    distill_keys: The `distill` keys the method reads, where it reads only
      some (FedFTG: its student steps are its own); empty: all of them. A
      run folder resumes if these match; a key the method does not read
      neither blocks a resume nor changes its run.
    distill_defaults: The method's own defaults of `distill` keys (its
      recipe), in force where the config leaves the key unset (None): a
      config's explicit value applies to whichever method runs.
    secure_sum: Whether the method's section (its validated hparams) makes
      the process use secure sums (DaFKD's private mode), which only TFF's
      test context simulates (`tff_kd.runtime.context.set_context_for`);
      None: never.
    groups_clients: The method's clients may be grouped several to a TFF
      client (`ProcessInputs.client_execution`): its aggregation is a
      weighted mean of updates, or a stack of them that takes a call's
      clients as rows (`tff_kd.core.stacking.GroupRows`), and it keeps no
      per-client state.
    fuses_clients: The grouped clients may also run fused (in lockstep,
      `tff_kd.core.fused`): a client's local training is plain (or
      proximal) local SGD, which `fused.train_fused` runs.
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
  distill_keys: tuple[str, ...] = ()
  distill_defaults: Mapping[str, Any] = types.MappingProxyType({})
  secure_sum: Optional[Callable[[Any], bool]] = None
  groups_clients: bool = False
  fuses_clients: bool = False
  global_model_per_architecture: bool = False
  smoke: Mapping[str, Any] = types.MappingProxyType({})

def build_optimizer(optimizer: Any) -> tff.learning.optimizers.Optimizer:
  """A `tff.learning.optimizers` optimizer from an optimiser section.

  Args:
    optimizer: `settings.client_optimizer` or `settings.server_optimizer`:
      `name`, `learning_rate`, and where the section has them `momentum`
      (SGD) and `weight_decay` (Adam becomes AdamW).
  """
  name, learning_rate = optimizer.name, optimizer.learning_rate
  momentum = getattr(optimizer, 'momentum', 0.0)
  weight_decay = getattr(optimizer, 'weight_decay', 0.0)
  if name == 'sgd':
    return tff.learning.optimizers.build_sgdm(
        learning_rate=learning_rate, momentum=momentum or None)
  if name == 'adam' and weight_decay:
    return tff.learning.optimizers.build_adamw(
        learning_rate=learning_rate, weight_decay=weight_decay)
  if name == 'adam':
    return tff.learning.optimizers.build_adam(learning_rate=learning_rate)
  raise errors.ConfigError(
      f"optimizer {name!r} is unknown; choose one of sgd, adam")

def training(settings: Settings,
             inputs: ProcessInputs) -> learning.Training:
  """The global model's FedAvg backbone (`learning.Training`) of a run.

  Args:
    settings: The run's validated settings: its `client_optimizer` (also
      the client learning rate and its per-round `lr_decay`) and
      `server_optimizer` sections.
    inputs: The builder's inputs (their `client_execution`).
  """
  return learning.Training(
      client_optimizer=build_optimizer(settings.client_optimizer),
      server_optimizer=build_optimizer(settings.server_optimizer),
      learning_rate=settings.client_optimizer.learning_rate,
      learning_rate_decay=settings.client_optimizer.lr_decay,
      client_execution=inputs.client_execution)
