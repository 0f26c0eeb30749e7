"""Every method's hyper-parameters, written once, with their checks.

One frozen dataclass per config section a method reads (`fedprox`, `feddf`,
`fedd3a`, `fedgen`, `fedftg`, `dafkd`). Its fields are the section's keys,
with the defaults in force: `configs/base.py` builds each section from
`dataclasses.asdict(<Hparams>())`, the registry's adapters build the
dataclass from the section with `from_config`, and the method's builder
takes it. `tff_kd.program.experiment.validate_config` validates the active
method's section through the same class before any data is touched.

Each field carries its checker (`dataclasses.field(metadata=...)`), one of a
small shared set (`positive_int`, `non_negative_number`, `one_of`, ...);
`validate()` runs them, then the class's checks of field combinations, and
raises `tff_kd.errors.ConfigError` naming the key as `<section>.<field>` and
the bad value. Checks that need other sections of the experiment config
(e.g. the server's validation set) are `check_config`'s.

The server distillation settings shared by FedDF, FedD3A and DaFKD are
`tff_kd.core.distillation.DistillConfig` (`config.distill`).
"""

import dataclasses
import math
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence, TypeVar

import ml_collections
import numpy as np
import tensorflow as tf

from tff_kd import errors
from tff_kd import models
from tff_kd.core import dafkd as dafkd_tf
from tff_kd.core import distillation
from tff_kd.core import fedd3a as fedd3a_tf
from tff_kd.core import fedftg as fedftg_tf
from tff_kd.core import fedgen as fedgen_tf
from tff_kd.core import gan
from tff_kd.models import generators

Checker = Callable[[str, Any], None]
_H = TypeVar('_H', bound='Hparams')

# ---------------------------------------------------------------------------
# Checkers: `check(key, value)` raises `ConfigError` naming key and value.


def _fail(key: str, requirement: str, value: Any) -> None:
  raise errors.ConfigError(f'{key} must be {requirement}, got {value!r}')


def _is_int(value: Any) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return (isinstance(value, (int, float, np.integer, np.floating)) and
          not isinstance(value, bool) and math.isfinite(value))


def positive_int(key: str, value: Any) -> None:
  """An integer >= 1 (numpy integers too; not a bool)."""
  if not _is_int(value) or value < 1:
    _fail(key, 'an integer >= 1', value)


def non_negative_int(key: str, value: Any) -> None:
  """An integer >= 0 (numpy integers too; not a bool)."""
  if not _is_int(value) or value < 0:
    _fail(key, 'an integer >= 0', value)


def positive_number(key: str, value: Any) -> None:
  """A finite number > 0 (Python or numpy; not a bool)."""
  if not _is_number(value) or not value > 0:
    _fail(key, 'a finite number > 0', value)


def non_negative_number(key: str, value: Any) -> None:
  """A finite number >= 0 (Python or numpy; not a bool)."""
  if not _is_number(value) or value < 0:
    _fail(key, 'a finite number >= 0', value)


def unit_interval(key: str, value: Any) -> None:
  """A number in (0, 1] (a decay factor or a share)."""
  if not _is_number(value) or not 0 < value <= 1:
    _fail(key, 'in (0, 1]', value)


def unit_fraction(key: str, value: Any) -> None:
  """A number in [0, 1) (e.g. Adam's betas)."""
  if not _is_number(value) or not 0 <= value < 1:
    _fail(key, 'in [0, 1)', value)


def boolean(key: str, value: Any) -> None:
  """True or False."""
  if not isinstance(value, (bool, np.bool_)):
    _fail(key, 'a bool', value)


def one_of(*choices: str) -> Checker:
  """A checker accepting exactly `choices`."""

  def check(key: str, value: Any) -> None:
    if value not in choices:
      raise errors.ConfigError(
          f'{key} {value!r} is unknown; choose one of '
          f"{', '.join(repr(c) if not c else c for c in choices)}")

  return check


def model_list(key: str, value: Any) -> None:
  """'' or a comma list `name[:norm]` of `tff_kd.models` architectures."""
  if not isinstance(value, str):
    _fail(key, "a comma list such as 'cnn,resnet11'", value)
  models.parse_model_list(value, default_norm=models.NORMS[0], key=key)


def widths(key: str, value: Any) -> None:
  """A comma list of layer widths >= 1, e.g. '256,512'."""
  if parse_widths(value) is None:
    _fail(key, "comma-separated widths >= 1 such as '256,512'", value)


def activation(key: str, value: Any) -> None:
  """'' (linear) or the name of a Keras activation."""
  if not isinstance(value, str):
    _fail(key, "'' or a Keras activation name", value)
  if value:
    try:
      tf.keras.activations.get(value)
    except ValueError:
      _fail(key, "'' or a Keras activation name such as 'relu'", value)


def parse_widths(value: Any) -> Optional[tuple[int, ...]]:
  """The widths of a comma list such as '256,512'; None if it is not one."""
  try:
    parsed = tuple(int(w) for w in str(value).split(','))
  except ValueError:
    return None
  return parsed if all(w >= 1 for w in parsed) else None


def _field(default: Any, check: Checker) -> Any:
  return dataclasses.field(default=default, metadata={'check': check})


# ---------------------------------------------------------------------------
# The base class.


class Hparams:
  """Base of the per-method frozen dataclasses.

  Subclasses set `SECTION` (their config section) and declare every field
  with `_field(default, checker)`.
  """

  SECTION: ClassVar[str] = ''

  def key(self, name: str) -> str:
    """The dotted config key of field `name`, e.g. 'fedgen.noise'."""
    return f'{self.SECTION}.{name}'

  def validate(self) -> None:
    """Raises `errors.ConfigError` naming the first bad key and its value."""
    for f in dataclasses.fields(self):  # pytype: disable=wrong-arg-types
      f.metadata['check'](self.key(f.name), getattr(self, f.name))
    self._check_combinations()

  def _check_combinations(self) -> None:
    """Checks of several fields together (each field is valid already)."""

  def check_config(self, config: ml_collections.ConfigDict) -> None:
    """Raises `errors.ConfigError` for a field the rest of `config` forbids.

    Args:
      config: The experiment config (`configs/base.py`'s keys).
    """
    del config  # Most methods' settings depend on no other section.

  @classmethod
  def from_config(cls: type[_H], section: Mapping[str, Any]) -> _H:
    """The validated hyper-parameters of a config section.

    Args:
      section: The method's `ml_collections.ConfigDict` section (or a
        mapping); keys it lacks take their defaults.

    Returns:
      An instance of `cls`.

    Raises:
      ConfigError: an unknown key, or a bad value (`validate`).
    """
    if isinstance(section, ml_collections.ConfigDict):
      section = section.to_dict()
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(section) - set(names))
    if unknown:
      raise errors.ConfigError(
          f"config key '{cls.SECTION}.{unknown[0]}' does not exist; "
          f"{cls.SECTION} has {', '.join(names)}")
    hparams = cls(**section)
    hparams.validate()
    return hparams


def config_section(cls: type) -> ml_collections.ConfigDict:
  """The config section of an `Hparams` class, holding its defaults."""
  return ml_collections.ConfigDict(dataclasses.asdict(cls()))


# ---------------------------------------------------------------------------
# The methods.


@dataclasses.dataclass(frozen=True)
class FedProxHparams(Hparams):
  """FedProx (Li et al., MLSys 2020), `config.fedprox`.

  Attributes:
    mu: Proximal strength mu > 0 of the local objective's
      mu/2 ||w - w_global||^2 (eq. 2).
  """

  SECTION: ClassVar[str] = 'fedprox'

  mu: float = _field(0.01, positive_number)


@dataclasses.dataclass(frozen=True)
class FedDFHparams(Hparams):
  """FedDF (Lin et al., NeurIPS 2020), `config.feddf`.

  The distillation itself uses `config.distill`.

  Attributes:
    drop_worst: Drop teachers at or below random-guess accuracy on the
      server's labeled validation set (needs server_data.val_size > 0).
    prototypes: '' = homogeneous (model.name / model.norm). Otherwise a
      comma list of prototypes `name[:norm]`, e.g. 'cnn,resnet11'; client
      i trains prototype i % P.
  """

  SECTION: ClassVar[str] = 'feddf'

  drop_worst: bool = _field(False, boolean)
  prototypes: str = _field('', model_list)

  def check_config(self, config: ml_collections.ConfigDict) -> None:
    if self.drop_worst and config.server_data.val_size < 1:
      raise errors.ConfigError(
          'feddf.drop_worst needs server_data.val_size >= 1 (a labeled '
          'validation set held out of the training set)')


@dataclasses.dataclass(frozen=True)
class FedD3AHparams(Hparams):
  """FedD3A (Su, Li, Xue, AAAI 2023), `config.fedd3a`.

  The distillation itself uses `config.distill`.

  Attributes:
    alpha: Ridge of eq. 5, > 0, in squared feature units.
    weighting: 'soft' (eq. 6) | 'onehot' | 'avg' | 'random' (Table 1's
      ablations).
    ensemble: 'probs' (eq. 7: weighted mean of probabilities) | 'logits'.
    projection_batches: Local batches P is built from; 0 = all of the
      round's batches.
    score_backbone: Backbone of the server samples' features in eq. 6:
      'broadcast' (w_t, the space the clients' P_k were built in) |
      'aggregated' (the averaged model after local training).
    client_models: Heterogeneous clients: '' = every client trains
      `model`. Otherwise a comma list `name[:norm]` (e.g. 'cnn,resnet11');
      client i keeps its own model of entry i % A across rounds, trained
      with CE + kd_weight * KD (temperature kd_temperature) from the
      received global model.
    kd_weight: Heterogeneous clients' weight of the KD term (>= 0).
    kd_temperature: Its temperature (> 0).
  """

  SECTION: ClassVar[str] = 'fedd3a'

  alpha: float = _field(1.0, positive_number)
  weighting: str = _field('soft', one_of(*fedd3a_tf.WEIGHTINGS))
  ensemble: str = _field('probs', one_of(*fedd3a_tf.ENSEMBLES))
  projection_batches: int = _field(0, non_negative_int)
  score_backbone: str = _field('broadcast',
                               one_of(*fedd3a_tf.SCORE_BACKBONES))
  client_models: str = _field('', model_list)
  kd_weight: float = _field(1.0, non_negative_number)
  kd_temperature: float = _field(1.0, positive_number)


@dataclasses.dataclass(frozen=True)
class FedGenHparams(Hparams):
  """FedGen (Zhu, Hong, Zhou, ICML 2021), `config.fedgen`.

  Defaults: its reference code on MNIST.

  Attributes:
    generator_steps: Server Adam steps of the generator per round.
    generator_batch_size: Generated features per server step.
    generator_learning_rate: The generator's Adam learning rate.
    noise: 'gaussian' (the paper) | 'uniform' (the reference code).
    noise_dim: d_n, the generator's noise size.
    hidden: d_h, the generator's hidden width.
    output_activation: The generator's last activation: '' = linear (the
      reference) | a Keras activation name, e.g. 'relu'.
    teacher_ensemble: 'per_head' (the reference) | 'logits' (the paper).
    teacher_weight: Weight of the generator's teacher loss.
    diversity_weight: Weight of its diversity loss.
    local_alpha: c0 of the clients' generated-feature CE, x
      coefficient_decay^round.
    local_beta: c0 of the clients' latent KL term (0 = the paper's
      objective).
    coefficient_decay: Per-round decay of both, in (0, 1].
    local_gen_batch_size: B', generated labels per client step.
    start_round: The clients' regulariser is off before this round.
    reference_steps: Local steps the coefficients are for (reference: 20);
      longer client rounds scale them by reference_steps / steps (0:
      never).
  """

  SECTION: ClassVar[str] = 'fedgen'

  generator_steps: int = _field(50, positive_int)
  generator_batch_size: int = _field(32, positive_int)
  generator_learning_rate: float = _field(3e-4, positive_number)
  noise: str = _field('gaussian', one_of(*generators.NOISE_KINDS))
  noise_dim: int = _field(32, positive_int)
  hidden: int = _field(256, positive_int)
  output_activation: str = _field('', activation)
  teacher_ensemble: str = _field('per_head',
                                 one_of(*fedgen_tf.TEACHER_ENSEMBLES))
  teacher_weight: float = _field(1.0, non_negative_number)
  diversity_weight: float = _field(1.0, non_negative_number)
  local_alpha: float = _field(10.0, non_negative_number)
  local_beta: float = _field(10.0, non_negative_number)
  coefficient_decay: float = _field(0.98, unit_interval)
  local_gen_batch_size: int = _field(32, positive_int)
  start_round: int = _field(1, non_negative_int)
  reference_steps: int = _field(20, non_negative_int)


@dataclasses.dataclass(frozen=True)
class FedFTGHparams(Hparams):
  """FedFTG (Zhang et al., CVPR 2022), `config.fedftg`.

  Defaults: the reference's values where known.

  Attributes:
    iterations: Generator step(s) + student steps, per round.
    student_steps: Student steps per iteration (through
      `distillation.distill`).
    batch_size: Generated samples per generator step and student batch.
    generator_learning_rate: The generator's Adam learning rate.
    student_learning_rate: The student's SGD learning rate.
    lr_decay: Per-round factor of both learning rates, in (0, 1].
    temperature: Distillation temperature (also the transfer term's).
    student_training: False: the student's BatchNorm statistics are
      frozen; True: they move towards the generated data's.
    noise: 'gaussian' | 'uniform'.
    noise_dim: The generator's noise size.
    transfer_weight: beta_tran (the hard-sample term).
    diversity_weight: beta_div.
    mask: 'agree' (push only samples the student still agrees on) | 'none'.
    ensemble: Class-level ensemble of 'logits' | 'probs'.
    generator_steps: Generator steps per iteration (0: one per teacher,
      the reference's).
    kl_reduction: The student KD loss over batch x classes: 'mean' (the
      reference's: SGD's step is C times smaller) | 'batchmean'.
  """

  SECTION: ClassVar[str] = 'fedftg'

  iterations: int = _field(10, positive_int)
  student_steps: int = _field(5, positive_int)
  batch_size: int = _field(64, positive_int)
  generator_learning_rate: float = _field(0.01, positive_number)
  student_learning_rate: float = _field(0.1, positive_number)
  lr_decay: float = _field(0.998, unit_interval)
  temperature: float = _field(1.0, positive_number)
  student_training: bool = _field(False, boolean)
  noise: str = _field('gaussian', one_of(*generators.NOISE_KINDS))
  noise_dim: int = _field(100, positive_int)
  transfer_weight: float = _field(1.0, non_negative_number)
  diversity_weight: float = _field(1.0, non_negative_number)
  mask: str = _field('agree', one_of(*fedftg_tf.MASKS))
  ensemble: str = _field('logits', one_of('logits', 'probs'))
  generator_steps: int = _field(0, non_negative_int)
  kl_reduction: str = _field('mean', one_of(*distillation.KL_REDUCTIONS))


DAFKD_GENERATORS = ('mlp', 'dcgan')
DAFKD_ENSEMBLES = ('probs', 'logits')
DAFKD_POOL_GENERATORS = ('aggregated', 'broadcast')
DAFKD_AGGREGATIONS = ('mean', 'examples')
DAFKD_POOLS = ('generator', 'real')


@dataclasses.dataclass(frozen=True)
class DaFKDHparams(Hparams):
  """DaFKD (Wang et al., CVPR 2023), `config.dafkd`.

  The client optimiser is `config.client_optimizer` (paper: lr 1e-3,
  weight decay 1e-3 -> name=adam plus weight_decay, i.e. AdamW); the
  distillation is `config.distill` (paper: lr 0.01; reference: T = 20).

  Attributes:
    pool_size: Generated distillation images per round (reference: 1,280).
    noise_dim: The generator's noise size (paper: 100).
    generator_hidden: The MLP generator's FC+BN+LeakyReLU widths, a comma
      list.
    generator_learning_rate: The generator's Adam learning rate (paper
      1e-3).
    generator_beta_1: Its Adam beta_1 (reference code: 0.5).
    generator_beta_2: Its Adam beta_2 (reference code: 0.99).
    generator: 'mlp' (the paper's) | 'dcgan' (the reference code's).
    generator_form: 'non_saturating' | 'minimax' (eq. 3 as printed).
    discriminator_mode: BatchNorm mode of everything the discriminator
      scores in training: 'inference' (as the server scores; default) |
      'real_train' | 'batch' | 'batch_update' (the reference code). See
      `core.gan.client_gan_step`.
    gan_steps: GAN terms (eq. 2 in eq. 9, eq. 3) only in gan_steps local
      steps of a round, plain CE steps in the others; 0 = every step
      (Algorithm 1).
    gan_window: Where those steps are: 'first' (reference code: first
      epochs) | 'last' (the head ends the round in step with the extractor
      it uploads).
    adv_weight: Weight of eq. 2 in eq. 9.
    gp_weight: Gradient-penalty weight (reference code 0.3, paper 0).
    weight_decay: > 0 needs client_optimizer.name=adam (AdamW).
    no_sharing: Ablation: a separate discriminator network instead of one
      on the classifier's extractor (the builder's `shared` is its
      negation).
    no_correlation: Ablation: uniform teacher weights instead of eq. 7's.
    weights_on: Teacher weights applied to 'probs' (eq. 8) | 'logits' (the
      reference code).
    private: Appendix B: discriminators stay on the clients; needs a
      secure-sum (test) context.
    pool_generator: '' auto ('broadcast' if private, else 'aggregated') |
      'aggregated' (theta_{t+1}, Algorithm 1 line 11) | 'broadcast'
      (theta_t).
    aggregation: Averaging of classifiers and generators: 'mean' (the
      paper's 1/K_t) | 'examples' (FedAvg's n_k / n).
    pool: 'generator' (DaFKD) | 'real': the oracle-pool ablation
      (negatives and distillation pool are the server's real proxy
      images).
    holder_share: Diagnostics (with server_data.val_size > 0): a client
      holds a label when at least this share of its examples have it.
  """

  SECTION: ClassVar[str] = 'dafkd'

  pool_size: int = _field(1280, positive_int)
  noise_dim: int = _field(100, positive_int)
  generator_hidden: str = _field('256,512', widths)
  generator_learning_rate: float = _field(1e-3, positive_number)
  generator_beta_1: float = _field(0.5, unit_fraction)
  generator_beta_2: float = _field(0.99, unit_fraction)
  generator: str = _field('mlp', one_of(*DAFKD_GENERATORS))
  generator_form: str = _field('non_saturating',
                               one_of(*gan.GENERATOR_FORMS))
  discriminator_mode: str = _field('inference',
                                   one_of(*gan.DISCRIMINATOR_MODES))
  gan_steps: int = _field(0, non_negative_int)
  gan_window: str = _field('last', one_of(*dafkd_tf.GAN_WINDOWS))
  adv_weight: float = _field(1.0, non_negative_number)
  gp_weight: float = _field(0.0, non_negative_number)
  weight_decay: float = _field(0.0, non_negative_number)
  no_sharing: bool = _field(False, boolean)
  no_correlation: bool = _field(False, boolean)
  weights_on: str = _field('probs', one_of(*DAFKD_ENSEMBLES))
  private: bool = _field(False, boolean)
  pool_generator: str = _field('', one_of('', *DAFKD_POOL_GENERATORS))
  aggregation: str = _field('mean', one_of(*DAFKD_AGGREGATIONS))
  pool: str = _field('generator', one_of(*DAFKD_POOLS))
  holder_share: float = _field(0.05, unit_interval)

  @property
  def hidden_widths(self) -> tuple[int, ...]:
    """`generator_hidden` as integers."""
    return parse_widths(self.generator_hidden)

  @property
  def resolved_pool_generator(self) -> str:
    """`pool_generator`, with '' resolved ('broadcast' if private)."""
    return self.pool_generator or ('broadcast' if self.private
                                   else 'aggregated')

  def _check_combinations(self) -> None:
    if self.private and self.weights_on != 'probs':
      raise errors.ConfigError(
          f'dafkd.weights_on={self.weights_on!r}: private mode (appendix B) '
          "sums soft predictions: it needs weights_on='probs'")
    if self.private and self.resolved_pool_generator != 'broadcast':
      raise errors.ConfigError(
          f'dafkd.pool_generator={self.pool_generator!r}: private mode '
          'draws the pool on the clients, which only have the broadcast '
          "generator: pool_generator must be 'broadcast'")
    if self.private and self.pool == 'real':
      raise errors.ConfigError(
          "dafkd.pool='real' is an ablation of the plain (non-private) "
          'method: set dafkd.private=False')

  def check_config(self, config: ml_collections.ConfigDict) -> None:
    opt = config.client_optimizer.name
    if self.weight_decay and opt != 'adam':
      # Decoupled weight decay (AdamW): TFF's SGD has none.
      raise errors.ConfigError(
          'dafkd.weight_decay needs client_optimizer.name=adam (AdamW); '
          f'got dafkd.weight_decay={self.weight_decay!r} with {opt!r}')
    if self.pool == 'real' and not config.server_data.proxy:
      raise errors.ConfigError(
          "dafkd.pool='real' (the oracle pool) needs the server's proxy "
          'pool: set server_data.proxy and server_data.proxy_size')


ALL: Sequence[type] = (FedProxHparams, FedDFHparams, FedD3AHparams,
                       FedGenHparams, FedFTGHparams, DaFKDHparams)
