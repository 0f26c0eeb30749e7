"""Hyper-parameters written once: the base class and the shared checkers.

Every config section is a frozen dataclass of `Hparams`: each method's in
its package (`tff_kd/methods/<m>/hparams.py`), the shared ones (dataset,
partition, model, local work, optimisers, server data, runtime) in
`tff_kd.program.settings` and the distillation's in
`tff_kd.core.distillation`. Its fields are the section's keys, with the
defaults in force: `tff_kd.program.settings.default_config` (and so
`configs/base.py`) builds each section from them (`config_section`), and
`tff_kd.program.settings.from_config` validates the whole tree once,
before any data is touched.

A field declared with `config=False` is set by the program, not by a
config (e.g. the distillation's seed, which is the experiment's). A renamed
key keeps working for one release through the class's `ALIASES`: the old
key stays in the config (unset, None) and, when set, is translated to the
new one with a warning (`canonical_section`).

A method section may offer named presets of its keys (`VARIANTS`, selected
by its `variant` key; `Variant`): the keys a preset sets stay unset (None)
in the config, so that a value the config sets wins over the preset's, and
`tff_kd.program.settings.from_config` fills in the rest from the chosen
preset, then the class's defaults.

Each field carries its checker (`field(default, checker)`), one of the
small shared set below (`positive_int`, `non_negative_number`, `one_of`,
...); `validate()` runs them, then the class's checks of field
combinations, and raises `tff_kd.errors.ConfigError` naming the key as
`<section>.<field>` and the bad value. Checks that need other sections of
the experiment config are `check_settings`'s, on the run's validated
`tff_kd.program.settings.Settings`.
"""

import dataclasses
import math
from typing import (Any, Callable, ClassVar, Mapping, NamedTuple, Optional,
                    TypeVar)

from absl import logging
import ml_collections
import numpy as np

from tff_kd import errors
from tff_kd.models import names as model_names
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
  """A checker accepting exactly `choices`, which its docstring lists."""

  def check(key: str, value: Any) -> None:
    if value not in choices:
      raise errors.ConfigError(
          f'{key} {value!r} is unknown; choose one of '
          f"{', '.join(repr(c) if not c else c for c in choices)}")

  check.__doc__ = f"One of {', '.join(repr(c) for c in choices)}."
  return check


def model_list(key: str, value: Any) -> None:
  """'' or a comma list `name[:norm]` of `tff_kd.models` architectures
  (`keras:<Application>` and `py:<module>:<function>` entries take no
  norm)."""
  if not isinstance(value, str):
    _fail(key, "a comma list such as 'cnn,resnet11'", value)
  model_names.parse_model_list(value, default_norm=model_names.NORMS[0],
                               key=key)


def widths(key: str, value: Any) -> None:
  """A comma list of layer widths >= 1, e.g. '256,512' (a string)."""
  if not isinstance(value, str) or parse_widths(value) is None:
    _fail(key, "comma-separated widths >= 1 such as '256,512'", value)


# The activations `tf.keras.activations.get` knows by name (TF 2.14's Keras),
# listed so that checking a config needs no TensorFlow; a test keeps the
# list in step with Keras.
KERAS_ACTIVATIONS = ('elu', 'exponential', 'gelu', 'hard_sigmoid', 'linear',
                     'mish', 'relu', 'selu', 'sigmoid', 'softmax',
                     'softplus', 'softsign', 'swish', 'tanh')


def activation(key: str, value: Any) -> None:
  """'' (linear) or the name of a Keras activation (`KERAS_ACTIVATIONS`)."""
  if not isinstance(value, str) or (value and
                                    value not in KERAS_ACTIVATIONS):
    _fail(key, "'' or a Keras activation name such as 'relu'", value)


def parse_widths(value: Any) -> Optional[tuple[int, ...]]:
  """The widths of a comma list such as '256,512'; None if it is not one."""
  try:
    parsed = tuple(int(w) for w in str(value).split(','))
  except ValueError:
    return None
  return parsed if all(w >= 1 for w in parsed) else None


def field(default: Any, check: Checker, *, config: bool = True) -> Any:
  """A checked field of an `Hparams` class.

  Args:
    default: Its default value.
    check: Its checker, `check(key, value)`.
    config: Whether it is a config key; False for values the program sets
      (e.g. a seed taken from the experiment's).
  """
  return dataclasses.field(default=default,
                           metadata={'check': check, 'config': config})


def config_fields(cls: type) -> list[dataclasses.Field]:
  """The fields of an `Hparams` class that are config keys."""
  return [f for f in dataclasses.fields(cls)
          if f.metadata.get('config', True)]


class Alias(NamedTuple):
  """A renamed or moved config key, kept for one release.

  Attributes:
    new: The field that replaces it: a field of the same section, or a
      dotted key of another section ('client_optimizer.weight_decay'), where
      a key of a method's section moved to a shared one; the run's settings
      (`tff_kd.program.settings.from_config`) move it when that method runs.
    to_new: Its value -> the new field's value (e.g. `operator.not_` for a
      negated flag).
    field_type: The old key's type where it is not the new field's (a
      moved key's always: `new` is dotted).
  """

  new: str
  to_new: Callable[[Any], Any] = lambda value: value
  field_type: Optional[type] = None

  @property
  def moved(self) -> bool:
    """Whether the key moved to another section."""
    return '.' in self.new


class Variant(NamedTuple):
  """A named preset of a method's keys: `<method>.variant=<name>`.

  Attributes:
    summary: What the preset is, in one line.
    differs: What differs from the method's paper (and why), for the
      docs; '' for the paper's own.
    keys: The dotted keys it sets, in the method's own section or in
      `distill` (e.g. {'dafkd.pool': 'real', 'distill.temperature': 1.0});
      a key it does not set keeps its default. A key the config sets wins
      over the preset's value.
  """

  summary: str
  differs: str
  keys: Mapping[str, Any]


# ---------------------------------------------------------------------------
# The base class.


class Hparams:
  """Base of the per-method frozen dataclasses.

  Subclasses set `SECTION` (their config section) and declare every field
  with `field(default, checker)`.
  """

  SECTION: ClassVar[str] = ''
  # Old key -> its replacement, e.g. {'no_sharing': Alias('shared_extractor',
  # operator.not_)}.
  ALIASES: ClassVar[Mapping[str, Alias]] = {}
  # Named presets of the section's keys (`Variant`), selected by the
  # section's `variant` field, which a class with presets declares.
  VARIANTS: ClassVar[Mapping[str, Variant]] = {}

  @classmethod
  def key(cls, name: str) -> str:
    """The dotted config key of field `name`, e.g. 'fedgen.noise'."""
    return f'{cls.SECTION}.{name}' if cls.SECTION else name

  @classmethod
  def default_variant(cls, config: Mapping[str, Any]) -> str:
    """The preset in force where `variant` is '' (unset): the first of
    `VARIANTS` unless a class says otherwise.

    Args:
      config: The whole experiment config (a class may choose by the
        server's data, as DaFKD does).
    """
    del config
    return next(iter(cls.VARIANTS))

  @classmethod
  def preset_keys(cls) -> list[str]:
    """Every dotted key some preset of `VARIANTS` sets (unset, None, in the
    generated config), sorted."""
    return sorted({key for variant in cls.VARIANTS.values()
                   for key in variant.keys})

  def __post_init__(self) -> None:
    # Valid by construction: a section is checked once, when it is made
    # (`from_config`, `replace`, or a builder's caller making it by hand),
    # and nothing downstream checks it again.
    self.validate()

  def validate(self) -> None:
    """Raises `errors.ConfigError` naming the first bad key and its value."""
    for f in dataclasses.fields(self):  # pytype: disable=wrong-arg-types
      f.metadata['check'](self.key(f.name), getattr(self, f.name))
    self._check_combinations()

  def replace(self: _H, **changes: Any) -> _H:
    """A copy with `changes` applied (and checked, as any new section)."""
    return dataclasses.replace(self, **changes)

  def _check_combinations(self) -> None:
    """Checks of several fields together (each field is valid already)."""

  def check_settings(self, settings: Any) -> None:
    """Raises `errors.ConfigError` for a field the rest of the run forbids.

    Called once per run, by `tff_kd.program.settings.from_config`, after
    every section is valid on its own.

    Args:
      settings: The run's `tff_kd.program.settings.Settings`.
    """
    del settings  # Most sections depend on no other section.

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
    return cls(**canonical_section(cls, section, warn=True))


def canonical_section(cls: type[Hparams], section: Mapping[str, Any], *,
                      warn: bool = False) -> dict[str, Any]:
  """A section's keys with old names translated (`Hparams.ALIASES`).

  Args:
    cls: The section's `Hparams` class.
    section: The section as a mapping (or `ConfigDict`); a key or alias
      whose value is None is unset and dropped (it takes its default).
    warn: Log a deprecation warning for each alias that is set.

  Returns:
    The section with only `cls`'s config keys that `section` has.

  Raises:
    ConfigError: an unknown key, or an alias set against its new key.
  """
  if isinstance(section, ml_collections.ConfigDict):
    section = section.to_dict()
  names = [f.name for f in config_fields(cls)]
  out = {k: v for k, v in section.items()
         if k not in cls.ALIASES and v is not None}
  renamed = {old: a for old, a in cls.ALIASES.items() if not a.moved}
  unknown = sorted(set(out) - set(names))
  if unknown:
    raise errors.ConfigError(
        f"config key '{cls.key(unknown[0])}' does not exist; "
        f"{cls.SECTION or 'the config'} has {', '.join(names)}")
  defaults = cls()
  for old, alias in renamed.items():
    value = section.get(old)
    if value is None:
      continue
    new_value = alias.to_new(value)
    current = out.get(alias.new, getattr(defaults, alias.new))
    if current != getattr(defaults, alias.new) and current != new_value:
      raise errors.ConfigError(
          f'{cls.key(old)}={value!r} (the old name of {cls.key(alias.new)}) '
          f'contradicts {cls.key(alias.new)}={current!r}; set only '
          f'{cls.key(alias.new)}')
    if warn:
      logging.warning('config key %s is renamed %s; %s=%r is read as %s=%r',
                      cls.key(old), cls.key(alias.new), cls.key(old), value,
                      cls.key(alias.new), new_value)
    out[alias.new] = new_value
  return out


def config_section(cls: type) -> ml_collections.ConfigDict:
  """The config section of an `Hparams` class, holding its defaults.

  Its old key names (`Hparams.ALIASES`) are there too, unset (None), so
  that configs and command lines that set them keep working, and so are
  the keys its presets set (`Hparams.VARIANTS`), so that a preset fills in
  only what the config leaves unset.
  """
  defaults = cls()
  section = ml_collections.ConfigDict(
      {f.name: getattr(defaults, f.name) for f in config_fields(cls)})
  prefix = f'{cls.SECTION}.'
  for key in cls.preset_keys():
    if key.startswith(prefix):  # Unset: the preset's, else the default.
      name = key[len(prefix):]
      section[name] = ml_collections.FieldReference(
          None, field_type=type(getattr(defaults, name)))
  for old, alias in cls.ALIASES.items():
    section[old] = ml_collections.FieldReference(
        None, field_type=alias.field_type or type(
            getattr(defaults, alias.new)))
  return section
