"""Model and weights settings as text: the names and checks configs need.

Checking a config names architectures (`MODELS`, `keras:<Application>`,
`py:<module>:<function>`), norms, initial weights and generator noise, but
builds nothing; so the names and their checkers live here, with no
TensorFlow import, and `tff_kd.hparams` and the methods' config sections
import this module alone. The TensorFlow modules (`classifiers`,
`pretrained`, `generators`, `py_models`) import their names from here.

The checks read the text of a setting only, with two exceptions:
`check_weights` asks whether a weights *path* exists (`weights_format`),
as it always has, and a `py:<module>:<function>` model asks whether its
module can be found (`find_py_module`: `importlib.util.find_spec`, which
runs no code of the module, but imports the packages above a dotted one).
A `pretrain:<dataset>` setting is parsed and checked here without the file
system (`PretrainSpec`, `check_pretrain_spec`); `tff_kd.models.pretraining`
trains and caches its weights. This module imports no other module of
`tff_kd.models`: they import it (`tests/test_layout.py`).
"""

import dataclasses
import importlib.util
import keyword
import os
import sys
import urllib.parse
from typing import Optional, Sequence

from tff_kd import errors

# The library's own architectures (`tff_kd.models.classifiers`).
MODELS: tuple[str, ...] = ('cnn', 'resnet11')
NORMS: tuple[str, ...] = ('batch', 'group', 'none')

# Keras Applications, named `keras:<name>` in configs: the classifier
# constructors of `tf.keras.applications` (TF 2.14's Keras), listed so that
# checking a config needs no TensorFlow; a test keeps the list in step with
# Keras.
KERAS_PREFIX = 'keras:'
APPLICATIONS: tuple[str, ...] = (
    'ConvNeXtBase', 'ConvNeXtLarge', 'ConvNeXtSmall', 'ConvNeXtTiny',
    'ConvNeXtXLarge', 'DenseNet121', 'DenseNet169', 'DenseNet201',
    'EfficientNetB0', 'EfficientNetB1', 'EfficientNetB2', 'EfficientNetB3',
    'EfficientNetB4', 'EfficientNetB5', 'EfficientNetB6', 'EfficientNetB7',
    'EfficientNetV2B0', 'EfficientNetV2B1', 'EfficientNetV2B2',
    'EfficientNetV2B3', 'EfficientNetV2L', 'EfficientNetV2M',
    'EfficientNetV2S', 'InceptionResNetV2', 'InceptionV3', 'MobileNet',
    'MobileNetV2', 'MobileNetV3Large', 'MobileNetV3Small', 'NASNetLarge',
    'NASNetMobile', 'RegNetX002', 'RegNetX004', 'RegNetX006', 'RegNetX008',
    'RegNetX016', 'RegNetX032', 'RegNetX040', 'RegNetX064', 'RegNetX080',
    'RegNetX120', 'RegNetX160', 'RegNetX320', 'RegNetY002', 'RegNetY004',
    'RegNetY006', 'RegNetY008', 'RegNetY016', 'RegNetY032', 'RegNetY040',
    'RegNetY064', 'RegNetY080', 'RegNetY120', 'RegNetY160', 'RegNetY320',
    'ResNet101', 'ResNet101V2', 'ResNet152', 'ResNet152V2', 'ResNet50',
    'ResNet50V2', 'ResNetRS101', 'ResNetRS152', 'ResNetRS200', 'ResNetRS270',
    'ResNetRS350', 'ResNetRS420', 'ResNetRS50', 'VGG16', 'VGG19', 'Xception')

# A user's own model, named `py:<module>:<function>` in configs: the
# function (of a module on sys.path, or in the current directory) builds it
# (`tff_kd.models.py_models`; docs/own_model.md).
PY_PREFIX = 'py:'
_PY_USAGE = ('expected py:<module>:<function>, e.g. py:my_models:build (a '
             'module on sys.path or in the current directory, and a '
             'function in it)')

# The weights setting of Keras' ImageNet backbone weights.
IMAGENET = 'imagenet'
# Suffixes of Keras' h5 weights files.
H5_SUFFIXES: tuple[str, ...] = ('.h5', '.hdf5', '.keras')

# Generator noise (`tff_kd.models.generators.sample_noise`).
NOISE_KINDS: tuple[str, ...] = ('gaussian', 'uniform')

# Weights the library makes itself: `pretrain:<dataset>[?epochs=N&limit=N]`
# (`tff_kd.models.pretraining` trains and caches them).
PRETRAIN_PREFIX = 'pretrain:'
PRETRAIN_EPOCHS = 5
_PRETRAIN_OPTIONS = ('epochs', 'limit')


def is_application(name: object) -> bool:
  """Whether `name` is a `keras:<Application>` model name (known or not)."""
  return isinstance(name, str) and name.startswith(KERAS_PREFIX)


def application_of(name: str) -> str:
  """The Keras Applications name of `keras:<name>`.

  Raises:
    ConfigError: not a known Application.
  """
  app = name[len(KERAS_PREFIX):] if is_application(name) else ''
  if app not in APPLICATIONS:
    raise errors.ConfigError(
        f'model {name!r} is not a Keras Application; use keras:<name> with '
        'a name of tf.keras.applications, e.g. keras:ResNet50, '
        'keras:MobileNetV2, keras:ResNet50V2')
  return app


def is_py_model(name: object) -> bool:
  """Whether `name` is a `py:<module>:<function>` model name (valid or
  not)."""
  return isinstance(name, str) and name.startswith(PY_PREFIX)


def _is_name(text: str) -> bool:
  return text.isidentifier() and not keyword.iskeyword(text)


def py_model_parts(name: str, key: str = 'model.name') -> tuple[str, str]:
  """(module, function) of `py:<module>:<function>`.

  Args:
    name: The model name.
    key: The config key, for the message.

  Raises:
    ConfigError: not `py:` + a dotted module name + `:` + an identifier.
  """
  body = name[len(PY_PREFIX):] if is_py_model(name) else ''
  module, _, function = body.partition(':')
  if not (all(_is_name(part) for part in module.split('.')) and
          _is_name(function)):
    raise errors.ConfigError(f'{key}={name!r}: {_PY_USAGE}')
  return module, function


def _on_sys_path(folder: str) -> bool:
  return any(os.path.abspath(p or os.curdir) == folder for p in sys.path)


def find_py_module(module: str) -> bool:
  """Whether a `py:` model's module can be imported.

  Looks on `sys.path`, then in the current directory: one not on
  `sys.path` (as under the `train` console command; `python -m` and
  notebooks have it already) is appended to `sys.path` when the module is
  there, so that building the model later imports the same module. Runs
  no code of the module itself (a dotted module's parent packages are
  imported, as `importlib.util.find_spec` does).
  """

  def found() -> bool:
    try:
      return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # A missing parent package.
      return False

  if found():
    return True
  cwd = os.getcwd()
  if _on_sys_path(cwd):
    return False
  sys.path.append(cwd)
  importlib.invalidate_caches()
  if found():
    return True
  sys.path.remove(cwd)
  return False


def check_py_model(key: str, name: str) -> tuple[str, str]:
  """Checks a `py:<module>:<function>` name: its syntax, and that its
  module can be found (`find_py_module`); the function is looked up when
  the model is built (`tff_kd.models.py_models`).

  Returns:
    (module, function).

  Raises:
    ConfigError: bad syntax, or a module that is not found.
  """
  module, function = py_model_parts(name, key)
  if not find_py_module(module):
    raise errors.ConfigError(
        f'{key}={name!r}: module {module} not found (looked on sys.path and '
        f'in the current directory {os.getcwd()})')
  return module, function


def check_model_name(key: str, value: object) -> None:
  """A checker (`tff_kd.hparams`): one of `MODELS`, `keras:<App>` or
  `py:<module>:<function>` whose module is found."""
  if is_application(value):
    try:
      application_of(value)
    except errors.ConfigError as e:
      raise errors.ConfigError(f'{key}: {e}') from None
  elif is_py_model(value):
    check_py_model(key, value)
  elif value not in MODELS:
    raise errors.ConfigError(
        f"{key} {value!r} is unknown; choose one of {', '.join(MODELS)}, "
        'keras:<Application> (e.g. keras:MobileNetV2) or '
        'py:<module>:<function> (your own model: docs/own_model.md)')


def parse_model_list(spec: str, *, default_norm: str,
                     key: str) -> list[tuple[str, str]]:
  """(name, norm) of each entry of a comma list `name[:norm]`.

  A `keras:<Application>` or `py:<module>:<function>` entry takes no norm
  (it keeps its own normalisation layers): its pair carries
  `default_norm`, unused.

  Args:
    spec: E.g. 'cnn,resnet11:group,keras:MobileNetV2,py:my_models:build';
      '' gives [].
    default_norm: The norm of entries without one.
    key: The config key, for the error message.

  Raises:
    ConfigError: an entry with an unknown model or norm, or a `py:` entry
      whose module is not found.
  """
  result = []
  for item in (i.strip() for i in spec.split(',')) if spec.strip() else ():
    if is_application(item):
      try:
        application_of(item)
      except errors.ConfigError as e:
        raise errors.ConfigError(f'{key} entry {item!r}: {e}') from None
      result.append((item, default_norm))
      continue
    if is_py_model(item):
      check_py_model(f'{key} entry', item)
      result.append((item, default_norm))
      continue
    name, _, norm = item.partition(':')
    norm = norm or default_norm
    if name not in MODELS or norm not in NORMS:
      raise errors.ConfigError(
          f'{key} entry {item!r} is not model[:norm] with model in '
          f"{', '.join(MODELS)} and norm in {', '.join(NORMS)}, nor "
          'keras:<Application> or py:<module>:<function> (which take no '
          'norm)')
    result.append((name, norm))
  return result


@dataclasses.dataclass(frozen=True)
class PretrainSpec:
  """A parsed `pretrain:` setting.

  Attributes:
    dataset: The central dataset trained on.
    epochs: Passes over its training images.
    limit: Its first `limit` training images only (0: all).
  """

  dataset: str
  epochs: int = PRETRAIN_EPOCHS
  limit: int = 0

  def file_name(self, model: str, norm: str,
                image_shape: Sequence[int], seed: int) -> str:
    """The cache file's name; the default recipe keeps the short name."""
    shape = 'x'.join(str(int(v)) for v in image_shape)
    recipe = '' if (self.epochs, self.limit) == (PRETRAIN_EPOCHS, 0) else (
        f'_e{self.epochs}_n{self.limit}')
    return (f'{model}_{norm}_{shape}_{self.dataset}_seed{int(seed)}'
            f'{recipe}.weights.h5')


def is_pretrain_spec(value: object) -> bool:
  """Whether a weights setting is a `pretrain:` one."""
  return isinstance(value, str) and value.startswith(PRETRAIN_PREFIX)


def parse_pretrain_spec(value: str, key: str = 'model.weights'
                        ) -> PretrainSpec:
  """Parses `pretrain:<dataset>[?epochs=N&limit=N]`, or one ConfigError."""
  # tff_kd.data imports TensorFlow, which checking other settings must not.
  from tff_kd.data import datasets  # pylint: disable=g-import-not-at-top
  usage = (f"{key} {value!r}: expected 'pretrain:<dataset>' with an "
           f"optional '?epochs=N&limit=N', the dataset one of "
           f"{', '.join(datasets.DATASETS)}")
  body = value[len(PRETRAIN_PREFIX):]
  dataset, _, query = body.partition('?')
  if dataset not in datasets.DATASETS:
    raise errors.ConfigError(usage)
  try:
    pairs = urllib.parse.parse_qsl(query, strict_parsing=bool(query))
  except ValueError:
    raise errors.ConfigError(usage) from None
  options = {}
  for name, text in pairs:
    if name not in _PRETRAIN_OPTIONS or name in options or not text.isdigit():
      raise errors.ConfigError(usage)
    options[name] = int(text)
  spec = PretrainSpec(dataset, **options)
  if spec.epochs < 1:
    raise errors.ConfigError(f'{key} {value!r}: epochs must be >= 1')
  return spec


def check_pretrain_spec(key: str, value: str,
                        model: str = '') -> PretrainSpec:
  """Checks a `pretrain:` setting (its syntax and the model it goes with)
  and returns it parsed."""
  spec = parse_pretrain_spec(value, key)
  if model and is_application(model):
    raise errors.ConfigError(
        f"{key}={value!r} pretrains the library's own models; a "
        f"{model!r} backbone takes 'imagenet' or a weights file")
  if model and is_py_model(model):
    raise errors.ConfigError(
        f"{key}={value!r} pretrains the library's own models; your own "
        f'model {model!r} takes a weights file')
  return spec


def weights_format(path: str) -> Optional[str]:
  """'h5', 'checkpoint' or 'saved_model' for an existing weights path."""
  path = os.path.expanduser(path)
  if os.path.isdir(path):
    if os.path.exists(os.path.join(path, 'saved_model.pb')):
      return 'saved_model'
    return None
  if os.path.isfile(path) and path.endswith(H5_SUFFIXES):
    return 'h5'
  if os.path.isfile(path + '.index'):
    return 'checkpoint'
  return None


def check_weights(key: str, value: object, model: str = '') -> None:
  """A checker: '' / None, 'imagenet' (with a `keras:` model), a
  `pretrain:` setting (checked without the file system) or a path.

  Args:
    key: The config key, for the message.
    value: The setting.
    model: The model it applies to ('' when not known yet).

  Raises:
    ConfigError: not a string, 'imagenet' for a model that is not a Keras
      Application, or no weights file at the path.
  """
  if value is None or value == '':
    return
  if not isinstance(value, str):
    raise errors.ConfigError(
        f"{key} must be '', 'imagenet' or a weights path, got {value!r}")
  if value == IMAGENET:
    if model and not is_application(model):
      raise errors.ConfigError(
          f"{key}='imagenet' needs a keras:<Application> model, not "
          f'{model!r}; give a weights file instead')
    return
  if is_pretrain_spec(value):
    check_pretrain_spec(key, value, model)
    return
  if weights_format(value) is None:
    raise errors.ConfigError(
        f'{key} {value!r} is not a weights file: expected an existing .h5 / '
        '.weights.h5 file, a TensorFlow checkpoint prefix (with its .index '
        "file), a SavedModel folder, 'imagenet' or 'pretrain:<dataset>'")


def check_weights_list(key: str, value: object) -> None:
  """A checker: '' or a comma list of weights settings (each as
  `check_weights`); its length is checked against `client_models` by
  `parse_weights_list`."""
  if not isinstance(value, str):
    raise errors.ConfigError(
        f"{key} must be '' or a comma list of '', 'imagenet' or weights "
        f'paths, got {value!r}')
  if value.strip():
    for entry in value.split(','):
      check_weights(f'{key} entry', entry.strip())


def parse_weights_list(spec: str, model_spec: str, *,
                       key: str) -> list[str]:
  """The weights setting of each entry of a `client_models` list.

  Args:
    spec: '' (none pretrained) or a comma list parallel to `model_spec`,
      each entry '', 'imagenet' or a path (paths with commas are not
      supported).
    model_spec: The `client_models` list it goes with.
    key: The config key, for the message.

  Returns:
    One setting per model entry ('' for none).

  Raises:
    ConfigError: a list of another length, or a bad entry.
  """
  names = [n.strip() for n in model_spec.split(',')] if (
      model_spec.strip()) else []
  if not isinstance(spec, str):
    raise errors.ConfigError(
        f'{key} must be a comma list of weights settings, got {spec!r}')
  if not spec.strip():
    return [''] * len(names)
  entries = [w.strip() for w in spec.split(',')]
  if len(entries) != len(names):
    raise errors.ConfigError(
        f'{key} has {len(entries)} entries but the client models list '
        f'{model_spec!r} has {len(names)}: give one per model, empty for '
        'none')
  for name, entry in zip(names, entries):
    check_weights(f'{key} entry for {name!r}', entry, name)
  return entries


def model_count(spec: str) -> int:
  """The entries of a `client_models` list ('' is none)."""
  return len([entry for entry in spec.split(',') if entry.strip()])


def grouped_clients_error(what: str, clients_per_call: int,
                          client_execution: str) -> errors.ConfigError:
  """The one line refusing grouped or fused clients (`runtime.
  clients_per_call` > 1 or `runtime.client_execution='fused'`) to a method
  whose clients do not share one model (`what` says why)."""
  return errors.ConfigError(
      f'runtime.clients_per_call={clients_per_call}, '
      f'client_execution={client_execution!r}: {what}, so it runs one '
      "client per call (a call's clients share one model); use 1 and "
      "'sequential'")


def check_ungrouped(what: str, runtime) -> None:
  """`grouped_clients_error` where `runtime` (the run's `runtime` section)
  groups or fuses clients."""
  if runtime.clients_per_call > 1 or runtime.client_execution != 'sequential':
    raise grouped_clients_error(what, runtime.clients_per_call,
                                runtime.client_execution)
