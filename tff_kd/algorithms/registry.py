"""The one registry of methods: feeds `--method`, configs, notebooks, tests.

A method is registered with a builder that turns the experiment's shared
inputs (`ProcessInputs`) and its config into a
`tff.learning.templates.LearningProcess`. Builders validate their own
hyper-parameters; the registry only maps names.
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
  """

  name: str
  build: Builder
  description: str
  needs_server_data: bool = False


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
      drop_worst=config.feddf.drop_worst, **_common(inputs, config))


def _build_fedd3a(inputs: ProcessInputs, config: ml_collections.ConfigDict):
  if inputs.server_data is None:
    raise errors.ConfigError(
        'fedd3a needs an unlabeled server pool: set server_data.proxy (a '
        'held-out domain) and server_data.proxy_size')
  if inputs.classifier_fn is None:
    raise errors.ConfigError(
        'fedd3a needs a classifier_fn (the backbone whose features define '
        'the client subspaces)')
  f = config.fedd3a
  # Heterogeneous clients (`fedd3a.client_models` non-empty): client k uses
  # entry k % A; the global model stays `model`'s architecture.
  input_shape = tuple(inputs.element_spec['x'].shape[1:])
  client_model_fns = tuple(
      functools.partial(
          lambda **kw: models.build_classifier(**kw).model, name=name,
          input_shape=input_shape, num_classes=inputs.num_classes,
          norm=norm, seed=config.seed)
      for name, norm in models.parse_model_list(
          f.get('client_models', ''), default_norm=config.model.norm,
          key='fedd3a.client_models'))
  return fedd3a.build_fedd3a_process(
      inputs.classifier_fn, inputs.element_spec,
      server_data=inputs.server_data,
      clients_per_round=config.clients_per_round,
      distill_optimizer=tff.learning.optimizers.build_adam(
          learning_rate=config.distill.learning_rate),
      distill_config=distill_config(config), alpha=f.alpha,
      weighting=f.weighting, ensemble=f.ensemble,
      projection_batches=f.projection_batches,
      num_clients=inputs.num_clients, client_model_fns=client_model_fns,
      kd_weight=f.get('kd_weight', 1.0),
      kd_temperature=f.get('kd_temperature', 1.0),
      score_backbone=f.score_backbone, **_common(inputs, config))



def _build_fedgen(inputs: ProcessInputs, config: ml_collections.ConfigDict):
  if inputs.classifier_fn is None:
    raise errors.ConfigError(
        'fedgen needs a classifier_fn (its generator feeds the head)')
  f = config.fedgen
  return fedgen.build_fedgen_process(
      inputs.classifier_fn, inputs.element_spec,
      num_classes=inputs.num_classes,
      clients_per_round=config.clients_per_round,
      generator_optimizer=tff.learning.optimizers.build_adam(
          learning_rate=f.generator_learning_rate),
      local_batch_size=config.local.batch_size,
      generator_steps=f.generator_steps,
      generator_batch_size=f.generator_batch_size, noise_dim=f.noise_dim,
      hidden=f.hidden, noise=f.noise,
      output_activation=f.output_activation or None,
      teacher_ensemble=f.teacher_ensemble, teacher_weight=f.teacher_weight,
      diversity_weight=f.diversity_weight, local_alpha=f.local_alpha,
      local_beta=f.local_beta, coefficient_decay=f.coefficient_decay,
      local_gen_batch_size=f.local_gen_batch_size,
      start_round=f.start_round, reference_steps=f.reference_steps,
      seed=config.seed, **_common(inputs, config))


def _build_fedftg(inputs: ProcessInputs, config: ml_collections.ConfigDict):
  if inputs.classifier_fn is None:
    raise errors.ConfigError('fedftg needs a classifier_fn')
  f = config.fedftg
  return fedftg.build_fedftg_process(
      inputs.classifier_fn, inputs.element_spec,
      num_classes=inputs.num_classes,
      clients_per_round=config.clients_per_round,
      generator_optimizer=tff.learning.optimizers.build_adam(
          learning_rate=f.generator_learning_rate),
      student_optimizer=tff.learning.optimizers.build_sgdm(
          learning_rate=f.student_learning_rate),
      iterations=f.iterations, student_steps=f.student_steps,
      batch_size=f.batch_size, temperature=f.temperature,
      student_training=f.student_training, noise_dim=f.noise_dim,
      noise=f.noise, transfer_weight=f.transfer_weight,
      diversity_weight=f.diversity_weight, mask=f.mask, ensemble=f.ensemble,
      lr_decay=f.lr_decay, generator_steps=f.generator_steps,
      kl_reduction=f.kl_reduction, seed=config.seed,
      **_common(inputs, config))


def _build_dafkd(inputs: ProcessInputs, config: ml_collections.ConfigDict):
  if inputs.classifier_fn is None:
    raise errors.ConfigError(
        'dafkd needs a classifier_fn (its discriminator shares the '
        "classifier's feature extractor)")
  f = config.dafkd
  opt = config.client_optimizer
  if f.weight_decay:
    # Decoupled weight decay (AdamW): TFF's SGD has none.
    if opt.name != 'adam':
      raise errors.ConfigError(
          'dafkd.weight_decay needs client_optimizer.name=adam (AdamW); '
          f'got {opt.name!r}')
    joint_optimizer = tff.learning.optimizers.build_adamw(
        learning_rate=opt.learning_rate, weight_decay=f.weight_decay)
  else:
    joint_optimizer = build_optimizer(opt)
  try:
    hidden = tuple(int(h) for h in str(f.generator_hidden).split(','))
  except ValueError:
    raise errors.ConfigError(
        'dafkd.generator_hidden must be comma-separated widths, got '
        f'{f.generator_hidden!r}') from None
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
      pool_size=f.pool_size, noise_dim=f.noise_dim, generator=f.generator,
      generator_hidden=hidden, adv_weight=f.adv_weight,
      gp_weight=f.gp_weight, generator_form=f.generator_form,
      discriminator_mode=f.discriminator_mode, gan_steps=f.gan_steps,
      gan_window=f.gan_window,
      shared=not f.no_sharing,
      correlation=not f.no_correlation, ensemble=f.weights_on,
      private=f.private, pool_generator=f.pool_generator or None,
      aggregation=f.aggregation, pool=f.pool, server_data=inputs.server_data,
      holder_share=f.holder_share, seed=config.seed)

METHODS: dict[str, Method] = {
    m.name: m for m in (
        Method('fedavg', _build_fedavg, 'FedAvg (McMahan et al., 2017)'),
        Method('fedprox', _build_fedprox, 'FedProx (Li et al., 2020)'),
        Method('feddf', _build_feddf,
               'FedDF ensemble distillation (Lin et al., 2020)',
               needs_server_data=True),
        Method('fedd3a', _build_fedd3a,
               'FedD3A domain-aware distillation (Su et al., 2023)',
               needs_server_data=True),
        Method('fedgen', _build_fedgen,
               'FedGen data-free feature-generator KD (Zhu et al., 2021)'),
        Method('fedftg', _build_fedftg,
               'FedFTG data-free server fine-tuning (Zhang et al., 2022)'),
        Method('dafkd', _build_dafkd,
               'DaFKD domain-aware data-free KD (Wang et al., 2023)'),
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
