"""The experiment's settings as one typed tree, validated once.

Every section of an experiment config is a frozen dataclass of
`tff_kd.hparams.Hparams` with its defaults, field documentation and
checks:

* the shared sections, here: `dataset`, `partition`, `model`, `local`,
  `client_optimizer`, `server_optimizer`, `server_data`, `runtime`, and the
  top-level keys (`RunSettings`: method, seed, rounds, ...);
* `distill`: `tff_kd.core.distill_hparams.DistillConfig`;
* each method's own section: its registry entry's `hparams` class
  (`tff_kd/methods/<m>/hparams.py`).

`default_config()` generates the `ml_collections.ConfigDict` of every key
and default from these classes (`configs/base.py` is this function), and
`from_config(config)` checks a config against the tree and returns the
validated `Settings` before any data is touched: unknown keys, bad values
and impossible combinations of sections each raise one `ConfigError`
naming the key. Renamed keys are still read through their classes'
`ALIASES`, and `canonical_dict` applies them to a saved config, so that old
run folders resume.
"""

import copy
import dataclasses
from typing import Any, ClassVar, Mapping, Optional

from absl import logging
import ml_collections

from tff_kd import data as data_lib
from tff_kd import errors
from tff_kd import hparams as hp
from tff_kd import models
from tff_kd.core import distill_hparams
from tff_kd.federated import client_data as client_data_lib
from tff_kd.federated import execution
from tff_kd.methods import common
from tff_kd.methods import registry
from tff_kd.runtime import graph_rewrites
from tff_kd.runtime import workers
from tff_kd.program import sampling
from tff_kd.runtime import server_stage

PARTITIONS = ('dirichlet', 'iid', 'fedgen', 'domain')
OPTIMIZERS = ('sgd', 'adam')


def _text(key: str, value: Any) -> None:
  """Any string."""
  if not isinstance(value, str):
    raise errors.ConfigError(f'{key} must be a string, got {value!r}')


def _number(key: str, value: Any) -> None:
  """Any finite number (checked further where it is used)."""
  if not hp._is_number(value):  # pylint: disable=protected-access
    raise errors.ConfigError(f'{key} must be a finite number, got {value!r}')


def _at_least_minus_one(key: str, value: Any) -> None:
  """An integer >= -1 (-1: no limit)."""
  if not hp._is_int(value) or value < -1:  # pylint: disable=protected-access
    raise errors.ConfigError(
        f'{key} must be an integer >= -1 (0: one per core, -1: no limit), '
        f'got {value!r}')


@dataclasses.dataclass(frozen=True)
class DatasetSettings(hp.Hparams):
  """The data, `config.dataset`.

  Attributes:
    name: A dataset of `tff_kd.data.DATASETS` (ignored when `domains` is
      set), or one of TFF's federated datasets, `tff_kd.data.TFF_DATASETS`
      (e.g. 'tff:emnist'), whose clients are its writers.
    data_dir: The tfds data_dir, also holding decoded caches.
    manual_dir: Raw files for offline tfds builds (MNIST, Fashion-MNIST),
      USPS and MNIST-M.
    train_limit: > 0 keeps only the first N training examples (per domain).
    domains: Multi-domain data (FedD3A's digit domains): a comma list such
      as 'mnist,usps,mnist_m' replaces `name`; every domain is resized and
      channel-matched to `image_shape`. Clients then come from
      `partition.kind='domain'`.
    image_shape: 'H,W,C' (C 1 or 3) of multi-domain data.
    client_data: Set by `tff_kd.program.experiment.prepare`, not by hand:
      the identity ('<name>:<digest of its client ids>') of the federated
      `ClientData` the clients come from (a 'tff:' name or the `client_data`
      argument); '' for a partitioned central dataset. A run folder resumes
      only with the same one.
  """

  SECTION: ClassVar[str] = 'dataset'

  name: str = hp.field('mnist', _text)
  data_dir: str = hp.field('~/tensorflow_datasets', _text)
  manual_dir: str = hp.field('', _text)
  train_limit: int = hp.field(0, hp.non_negative_int)
  domains: str = hp.field('', _text)
  image_shape: str = hp.field('32,32,3', _text)
  client_data: str = hp.field('', _text)

  @property
  def is_federated(self) -> bool:
    """Whether the clients come from a `ClientData`, not a partition."""
    return bool(self.client_data) or self.name in data_lib.TFF_DATASETS

  @property
  def domain_names(self) -> list[str]:
    """The client domains of `domains` ([] for single-domain data)."""
    return [d.strip() for d in self.domains.split(',') if d.strip()]

  @property
  def shape(self) -> tuple[int, int, int]:
    """`image_shape` as integers."""
    try:
      shape = tuple(int(v) for v in self.image_shape.split(','))
    except ValueError:
      shape = ()
    if len(shape) != 3 or min(shape) < 1 or shape[2] not in (1, 3):
      raise errors.ConfigError(
          "dataset.image_shape must be 'H,W,C' with C 1 or 3, got "
          f'{self.image_shape!r}')
    return shape

  def _check_combinations(self) -> None:
    names = self.domain_names
    if self.is_federated:
      if names or self.train_limit:
        raise errors.ConfigError(
            'dataset.domains and dataset.train_limit do not apply to a '
            f'ClientData ({self.client_data or self.name}): its clients are '
            'its own')
      return
    if not names:
      hp.one_of(*data_lib.DATASETS, *data_lib.TFF_DATASETS)(
          'dataset', self.name)
      return
    unknown = [n for n in names if n not in data_lib.DATASETS]
    if unknown:
      raise errors.ConfigError(
          f'dataset.domains entry {unknown[0]!r} is unknown; choose from '
          f"{', '.join(data_lib.DATASETS)}")
    if len(set(names)) != len(names):
      raise errors.ConfigError(
          f'dataset.domains lists a domain twice: {self.domains!r}')
    self.shape  # pylint: disable=pointless-statement


@dataclasses.dataclass(frozen=True)
class PartitionSettings(hp.Hparams):
  """How the training set is split into clients, `config.partition`.

  Attributes:
    kind: 'dirichlet' (Dir(alpha) label skew over all clients) | 'iid' |
      'fedgen' (FedGen's recipe) | 'domain' (clients that each hold one
      domain of `dataset.domains`).
    num_clients: The federation's clients.
    alpha: Dir(alpha) label skew (> 0 where used).
    min_size: Dirichlet: every client gets at least this many examples.
    per_class: The fedgen recipe: training samples taken per class.
    clients_per_domain: 'domain': clients per domain (1 = cross-silo; > 1 =
      cross-device, each domain split with Dir(alpha) label skew).
      num_clients must equal clients_per_domain times the domains.
  """

  SECTION: ClassVar[str] = 'partition'

  kind: str = hp.field('dirichlet', hp.one_of(*PARTITIONS))
  num_clients: int = hp.field(20, hp.positive_int)
  alpha: float = hp.field(0.1, _number)
  min_size: int = hp.field(10, hp.non_negative_int)
  per_class: int = hp.field(0, hp.non_negative_int)
  clients_per_domain: int = hp.field(1, hp.positive_int)

  @property
  def uses_alpha(self) -> bool:
    """Whether the partition draws a Dirichlet label skew."""
    return self.kind in ('dirichlet', 'fedgen') or (
        self.kind == 'domain' and self.clients_per_domain > 1)

  def _check_combinations(self) -> None:
    if self.uses_alpha and not self.alpha > 0:
      raise errors.ConfigError(
          f'partition.alpha must be > 0, got {self.alpha}')
    if self.kind == 'fedgen' and self.per_class < 1:
      raise errors.ConfigError(
          'partition.per_class must be >= 1 for the fedgen recipe, got '
          f'{self.per_class}')

  def check_settings(self, settings: 'Settings') -> None:
    names = settings.dataset.domain_names
    if self.kind != 'domain':
      if names:
        raise errors.ConfigError(
            "dataset.domains needs partition.kind='domain' (clients that "
            'each hold one domain)')
      return
    if not names:
      raise errors.ConfigError(
          "partition.kind='domain' needs dataset.domains, e.g. "
          "'mnist,usps,mnist_m'")
    expected = self.clients_per_domain * len(names)
    if self.num_clients != expected:
      raise errors.ConfigError(
          f'partition.num_clients={self.num_clients} but {len(names)} '
          f'domains with clients_per_domain={self.clients_per_domain} make '
          f'{expected} clients')
    if settings.server_data.proxy in names:
      logging.warning(
          'server_data.proxy %r is also a client domain: the server pool '
          "overlaps that client's data (the paper's Figure 5 setting)",
          settings.server_data.proxy)


@dataclasses.dataclass(frozen=True)
class ModelSettings(hp.Hparams):
  """The global model, `config.model`.

  Attributes:
    name: An architecture of `tff_kd.models.MODELS`,
      `keras:<Application>` for a Keras Applications backbone with a new
      head (e.g. 'keras:ResNet50', 'keras:MobileNetV2'; small inputs are
      resized, grey ones made RGB: `tff_kd.models.classifiers`), or
      `py:<module>:<function>` for your own Keras model, built by that
      function of a module on sys.path or in the current directory
      (docs/own_model.md).
    norm: Its normalisation layers, one of `tff_kd.models.NORMS` (unused
      by Keras Applications and `py:` models, which keep their own).
    weights: Its initial weights: '' (seeded random), 'imagenet' (Keras
      Applications only; downloaded by Keras when online),
      'pretrain:<dataset>[?epochs=N&limit=N]' (the model trained on another
      dataset once, by the first run that needs it, and cached under
      `dataset.data_dir`: `tff_kd.models.pretraining`), or a path to
      Keras weights of the whole classifier (.h5 / .weights.h5, a
      TensorFlow checkpoint prefix) or a Keras SavedModel
      (`tff_kd.models.pretrained`). They are the round-0 weights of the
      global model of every method; heterogeneous clients' models take
      theirs from the method's `client_weights`.
  """

  SECTION: ClassVar[str] = 'model'

  name: str = hp.field('cnn', models.check_model_name)
  norm: str = hp.field('batch', hp.one_of(*models.NORMS))
  weights: str = hp.field('', models.check_weights)

  def _check_combinations(self) -> None:
    models.check_weights('model.weights', self.weights, self.name)

  def check_settings(self, settings: 'Settings') -> None:
    method = settings.method
    if self.weights and method.global_model_per_architecture and (
        settings.hparams.client_models):
      raise errors.ConfigError(
          f'model.weights is set but {method.name}.client_models replaces '
          f'the model by its prototypes: give their weights in '
          f'{method.name}.client_weights')


@dataclasses.dataclass(frozen=True)
class LocalSettings(hp.Hparams):
  """Each client's local work per round, `config.local`.

  Attributes:
    unit: 'steps' | 'epochs'.
    amount: How many of them.
    batch_size: The local batch size.
  """

  SECTION: ClassVar[str] = 'local'

  unit: str = hp.field('steps', hp.one_of(*client_data_lib.LOCAL_UNITS))
  amount: int = hp.field(20, hp.positive_int)
  batch_size: int = hp.field(32, hp.positive_int)

  def local_work(self) -> client_data_lib.LocalWork:
    """The `LocalWork` the client datasets are built for."""
    return client_data_lib.LocalWork(self.unit, self.amount, self.batch_size)


@dataclasses.dataclass(frozen=True)
class ClientOptimizerSettings(hp.Hparams):
  """The clients' optimiser and its schedule, `config.client_optimizer`.

  This is the one check of the client learning-rate schedule: round r
  trains with `learning_rate * lr_decay ** r`.

  Attributes:
    name: 'sgd' | 'adam'.
    learning_rate: Its learning rate in round 0 (> 0, finite).
    momentum: SGD's momentum in [0, 1) (0: none).
    lr_decay: The multiplier per round, in (0, 1].
    weight_decay: Decoupled weight decay (AdamW, Loshchilov & Hutter 2019;
      the DaFKD paper's 1e-3 for every method); needs name=adam. 0: none.
  """

  SECTION: ClassVar[str] = 'client_optimizer'

  name: str = hp.field('sgd', hp.one_of(*OPTIMIZERS))
  learning_rate: float = hp.field(0.01, hp.positive_number)
  momentum: float = hp.field(0.0, hp.unit_fraction)
  lr_decay: float = hp.field(1.0, hp.unit_interval)
  weight_decay: float = hp.field(0.0, hp.non_negative_number)

  def _check_combinations(self) -> None:
    if self.weight_decay and self.name != 'adam':
      raise errors.ConfigError(
          'client_optimizer.weight_decay needs client_optimizer.name=adam '
          f'(AdamW); got weight_decay={self.weight_decay!r} with '
          f'{self.name!r}')


@dataclasses.dataclass(frozen=True)
class ServerOptimizerSettings(hp.Hparams):
  """FedAvg's server optimiser, `config.server_optimizer`.

  Attributes:
    name: 'sgd' | 'adam'.
    learning_rate: Its learning rate (> 0; 1 with SGD is plain averaging).
    momentum: SGD's momentum in [0, 1).
  """

  SECTION: ClassVar[str] = 'server_optimizer'

  name: str = hp.field('sgd', hp.one_of(*OPTIMIZERS))
  learning_rate: float = hp.field(1.0, hp.positive_number)
  momentum: float = hp.field(0.0, hp.unit_fraction)


@dataclasses.dataclass(frozen=True)
class ServerDataSettings(hp.Hparams):
  """Data held by the server (KD methods), `config.server_data`.

  Held-out slices are removed from the training set before it is
  partitioned, whatever the method, so that e.g. FedAvg and FedDF runs with
  the same settings train the same clients.

  Attributes:
    proxy: '' none | 'split' (an unlabeled slice held out of the training
      set) | a dataset name (its training images, resized to the training
      shape; labels are dropped), e.g. 'fashion_mnist' or 'usps' for MNIST.
    proxy_size: Examples in the unlabeled distillation pool.
    val_size: Labeled examples held out of the training set for the
      server: FedDF's drop-worst and the distillation diagnostics.
  """

  SECTION: ClassVar[str] = 'server_data'

  proxy: str = hp.field('', _text)
  proxy_size: int = hp.field(0, hp.non_negative_int)
  val_size: int = hp.field(0, hp.non_negative_int)

  def _check_combinations(self) -> None:
    if self.proxy and self.proxy != 'split' and (
        self.proxy not in data_lib.DATASETS):
      raise errors.ConfigError(
          f"server_data.proxy {self.proxy!r} is unknown; choose '', 'split' "
          f"or one of {', '.join(data_lib.DATASETS)}")
    if self.proxy and self.proxy_size < 1:
      raise errors.ConfigError(
          f'server_data.proxy_size must be >= 1, got {self.proxy_size}')

  def check_settings(self, settings: 'Settings') -> None:
    if settings.method.needs_server_data and (
        not self.proxy):
      raise errors.ConfigError(
          f"{settings.method.name} needs a proxy pool: set server_data.proxy "
          "('split' or a dataset name) and server_data.proxy_size")


@dataclasses.dataclass(frozen=True)
class RuntimeSettings(hp.Hparams):
  """Where rounds run, `config.runtime`.

  Attributes:
    workers: '' for TFF's local C++ runtime in this process (one
      worker_binary child); 'host:port,...' for TFF's remote runtime on
      running worker services (`tff_kd_worker --port=N` on each machine);
      each round's clients are split across them
      (`tff_kd.runtime.workers`).
    worker_timeout_s: A worker unreachable this long stops the run with an
      error naming it; the same command resumes once it is back.
    server_device: Where a KD method's server step (distillation, generator
      training) runs: 'runtime' (inside TFF's runtime, whose PyPI build has
      no CUDA) | 'driver' (this process's TensorFlow places it, a visible
      GPU first) | a device string ('/GPU:0', '/CPU:0'). The driver modes
      give the same rounds but cannot be driven by
      `tff.learning.programs.train_model` (`tff_kd.runtime.server_stage`).
    concurrent_clients: Client computations the local worker runs at a
      time (0: one per usable core; -1: no limit, TFF's default).
    intra_op_threads: Threads inside each TensorFlow op in the local worker
      (0: TensorFlow's default, every core). The defaults are the fastest
      measured for this library's models (studies/speed/results/threads.md);
      remote workers take theirs from `tff_kd_worker`'s flags.
    clients_per_call: Clients each TFF client call trains, in turn (1: one
      per call). More cuts the runtime's per-client cost (a call, a
      broadcast copy and an aggregation step; ~1.2 ms of a round's wall
      time per client here) at the same round up to float round-off:
      FedAvg's K = 100 clients of 2 local steps cost 2.6x K = 10 of 20
      steps with 1, 2.2x with 10 (studies/scale/README.md, "Grouped
      clients"). Keep K / G at least the worker's concurrent calls.
      Every method but DaFKD (its server keeps a discriminator per
      client), and FedDF and FedD3A with one client model: a method that
      stacks its clients' models gets a call's clients as rows of the same
      stack (`tff_kd.core.stacking.GroupRows`).
    client_execution: How each call runs its clients
      (`tff_kd.federated.execution`): 'sequential' (in turn) | 'fused' (in
      lockstep, as one batched computation over their stacked weights,
      `tff_kd.core.fused`): a client's fixed costs (its `tf.data`
      pipeline, its training loop's set-up) are paid once per call, and
      its steps run as one grouped convolution or batched matmul per
      layer. Each client computes what it would from the same batches,
      but draws its batch order from its key statelessly instead of by
      `tf.data`'s shuffle, so a fused run is another draw of the same
      algorithm (studies/scale/README.md, "Fused clients"). The methods
      whose clients train plain (or proximal) local SGD: FedAvg, FedProx,
      FedDF, FedD3A and FedFTG (FedD3A's P and FedFTG's label counts come
      from the batches each client trained on), and FedGen (its generator
      regulariser in lockstep too); keyed client data (the
      `train` binary's; a process whose clients take datasets,
      `build_dataset_process`, trains them one by one, as with
      `clients_per_call`), and functional
      Keras models of Conv2D, Dense, BatchNormalization and
      GroupNormalization layers plus weightless, non-random ones (the
      process build names any other layer). Old name: `fuse_clients`
      (True: 'fused'), read until the next release.
    grappler: Where the worker's TensorFlow graphs are optimised
      (`tff_kd.runtime.graph_rewrites`): 'server' (TFF's way, once when a
      computation is compiled, except the KD methods' server steps, whose
      `tf.function`s the worker optimises when it first runs them, for its
      own devices: e.g. a convolution, its bias and its ReLU fused into
      one kernel) | 'static' (TFF's way for every graph: the worker runs
      every `tf.function` unoptimised) | 'worker' (the worker optimises
      every graph's functions, the clients' training too). 'server'
      halves the teacher-heavy server steps at K = 100 against 'static'
      (studies/speed/README.md, "The server step in TFF's runtime"); its
      fused kernels change float round-off, so its KD rounds are not
      bit-identical to 'static''s (FedAvg's and FedProx's are: they have
      no server step). 'worker' was not faster for every method (FedGen's
      rounds were 0.22 / 0.34 s at K = 10 / 100 under 'static', 0.26 /
      0.41 s with it). Every context compiles with it: the local runtime,
      the test context (secure sums) and remote workers.
  """

  SECTION: ClassVar[str] = 'runtime'
  ALIASES: ClassVar[Mapping[str, hp.Alias]] = {
      'fuse_clients': hp.Alias(
          'client_execution',
          lambda fused: 'fused' if fused else 'sequential', bool)}

  workers: str = hp.field('', _text)
  worker_timeout_s: float = hp.field(60.0, hp.positive_number)
  server_device: str = hp.field(server_stage.IN_RUNTIME, _text)
  concurrent_clients: int = hp.field(0, _at_least_minus_one)
  intra_op_threads: int = hp.field(1, hp.non_negative_int)
  clients_per_call: int = hp.field(1, hp.positive_int)
  client_execution: str = hp.field('sequential',
                                   hp.one_of(*execution.EXECUTIONS))
  grappler: str = hp.field(graph_rewrites.DEFAULT,
                            hp.one_of(*graph_rewrites.MODES))

  @property
  def worker_addresses(self) -> list[str]:
    """The remote workers' addresses ([] for the local runtime)."""
    return workers.parse_workers(self.workers)

  def _check_combinations(self) -> None:
    self.worker_addresses  # pylint: disable=pointless-statement
    server_stage.check_device(self.server_device)

  def execution_for(self, method: common.Method,
                    keyed: bool) -> execution.ClientExecution:
    """How each TFF client call runs its clients: as set, for a method
    that groups clients and keyed clients (clients that take datasets,
    e.g. under `tff.learning.programs.train_model`, are one per call)."""
    if not (keyed and method.groups_clients):
      return execution.ONE_BY_ONE
    return execution.ClientExecution(self.clients_per_call,
                                     self.client_execution)

  def check_settings(self, settings: 'Settings') -> None:
    method = settings.method
    workers.check_supported(settings.needs_secure_sum, self.workers)
    if self.server_device != server_stage.IN_RUNTIME and (
        not method.server_step):
      raise errors.ConfigError(
          f'runtime.server_device={self.server_device!r}: {method.name} has '
          'no server step to move out of the runtime (its server applies an '
          "optimizer step); use 'runtime'")
    for key, value, default in (
        ('clients_per_call', self.clients_per_call, 1),
        ('client_execution', self.client_execution, 'sequential')):
      if value != default and not method.groups_clients:
        raise errors.ConfigError(
            f'runtime.{key}={value!r}: {method.name} keeps per-client state '
            '(a model or discriminator per client); only '
            + _names(m for m in registry.METHODS.values() if m.groups_clients)
            + f' group clients. Use {default!r}')
    if self.client_execution == 'fused' and not method.fuses_clients:
      raise errors.ConfigError(
          f"runtime.client_execution='fused': {method.name}'s clients train "
          'with a term of their own, which fused clients do not run; only '
          + _names(m for m in registry.METHODS.values() if m.fuses_clients)
          + " fuse clients. Use 'sequential' (clients_per_call > 1 groups "
          'them in turn)')


def _names(methods) -> str:
  names = [m.name for m in methods]
  return ', '.join(names[:-1]) + ' and ' + names[-1]


@dataclasses.dataclass(frozen=True)
class RunSettings(hp.Hparams):
  """The top-level keys of an experiment config.

  Attributes:
    method: A registered method (`tff_kd.methods.registry`).
    seed: Seeds the partition, the models, client sampling and every
      client's shuffle; an interrupted run resumes exactly because these
      depend only on (seed, round).
    rounds: Training rounds.
    clients_per_round: Clients sampled each round.
    eval_every: Rounds between evaluations of the global model (the last
      round is always evaluated).
    eval_batch_size: The evaluation's batch size.
    checkpoint_every: Rounds between checkpoints (the last is always saved).
    keep_checkpoints: Checkpoints kept on disk.
    export: Export the final global model as a SavedModel.
  """

  SECTION: ClassVar[str] = ''

  method: str = hp.field('fedavg', hp.one_of(*registry.METHODS))
  seed: int = hp.field(0, hp.non_negative_int)
  rounds: int = hp.field(30, hp.positive_int)
  clients_per_round: int = hp.field(8, hp.positive_int)
  eval_every: int = hp.field(1, hp.positive_int)
  eval_batch_size: int = hp.field(1000, hp.positive_int)
  checkpoint_every: int = hp.field(1, hp.positive_int)
  keep_checkpoints: int = hp.field(3, hp.positive_int)
  export: bool = hp.field(True, hp.boolean)

  def check_settings(self, settings: 'Settings') -> None:
    if settings.dataset.is_federated:
      return  # The ClientData's clients are counted when it is opened.
    sampling.check_sampling(settings.partition.num_clients,
                            self.clients_per_round)


# The shared sections in the order of the generated config, method sections
# (from the registry) after them.
SHARED_SECTIONS: tuple[type[hp.Hparams], ...] = (
    DatasetSettings, PartitionSettings, ModelSettings, LocalSettings,
    ClientOptimizerSettings, ServerOptimizerSettings, ServerDataSettings,
    distill_hparams.DistillConfig, RuntimeSettings)


def method_sections() -> tuple[type[hp.Hparams], ...]:
  """The registered methods' own sections, in registry order."""
  return tuple(m.hparams for m in registry.METHODS.values()
               if m.hparams is not None)


def all_sections() -> tuple[type[hp.Hparams], ...]:
  """Every section class of the tree (top-level keys excluded)."""
  return SHARED_SECTIONS + method_sections()


def default_config() -> ml_collections.ConfigDict:
  """Every key of an experiment config with its default.

  Generated from the tree's classes: the top-level keys (`RunSettings`),
  the shared sections and every registered method's section, each holding
  its old key names unset (`tff_kd.hparams.config_section`).
  """
  config = hp.config_section(RunSettings)
  for cls in all_sections():
    config[cls.SECTION] = hp.config_section(cls)
  # A distill key some method has its own default for is unset (None): the
  # running method's default, else the section's (`method_distill`).
  # So is one a method's preset sets (`Hparams.VARIANTS`).
  generic = distill_hparams.DistillConfig()
  presets = {k.split('.', 1)[1] for cls in method_sections()
             for k in cls.preset_keys() if k.startswith('distill.')}
  for key in sorted({k for m in registry.METHODS.values()
                     for k in m.distill_defaults} | presets):
    config.distill[key] = ml_collections.FieldReference(
        None, field_type=type(getattr(generic, key)))
  return config


def _with_variant(config: ml_collections.ConfigDict,
                  method: common.Method) -> ml_collections.ConfigDict:
  """`config` (a copy) with the running method's preset filled in: its
  `variant` (or, where unset, `Hparams.default_variant`'s) resolved by
  name, and each key the preset sets put where the config leaves it unset
  (None). A key the config sets keeps its value, with a warning where it
  differs from the preset's. `config` itself where the method has no
  presets.

  Raises:
    ConfigError: a `variant` the method does not have.
  """
  cls = method.hparams
  if cls is None or not cls.VARIANTS:
    return config
  config = copy.deepcopy(config)
  section = config[cls.SECTION]
  name = section.get('variant') or cls.default_variant(config)
  if name not in cls.VARIANTS:
    raise errors.ConfigError(
        f'{cls.key("variant")}={name!r} is not a preset of '
        f"{cls.SECTION}; it has {', '.join(cls.VARIANTS)} "
        '(docs/variants.md)')
  if not section.get('variant'):
    defaults = cls()
    changed = sorted(f.name for f in hp.config_fields(cls)
                     if section.get(f.name) not in (None, getattr(
                         defaults, f.name)))
    if changed:
      logging.warning(
          '%s is unset: the default preset %r runs (docs/variants.md), '
          'with this config\'s %s; name a preset to choose another',
          cls.key('variant'), name, ', '.join(cls.key(k) for k in changed))
  for key, value in cls.VARIANTS[name].keys.items():
    target, leaf = key.split('.')
    current = config[target][leaf]
    if current is None:
      config[target][leaf] = value
    elif current != value:
      logging.warning('%s=%r, set by the config, replaces the %r of '
                      '%s.variant=%r', key, current, value, cls.SECTION,
                      name)
  section.variant = name
  return config


def method_distill(method: common.Method,
                   section: Mapping[str, Any]) -> dict[str, Any]:
  """The `distill` section a method runs with: its keys that are set, over
  the method's own defaults (`Method.distill_defaults`), over the
  section's."""
  generic = distill_hparams.DistillConfig()
  values = {k: v for k, v in dict(section).items() if v is not None}
  return {**{f.name: getattr(generic, f.name)
             for f in hp.config_fields(distill_hparams.DistillConfig)},
          **method.distill_defaults, **values}


def _moved_keys(config: ml_collections.ConfigDict,
                method: common.Method) -> ml_collections.ConfigDict:
  """`config` with the running method's moved keys (an `hp.Alias` to
  another section, e.g. `dafkd.weight_decay` ->
  `client_optimizer.weight_decay`) set at their new place; a copy if any
  is set.

  Raises:
    ConfigError: an old key set against its new one.
  """
  cls = method.hparams
  moved = {} if cls is None else {
      old: a for old, a in cls.ALIASES.items() if a.moved}
  section = config.get(cls.SECTION) if moved else None
  todo = [(old, a) for old, a in moved.items()
          if section is not None and section.get(old) is not None]
  if not todo:
    return config
  config = copy.deepcopy(config)
  for old, alias in todo:
    value = alias.to_new(config[cls.SECTION][old])
    target, key = alias.new.split('.')
    default = getattr(_section_class(target)(), key)
    current = config[target][key]
    if current not in (None, default) and current != value:
      raise errors.ConfigError(
          f'{cls.key(old)}={config[cls.SECTION][old]!r} (moved to '
          f'{alias.new}) contradicts {alias.new}={current!r}; set only '
          f'{alias.new}')
    logging.warning('config key %s moved to %s; read as %s=%r',
                    cls.key(old), alias.new, alias.new, value)
    config[target][key] = value
  return config


def _section_class(name: str) -> type[hp.Hparams]:
  return {cls.SECTION: cls for cls in all_sections()}[name]


@dataclasses.dataclass(frozen=True)
class Settings:
  """A validated experiment config, section by section: what a run uses.

  Built once per run by `from_config` (or `tff_kd.program.experiment`'s
  entry points from a config); the program and the methods' builders read
  it, never the config again. Values derived from several keys are its
  properties.

  Attributes:
    run: The top-level keys.
    dataset: `config.dataset`.
    partition: `config.partition`.
    model: `config.model`.
    local: `config.local`.
    client_optimizer: `config.client_optimizer`.
    server_optimizer: `config.server_optimizer`.
    server_data: `config.server_data`.
    distill: `config.distill`, seeded with the run's seed.
    runtime: `config.runtime`.
    method: The active method's registry entry.
    hparams: The active method's own section; None for a method without
      one (FedAvg).
    architectures: Set by `tff_kd.program.setup.prepare`, not by a config:
      the architecture digest (`tff_kd.models.architecture_digest`) of
      each model of `named_models`, in its order, which the run folder
      records and a resumed run must match (`tff_kd.program.checkpoints`);
      () until the models are built.
  """

  run: RunSettings
  dataset: DatasetSettings
  partition: PartitionSettings
  model: ModelSettings
  local: LocalSettings
  client_optimizer: ClientOptimizerSettings
  server_optimizer: ServerOptimizerSettings
  server_data: ServerDataSettings
  distill: distill_hparams.DistillConfig
  runtime: RuntimeSettings
  method: common.Method
  hparams: Optional[hp.Hparams]
  architectures: tuple[str, ...] = ()

  def replace(self, **changes: Any) -> 'Settings':
    """A copy with whole sections replaced (not validated again)."""
    return dataclasses.replace(self, **changes)

  def sections(self) -> list[hp.Hparams]:
    """The run's sections in config order, the method's own last."""
    out = [self.run, self.dataset, self.partition, self.model, self.local,
           self.client_optimizer, self.server_optimizer, self.server_data,
           self.distill, self.runtime]
    return out + ([self.hparams] if self.hparams is not None else [])

  @property
  def needs_secure_sum(self) -> bool:
    """Whether the method's process uses secure aggregation (as its
    registry entry says: DaFKD's private mode), which only TFF's test
    context simulates (`tff_kd.runtime.context.set_context_for`)."""
    secure_sum = self.method.secure_sum
    return secure_sum is not None and secure_sum(self.hparams)

  @property
  def local_work(self) -> client_data_lib.LocalWork:
    """The clients' local work (unit, amount, batch size)."""
    return self.local.local_work()

  @property
  def _prototype_entries(self) -> str:
    if self.method.global_model_per_architecture:
      return self.hparams.client_models
    return ''

  @property
  def prototypes(self) -> list[tuple[str, str]]:
    """(model name, norm) of each global model prototype: one per entry of
    the method's `client_models` where it keeps a global model per
    architecture (FedDF), else [model]."""
    return models.parse_model_list(
        self._prototype_entries, default_norm=self.model.norm,
        key=f'{self.method.name}.client_models') or [
            (self.model.name, self.model.norm)]

  @property
  def client_models(self) -> list[tuple[str, str]]:
    """(model name, norm) of each entry of the method's `client_models`
    where its clients keep models of their own beside the one global
    model (FedD3A's heterogeneous clients), else []."""
    if self.method.global_model_per_architecture:
      return []
    return models.parse_model_list(
        getattr(self.hparams, 'client_models', ''),
        default_norm=self.model.norm,
        key=f'{self.method.name}.client_models')

  @property
  def named_models(self) -> list[tuple[str, str, str]]:
    """(role, model name, norm) of every classifier the run builds by
    name: each global model ('global model i', `prototypes`), then each
    client model ('client model i', `client_models`)."""
    return ([(f'global model {i}', name, norm)
             for i, (name, norm) in enumerate(self.prototypes)] +
            [(f'client model {i}', name, norm)
             for i, (name, norm) in enumerate(self.client_models)])

  @property
  def prototype_weights(self) -> list[tuple[str, str]]:
    """(initial weights setting, its config key) of each entry of
    `prototypes`: the method's `client_weights` where its `client_models`
    are the global model prototypes (FedDF), else `model.weights` ('' for
    seeded random; `tff_kd.models.pretrained`)."""
    if self._prototype_entries:
      key = f'{self.method.name}.client_weights'
      return [(w, f'{key} entry {i}') for i, w in enumerate(
          models.parse_weights_list(self.hparams.client_weights,
                                    self.hparams.client_models, key=key))]
    return [(self.model.weights, 'model.weights')]

  def to_config(self) -> ml_collections.ConfigDict:
    """The experiment config these settings were validated from, as the
    run folder records it (`config.json`): every key of `default_config()`,
    the run's sections with their values (other methods' sections keep
    their defaults)."""
    config = default_config()
    for section in self.sections():
      node = config[section.SECTION] if section.SECTION else config
      for f in hp.config_fields(type(section)):
        node[f.name] = getattr(section, f.name)
    return config

  def flat_config(self) -> dict[str, Any]:
    """The values in force by dotted key (e.g. 'partition.alpha'), as
    `config.json` records them (`to_config`, through `flat_dict`), of the
    run's own sections only: the top-level keys, the shared sections and
    the active method's section, not the defaults of other methods'."""
    own = {section.SECTION for section in self.sections()}
    return {key: value
            for key, value in flat_dict(self.to_config().to_dict()).items()
            if '.' not in key or key.split('.', 1)[0] in own}


def _check_unknown_sections(config: ml_collections.ConfigDict) -> None:
  known = {f.name for f in hp.config_fields(RunSettings)} | {
      cls.SECTION for cls in all_sections()}
  for key in config.keys():
    if key not in known:
      raise errors.ConfigError(f"config key '{key}' does not exist")


def from_config(config: ml_collections.ConfigDict) -> Settings:
  """Validates a whole experiment config against the tree, once.

  Checks, in order: that every key exists (in every section, the inactive
  methods' included), the top-level keys, the shared sections, the active
  method's section, and the checks across sections, each section's
  (`Hparams.check_settings`). Nothing is loaded or built.

  Args:
    config: An experiment config (`default_config()` with changes).

  Returns:
    The validated `Settings`.

  Raises:
    ConfigError: naming the first bad key and its value.
  """
  _check_unknown_sections(config)
  top = {f.name: config[f.name] for f in hp.config_fields(RunSettings)
         if f.name in config}
  run = RunSettings.from_config(top)
  for cls in method_sections():
    if cls.SECTION in config:
      hp.canonical_section(cls, config[cls.SECTION])  # Unknown keys only.
  method = registry.get_method(run.method)
  config = _moved_keys(config, method)
  named = method.hparams is not None and bool(
      config.get(method.hparams.SECTION, {}).get('variant'))
  config = _with_variant(config, method)
  try:
    return _validated(config, run, method)
  except errors.ConfigError as e:
    note = _preset_note(config, method, named, str(e))
    if not note:
      raise
    raise errors.ConfigError(f'{e} ({note})') from None


def _validated(config: ml_collections.ConfigDict, run: RunSettings,
               method: common.Method) -> Settings:
  """`from_config`'s sections, each validated, then checked together."""
  sections = {cls.SECTION: cls.from_config(config.get(cls.SECTION, {}))
              for cls in SHARED_SECTIONS if cls.SECTION != 'distill'}
  sections['distill'] = distill_hparams.DistillConfig.from_config(
      method_distill(method, config.get('distill', {}))).replace(
          seed=run.seed)
  hparams = (None if method.hparams is None else
             method.hparams.from_config(config.get(method.hparams.SECTION,
                                                   {})))
  settings = Settings(run=run, method=method, hparams=hparams, **sections)
  for section in settings.sections():
    if section is settings.distill and not method.uses_distill:
      continue
    section.check_settings(settings)
  return settings


def _preset_note(config: ml_collections.ConfigDict, method: common.Method,
                 named: bool, message: str) -> str:
  """What the preset in force set, for an error `message` that names one
  of its keys: '' where the message names none (or the method has no
  presets)."""
  cls = method.hparams
  if cls is None or not cls.VARIANTS:
    return ''
  name = config[cls.SECTION].variant
  keys = cls.VARIANTS[name].keys
  if not any(key in message for key in keys):
    return ''
  how = (f'={name!r}' if named else
         f' unset, so the default preset {name!r},')
  return (f"{cls.key('variant')}{how} set "
          + ', '.join(f'{k}={v!r}' for k, v in keys.items())
          + '; another preset or your own values: docs/variants.md')


def parse_value(value: str) -> Any:
  """A `key=value` override's value from text: an int, a float, a bool
  (`true` / `false`, any case) or else the string itself."""
  for cast in (int, float):
    try:
      return cast(value)
    except ValueError:
      pass
  return {'true': True, 'false': False}.get(value.lower(), value)


def with_overrides(config: ml_collections.ConfigDict,
                   overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """`config` with dotted-key `overrides` set in place, e.g.
  `{'rounds': 5, 'dafkd.pool_size': 32}` (what `--config.<key>=<value>`
  does on the command line).

  Returns:
    `config`.

  Raises:
    ConfigError: a key the config does not have.
  """
  for key, value in overrides.items():
    node = config
    *path, leaf = key.split('.')
    for part in path:
      node = node[part] if part in node else None
      if not isinstance(node, ml_collections.ConfigDict):
        raise errors.ConfigError(f"config key '{key}' does not exist")
    if leaf not in node:
      raise errors.ConfigError(f"config key '{key}' does not exist")
    node[leaf] = value
  return config


def canonical_dict(config: Mapping[str, Any]) -> dict[str, Any]:
  """A config as a nested dict, with renamed keys under their new names.

  For comparing a saved run's `config.json` with a new config: an old key
  that is set moves to its new name, and unset old keys (None) are dropped.
  Sections and keys the tree does not know are kept as they are.
  """
  out = {}
  moves = []
  classes = {cls.SECTION: cls for cls in all_sections()}
  for key, value in dict(config).items():
    cls = classes.get(key)
    if cls is not None and isinstance(value, Mapping) and cls.ALIASES:
      value = dict(value)
      for old, alias in cls.ALIASES.items():
        old_value = value.pop(old, None)
        if old_value is None:
          continue
        if not alias.moved:
          value[alias.new] = alias.to_new(old_value)
        elif config.get('method') == key:  # Moved: the run's own section.
          moves.append((alias.new, alias.to_new(old_value)))
    elif isinstance(value, Mapping):
      value = dict(value)
    out[key] = value
  for new, value in moves:
    section, key = new.split('.')
    out.setdefault(section, {})[key] = value
  return out


def flat_dict(tree: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  """A nested dict (a config's `to_dict()`, a saved `config.json`) as one
  dict by dotted key: {'partition': {'alpha': 0.5}} -> {'partition.alpha':
  0.5}."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(flat_dict(value, f'{prefix}{key}.'))
    else:
      out[f'{prefix}{key}'] = value
  return out
