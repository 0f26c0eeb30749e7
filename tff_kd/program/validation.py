"""What the program reads from a config, through the settings tree.

`validate_config` is `tff_kd.program.settings.from_config`: every key of an
experiment config is checked against the typed tree before any data is
loaded, and the first bad value raises a `ConfigError` naming it. The
helpers beside it read derived settings (the client domains, the image
shape, the global model prototypes, the local work) and install the TFF
context the runtime section asks for.
"""

import ml_collections

from tff_kd import models
from tff_kd.federated import client_data as client_data_lib
from tff_kd.methods import registry
from tff_kd.runtime import context
from tff_kd.runtime import workers
from tff_kd.program import settings as settings_lib

PARTITIONS = settings_lib.PARTITIONS
needs_secure_sum = settings_lib.needs_secure_sum


def validate_config(
    config: ml_collections.ConfigDict) -> settings_lib.Settings:
  """Checks every setting that can be checked without loading data.

  Args:
    config: An experiment config derived from `configs/base.py`.

  Returns:
    The validated settings tree (`tff_kd.program.settings.from_config`).

  Raises:
    ConfigError: naming the first bad value.
  """
  return settings_lib.from_config(config)


def set_context(config: ml_collections.ConfigDict) -> None:
  """Installs the TFF context the config's runtime section asks for: TFF's
  local runtime (its test context for secure sums), or remote workers."""
  addresses = workers.parse_workers(config.runtime.workers)
  if addresses:
    workers.set_remote_context(addresses,
                               timeout_s=config.runtime.worker_timeout_s)
  else:
    context.set_context_for(
        needs_secure_sum(config),
        concurrent_clients=config.runtime.concurrent_clients,
        intra_op_threads=config.runtime.intra_op_threads)


def domain_names(config: ml_collections.ConfigDict) -> list[str]:
  """The client domains of `dataset.domains` ([] for single-domain data)."""
  return settings_lib.DatasetSettings.from_config(config.dataset).domain_names


def image_shape(config: ml_collections.ConfigDict) -> tuple[int, int, int]:
  """`dataset.image_shape` ('H,W,C') as integers."""
  return settings_lib.DatasetSettings.from_config(config.dataset).shape


def prototypes(config: ml_collections.ConfigDict) -> list[tuple[str, str]]:
  """(model name, norm) of each global model prototype: one per entry of
  the method's `client_models` where it keeps a global model per
  architecture (FedDF), else [model]."""
  method = registry.get_method(config.method)
  spec = ''
  if method.global_model_per_architecture:
    spec = registry.method_hparams(config).client_models
  return models.parse_model_list(
      spec, default_norm=config.model.norm,
      key=f'{method.name}.client_models') or [
          (config.model.name, config.model.norm)]


def prototype_weights(
    config: ml_collections.ConfigDict) -> list[tuple[str, str]]:
  """(initial weights setting, its config key) of each entry of
  `prototypes(config)`: the method's `client_weights` where its
  `client_models` are the global model prototypes (FedDF), else
  `model.weights` ('' for seeded random; `tff_kd.models.pretrained`)."""
  method = registry.get_method(config.method)
  if method.global_model_per_architecture:
    hparams = registry.method_hparams(config)
    if hparams.client_models:
      key = f'{method.name}.client_weights'
      return [(w, f'{key} entry {i}') for i, w in enumerate(
          models.parse_weights_list(hparams.client_weights,
                                    hparams.client_models, key=key))]
  return [(config.model.get('weights') or '', 'model.weights')]


def local_work(config: ml_collections.ConfigDict) -> client_data_lib.LocalWork:
  """The config's local work (unit, amount, batch size)."""
  return settings_lib.LocalSettings.from_config(config.local).local_work()
