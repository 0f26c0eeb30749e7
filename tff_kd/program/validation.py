"""Checks of the shared config sections, and what is read from them.

`validate_config` checks every setting of an experiment config that can be
checked without loading data, against `configs/base.py`, and raises a
`ConfigError` naming the first bad value. The helpers beside it read derived
settings (the client domains, the image shape, the global model prototypes,
the local work) and install the TFF context the runtime section asks for.
"""

from absl import logging
import ml_collections

from tff_kd import data as data_lib
from tff_kd import errors
from tff_kd import models
from tff_kd.federated import client_data as client_data_lib
from tff_kd.methods import common
from tff_kd.methods import registry
from tff_kd.program import context
from tff_kd.program import runtime
from tff_kd.program import sampling
from tff_kd.program import server_stage

PARTITIONS = ('dirichlet', 'iid', 'fedgen', 'domain')


def _check_keys(config: ml_collections.ConfigDict,
                reference: ml_collections.ConfigDict, prefix: str = '') -> None:
  for key, value in config.items():
    if key not in reference:
      raise errors.ConfigError(f"config key '{prefix}{key}' does not exist")
    if isinstance(value, ml_collections.ConfigDict) and isinstance(
        reference[key], ml_collections.ConfigDict):
      _check_keys(value, reference[key], f'{prefix}{key}.')


def set_context(config: ml_collections.ConfigDict) -> None:
  """Installs the TFF context the config's runtime section asks for: TFF's
  local runtime (its test context for secure sums), or remote workers."""
  workers = runtime.parse_workers(config.runtime.workers)
  if workers:
    runtime.set_remote_context(workers,
                               timeout_s=config.runtime.worker_timeout_s)
  else:
    context.set_context_for(
        needs_secure_sum(config),
        concurrent_clients=config.runtime.concurrent_clients,
        intra_op_threads=config.runtime.intra_op_threads)


def needs_secure_sum(config: ml_collections.ConfigDict) -> bool:
  """Whether the method's process uses secure aggregation (as its registry
  entry says: DaFKD's private mode), which only TFF's test context
  simulates (`tff_kd.program.context.set_context_for`)."""
  secure_sum = registry.get_method(config.method).secure_sum
  return secure_sum is not None and secure_sum(config)


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks every setting that can be checked without loading data.

  Args:
    config: An experiment config derived from `configs/base.py`.

  Raises:
    ConfigError: naming the first bad value.
  """
  from configs import base  # pylint: disable=g-import-not-at-top
  _check_keys(config, base.get_config())
  method = registry.get_method(config.method)
  runtime.check_supported(needs_secure_sum(config), config.runtime.workers)
  if (not isinstance(config.runtime.concurrent_clients, int) or
      config.runtime.concurrent_clients < -1):
    raise errors.ConfigError(
        'runtime.concurrent_clients must be an integer >= -1 (0: one per '
        f'core, -1: no limit), got {config.runtime.concurrent_clients!r}')
  if (not isinstance(config.runtime.intra_op_threads, int) or
      config.runtime.intra_op_threads < 0):
    raise errors.ConfigError(
        'runtime.intra_op_threads must be an integer >= 0 (0: TensorFlow\'s '
        f'default), got {config.runtime.intra_op_threads!r}')
  if not config.runtime.worker_timeout_s > 0:
    raise errors.ConfigError('runtime.worker_timeout_s must be > 0, got '
                             f'{config.runtime.worker_timeout_s!r}')
  server_stage.check_device(config.runtime.server_device)
  if (config.runtime.server_device != server_stage.IN_RUNTIME and
      not registry.get_method(config.method).server_step):
    raise errors.ConfigError(
        f'runtime.server_device={config.runtime.server_device!r}: '
        f'{config.method} has no server step to move out of the runtime '
        "(its server applies an optimizer step); use 'runtime'")
  if not config.dataset.domains and (
      config.dataset.name not in data_lib.DATASETS):
    raise errors.ConfigError(
        f"dataset {config.dataset.name!r} is unknown; choose one of "
        f"{', '.join(data_lib.DATASETS)}")
  if config.model.name not in models.MODELS:
    raise errors.ConfigError(
        f"model {config.model.name!r} is unknown; choose one of "
        f"{', '.join(models.MODELS)}")
  if config.partition.kind not in PARTITIONS:
    raise errors.ConfigError(
        f"partition.kind {config.partition.kind!r} is unknown; choose one of "
        f"{', '.join(PARTITIONS)}")
  if config.partition.kind in ('dirichlet', 'fedgen') and not (
      config.partition.alpha > 0):
    raise errors.ConfigError(
        f'partition.alpha must be > 0, got {config.partition.alpha}')
  if config.partition.kind == 'fedgen' and config.partition.per_class < 1:
    raise errors.ConfigError('partition.per_class must be >= 1 for the fedgen '
                             f'recipe, got {config.partition.per_class}')
  _validate_domains(config)
  sampling.check_sampling(config.partition.num_clients,
                          config.clients_per_round)
  try:
    local_work(config).validate()
  except ValueError as e:
    raise errors.ConfigError(str(e)) from None
  for key in ('rounds', 'eval_every', 'checkpoint_every', 'eval_batch_size'):
    if config[key] < 1:
      raise errors.ConfigError(f'{key} must be >= 1, got {config[key]}')
  _validate_server_data(config)
  # The method's own section (`tff_kd.hparams`) and distill.
  registry.method_hparams(config)
  if method.uses_distill:
    distill = common.distill_config(config)
    distill.validate()
    distill.check_labeled(config.server_data.val_size)


def domain_names(config: ml_collections.ConfigDict) -> list[str]:
  """The client domains of `dataset.domains` ([] for single-domain data)."""
  return [d.strip() for d in config.dataset.domains.split(',') if d.strip()]


def image_shape(config: ml_collections.ConfigDict) -> tuple[int, int, int]:
  """`dataset.image_shape` ('H,W,C') as integers."""
  try:
    shape = tuple(int(v) for v in config.dataset.image_shape.split(','))
  except ValueError:
    shape = ()
  if len(shape) != 3 or min(shape) < 1 or shape[2] not in (1, 3):
    raise errors.ConfigError(
        f"dataset.image_shape must be 'H,W,C' with C 1 or 3, got "
        f'{config.dataset.image_shape!r}')
  return shape


def _validate_domains(config: ml_collections.ConfigDict) -> None:
  """Multi-domain data and the `domain` partition (FedD3A's settings)."""
  names = domain_names(config)
  p = config.partition
  if names:
    unknown = [n for n in names if n not in data_lib.DATASETS]
    if unknown:
      raise errors.ConfigError(
          f"dataset.domains entry {unknown[0]!r} is unknown; choose from "
          f"{', '.join(data_lib.DATASETS)}")
    if len(set(names)) != len(names):
      raise errors.ConfigError(
          f'dataset.domains lists a domain twice: {config.dataset.domains!r}')
    image_shape(config)
  if p.kind != 'domain':
    if names:
      raise errors.ConfigError(
          "dataset.domains needs partition.kind='domain' (clients that each "
          'hold one domain)')
    return
  if not names:
    raise errors.ConfigError(
        "partition.kind='domain' needs dataset.domains, e.g. "
        "'mnist,usps,mnist_m'")
  if p.clients_per_domain < 1:
    raise errors.ConfigError(
        f'partition.clients_per_domain must be >= 1, got '
        f'{p.clients_per_domain}')
  if p.clients_per_domain > 1 and not p.alpha > 0:
    raise errors.ConfigError(
        f'partition.alpha must be > 0, got {p.alpha}')
  expected = p.clients_per_domain * len(names)
  if p.num_clients != expected:
    raise errors.ConfigError(
        f'partition.num_clients={p.num_clients} but {len(names)} domains '
        f'with clients_per_domain={p.clients_per_domain} make {expected} '
        'clients')
  if config.server_data.proxy in names:
    logging.warning(
        'server_data.proxy %r is also a client domain: the server pool '
        'overlaps that client\'s data (the paper\'s Figure 5 setting)',
        config.server_data.proxy)


def _validate_server_data(config: ml_collections.ConfigDict) -> None:
  sd = config.server_data
  if sd.proxy and sd.proxy != 'split' and sd.proxy not in data_lib.DATASETS:
    raise errors.ConfigError(
        f"server_data.proxy {sd.proxy!r} is unknown; choose '', 'split' or "
        f"one of {', '.join(data_lib.DATASETS)}")
  if sd.proxy and sd.proxy_size < 1:
    raise errors.ConfigError(
        f'server_data.proxy_size must be >= 1, got {sd.proxy_size}')
  if sd.val_size < 0:
    raise errors.ConfigError(
        f'server_data.val_size must be >= 0, got {sd.val_size}')
  if registry.get_method(config.method).needs_server_data and not sd.proxy:
    raise errors.ConfigError(
        f"{config.method} needs a proxy pool: set server_data.proxy ('split' "
        'or a dataset name) and server_data.proxy_size')


def prototypes(config: ml_collections.ConfigDict) -> list[tuple[str, str]]:
  """(model name, norm) of each global model prototype (the method's
  `models_key`, e.g. `feddf.prototypes`); [model] if it has one model."""
  key = registry.get_method(config.method).models_key
  spec = config[key.split('.')[0]][key.split('.')[1]] if key else ''
  return models.parse_model_list(
      spec, default_norm=config.model.norm, key=key) or [
          (config.model.name, config.model.norm)]


def local_work(config: ml_collections.ConfigDict) -> client_data_lib.LocalWork:
  """The config's local work (unit, amount, batch size)."""
  return client_data_lib.LocalWork(config.local.unit, config.local.amount,
                                   config.local.batch_size)

