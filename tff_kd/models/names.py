"""Model and weights settings as text: the names and checks configs need.

Checking a config names architectures (`MODELS`, `keras:<Application>`),
norms, initial weights and generator noise, but builds nothing; so the
names and their checkers live here, with no TensorFlow import, and
`tff_kd.hparams` and the methods' config sections import this module
alone. The TensorFlow modules (`classifiers`, `pretrained`, `generators`)
import their names from here.

The checks read the text of a setting only, with one exception:
`check_weights` asks whether a weights *path* exists (`weights_format`),
as it always has. A `pretrain:<dataset>` setting is checked without the
file system (`tff_kd.models.pretraining.check_spec`).
"""

import os
from typing import Optional

from tff_kd import errors
from tff_kd.models import pretraining

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

# The weights setting of Keras' ImageNet backbone weights.
IMAGENET = 'imagenet'
# Suffixes of Keras' h5 weights files.
H5_SUFFIXES: tuple[str, ...] = ('.h5', '.hdf5', '.keras')

# Generator noise (`tff_kd.models.generators.sample_noise`).
NOISE_KINDS: tuple[str, ...] = ('gaussian', 'uniform')


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


def check_model_name(key: str, value: object) -> None:
  """A checker (`tff_kd.hparams`): one of `MODELS` or `keras:<App>`."""
  if is_application(value):
    try:
      application_of(value)
    except errors.ConfigError as e:
      raise errors.ConfigError(f'{key}: {e}') from None
  elif value not in MODELS:
    raise errors.ConfigError(
        f"{key} {value!r} is unknown; choose one of {', '.join(MODELS)} or "
        'keras:<Application> (e.g. keras:MobileNetV2)')


def parse_model_list(spec: str, *, default_norm: str,
                     key: str) -> list[tuple[str, str]]:
  """(name, norm) of each entry of a comma list `name[:norm]`.

  A `keras:<Application>` entry takes no norm (the Application keeps its
  own normalisation layers): its pair carries `default_norm`, unused.

  Args:
    spec: E.g. 'cnn,resnet11:group,keras:MobileNetV2'; '' gives [].
    default_norm: The norm of entries without one.
    key: The config key, for the error message.

  Raises:
    ConfigError: an entry with an unknown model or norm.
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
    name, _, norm = item.partition(':')
    norm = norm or default_norm
    if name not in MODELS or norm not in NORMS:
      raise errors.ConfigError(
          f'{key} entry {item!r} is not model[:norm] with model in '
          f"{', '.join(MODELS)} and norm in {', '.join(NORMS)}, nor "
          'keras:<Application> (which takes no norm)')
    result.append((name, norm))
  return result


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
  if pretraining.is_spec(value):
    pretraining.check_spec(key, value, model)
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
