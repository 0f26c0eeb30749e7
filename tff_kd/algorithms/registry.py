"""The one registry of methods: feeds `--method`, configs, notebooks, tests.

A method is registered with a builder that turns the experiment's shared
inputs (`ProcessInputs`) and its config into a
`tff.learning.templates.LearningProcess`, and with the class of its config
section's hyper-parameters (`tff_kd.algorithms.hparams`), which the builder
adapters below and `experiment.validate_config` build from the config
(`section_hparams`, `method_hparams`) and validate.
"""

import collections
import functools
from typing import Callable, NamedTuple, Optional

import ml_collections
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd import models
from tff_kd.algorithms import dafkd
from tff_kd.algorithms import fedavg
from tff_kd.algorithms import fedd3a
from tff_kd.algorithms import feddf
from tff_kd.algorithms import fedftg
from tff_kd.algorithms import fedgen
from tff_kd.algorithms import hparams as hparams_lib
from tff_kd.core import distillation
from tff_kd.federated import learning
from tff_kd.federated import server_data as server_data_lib


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

  model_fn: learning.ModelFn
  element_spec: collections.OrderedDict
  num_classes: int
  dataset_fn: Optional[learning.DatasetFn] = None
  server_data: Optional[server_data_lib.ServerData] = None
  prototype_fns: tuple[learning.ModelFn, ...] = ()
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
      TFF runtime (`tff_kd.program.server_stage`).
    hparams: The `hparams_lib.Hparams` class of the method's config section
      (`hparams.SECTION`); None for a method with no section of its own.
    uses_distill: The server distils with `config.distill`.
  """

  name: str
  build: Builder
  description: str
  needs_server_data: bool = False
  server_step: bool = True
  hparams: Optional[type[hparams_lib.Hparams]] = None
  uses_distill: bool = False


def build_optimizer(
    config: ml_collections.ConfigDict) -> tff.learning.optimizers.Optimizer:
  """A `tff.learning.optimizers` optimizer from `{name, learning_rate, ...}`."""
  if config.name == 'sgd':
    return tff.learning.optimizers.build_sgdm(
        learning_rate=config.learning_rate,
        momentum=config.get('momentum') or None)
  if config.name == 'adam':
    return tff.learning.optimizers.build_adam(
        learning_rate=config.learning_rate)
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
      hparams=section_hparams(config, hparams_lib.FedProxHparams),
      **_common(inputs, config))


def distill_config(config: ml_collections.ConfigDict
                   ) -> distillation.DistillConfig:
  """The `DistillConfig` of `config.distill` (seeded by `config.seed`)."""
  d = config.distill
  return distillation.DistillConfig(
      steps=d.steps, batch_size=d.batch_size, temperature=d.temperature,
      clip_norm=d.clip_norm, val_fraction=d.val_fraction,
      eval_every=d.eval_every, patience=d.patience, seed=config.seed,
      cosine_decay=d.cosine_decay, student_training=d.student_training,
      validation=d.validation, accept=d.accept)


def _build_feddf(inputs: ProcessInputs, config: ml_collections.ConfigDict):
  if inputs.server_data is None:
    raise errors.ConfigError(
        'feddf needs a proxy pool: set server_data.proxy (and proxy_size)')
  return feddf.build_feddf_process(
      inputs.prototype_fns or (inputs.model_fn,), inputs.element_spec,
      server_data=inputs.server_data,
      clients_per_round=config.clients_per_round,
      distill_optimizer=tff.learning.optimizers.build_adam(
          learning_rate=config.distill.learning_rate),
      distill_config=distill_config(config),
      hparams=section_hparams(config, hparams_lib.FedDFHparams),
      **_common(inputs, config))


def _build_fedd3a(inputs: ProcessInputs, config: ml_collections.ConfigDict):
  if inputs.server_data is None:
    raise errors.ConfigError(
        'fedd3a needs an unlabeled server pool: set server_data.proxy (a '
        'held-out domain) and server_data.proxy_size')
  if inputs.classifier_fn is None:
    raise errors.ConfigError(
        'fedd3a needs a classifier_fn (the backbone whose features define '
        'the client subspaces)')
  f = section_hparams(config, hparams_lib.FedD3AHparams)
  # Heterogeneous clients (`fedd3a.client_models` non-empty): client k uses
  # entry k % A; the global model stays `model`'s architecture.
  input_shape = tuple(inputs.element_spec['x'].shape[1:])
  client_model_fns = tuple(
      functools.partial(
          lambda **kw: models.build_classifier(**kw).model, name=name,
          input_shape=input_shape, num_classes=inputs.num_classes,
          norm=norm, seed=config.seed)
      for name, norm in models.parse_model_list(
          f.client_models, default_norm=config.model.norm,
          key='fedd3a.client_models'))
  return fedd3a.build_fedd3a_process(
      inputs.classifier_fn, inputs.element_spec,
      server_data=inputs.server_data,
      clients_per_round=config.clients_per_round,
      distill_optimizer=tff.learning.optimizers.build_adam(
          learning_rate=config.distill.learning_rate),
      distill_config=distill_config(config), hparams=f,
      num_clients=inputs.num_clients, client_model_fns=client_model_fns,
      **_common(inputs, config))



def _build_fedgen(inputs: ProcessInputs, config: ml_collections.ConfigDict):
  if inputs.classifier_fn is None:
    raise errors.ConfigError(
        'fedgen needs a classifier_fn (its generator feeds the head)')
  f = section_hparams(config, hparams_lib.FedGenHparams)
  return fedgen.build_fedgen_process(
      inputs.classifier_fn, inputs.element_spec,
      num_classes=inputs.num_classes,
      clients_per_round=config.clients_per_round,
      generator_optimizer=tff.learning.optimizers.build_adam(
          learning_rate=f.generator_learning_rate),
      local_batch_size=config.local.batch_size, hparams=f, seed=config.seed,
      **_common(inputs, config))


def _build_fedftg(inputs: ProcessInputs, config: ml_collections.ConfigDict):
  if inputs.classifier_fn is None:
    raise errors.ConfigError('fedftg needs a classifier_fn')
  f = section_hparams(config, hparams_lib.FedFTGHparams)
  return fedftg.build_fedftg_process(
      inputs.classifier_fn, inputs.element_spec,
      num_classes=inputs.num_classes,
      clients_per_round=config.clients_per_round,
      generator_optimizer=tff.learning.optimizers.build_adam(
          learning_rate=f.generator_learning_rate),
      student_optimizer=tff.learning.optimizers.build_sgdm(
          learning_rate=f.student_learning_rate),
      hparams=f, seed=config.seed, **_common(inputs, config))


def _build_dafkd(inputs: ProcessInputs, config: ml_collections.ConfigDict):
  if inputs.classifier_fn is None:
    raise errors.ConfigError(
        'dafkd needs a classifier_fn (its discriminator shares the '
        "classifier's feature extractor)")
  f = section_hparams(config, hparams_lib.DaFKDHparams)
  opt = config.client_optimizer
  if f.weight_decay:
    # Decoupled weight decay (AdamW); `check_config` asked for Adam.
    joint_optimizer = tff.learning.optimizers.build_adamw(
        learning_rate=opt.learning_rate, weight_decay=f.weight_decay)
  else:
    joint_optimizer = build_optimizer(opt)
  return dafkd.build_dafkd_process(
      inputs.classifier_fn, inputs.element_spec, inputs.dataset_fn,
      num_clients=inputs.num_clients,
      clients_per_round=config.clients_per_round,
      joint_optimizer=joint_optimizer,
      generator_optimizer=tff.learning.optimizers.build_adam(
          learning_rate=f.generator_learning_rate, beta_1=f.generator_beta_1,
          beta_2=f.generator_beta_2),
      distill_optimizer=tff.learning.optimizers.build_adam(
          learning_rate=config.distill.learning_rate),
      distill_config=distill_config(config),
      learning_rate=opt.learning_rate, learning_rate_decay=opt.lr_decay,
      hparams=f, server_data=inputs.server_data, seed=config.seed)


METHODS: dict[str, Method] = {
    m.name: m for m in (
        Method('fedavg', _build_fedavg, 'FedAvg (McMahan et al., 2017)',
               server_step=False),
        Method('fedprox', _build_fedprox, 'FedProx (Li et al., 2020)',
               server_step=False, hparams=hparams_lib.FedProxHparams),
        Method('feddf', _build_feddf,
               'FedDF ensemble distillation (Lin et al., 2020)',
               needs_server_data=True, hparams=hparams_lib.FedDFHparams,
               uses_distill=True),
        Method('fedd3a', _build_fedd3a,
               'FedD3A domain-aware distillation (Su et al., 2023)',
               needs_server_data=True, hparams=hparams_lib.FedD3AHparams,
               uses_distill=True),
        Method('fedgen', _build_fedgen,
               'FedGen data-free feature-generator KD (Zhu et al., 2021)',
               hparams=hparams_lib.FedGenHparams),
        Method('fedftg', _build_fedftg,
               'FedFTG data-free server fine-tuning (Zhang et al., 2022)',
               hparams=hparams_lib.FedFTGHparams),
        Method('dafkd', _build_dafkd,
               'DaFKD domain-aware data-free KD (Wang et al., 2023)',
               hparams=hparams_lib.DaFKDHparams, uses_distill=True),
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


def section_hparams(config: ml_collections.ConfigDict,
                    cls: type[hparams_lib.Hparams]) -> hparams_lib.Hparams:
  """The validated `cls` of `config[cls.SECTION]`.

  Checks the section's keys and values (`Hparams.from_config`) and what the
  rest of the config requires of them (`Hparams.check_config`).

  Raises:
    ConfigError: an unknown key or a bad value, named.
  """
  hparams = cls.from_config(config[cls.SECTION])
  hparams.check_config(config)
  return hparams


def method_hparams(
    config: ml_collections.ConfigDict) -> Optional[hparams_lib.Hparams]:
  """The validated hyper-parameters of `config.method`'s section.

  Returns:
    The method's `hparams_lib.Hparams` (`section_hparams`), or None for a
    method without a section of its own (FedAvg).

  Raises:
    ConfigError: an unknown method, key or a bad value, named.
  """
  cls = get_method(config.method).hparams
  return None if cls is None else section_hparams(config, cls)
