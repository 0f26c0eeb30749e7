"""Keras classifiers that expose their feature extractor and head separately.

DaFKD (Wang et al., CVPR 2023, Sec. 3.4) puts its domain discriminator on the
classifier's feature extractor, FedGen (Zhu et al., ICML 2021) feeds
generated features to the classifier's last layer, and FedD3A (Su, Li, Xue,
AAAI 2023, eq. 5-6) projects backbone features. So every classifier here is
built as two Keras models that share their variables with the full model:

    features: images -> feature vector (d)
    head:     feature vector -> logits
    model:    images -> head(features(images))

Training `model` trains both parts; `model.trainable_weights` lists the
extractor's variables first, then the head's.

Architectures:

* `cnn`: the FedGen reference CNN for 28x28 inputs (26k parameters on MNIST):
  conv3x3/2 1->6, norm, ReLU; conv3x3/2 6->16, norm, ReLU; flatten; FC ->32,
  ReLU (the 32-d feature); FC 32->classes (the head). Other input sizes give
  a larger flattened layer.
* `resnet11`: the backbone of DaFKD's released code (called ResNet11 there;
  see shared REFERENCE_NOTES): a bottleneck ResNet (He et al., CVPR 2016)
  with a 3x3 16-channel stem, three stages of two bottleneck blocks each with
  widths 16, 32, 64 and expansion 4 (so 64, 128, 256 output channels),
  strides 1, 2, 2, a 1x1 projection shortcut where the shape changes, global
  average pooling to the 256-d feature, and one linear classifier. Every
  block is conv1x1 -> norm -> ReLU -> conv3x3(stride) -> norm -> ReLU ->
  conv1x1 -> norm, plus the shortcut, then ReLU. The reference uses 3x32x32
  inputs; any HxWxC works.

`norm` selects BatchNorm (`batch`), GroupNorm (`group`: the largest group
count <= 8 that divides the channels, Hsieh et al. 2020 recommend it for
non-IID FL) or none. Initialisers are seeded, so the same seed gives the same
initial weights in eager and graph mode.
"""

import math
from typing import Callable, NamedTuple, Sequence

import tensorflow as tf

from tff_kd import errors

NORMS = ('batch', 'group', 'none')


class Classifier(NamedTuple):
  """A classifier and its two shared-variable halves.

  Attributes:
    model: images -> logits.
    features: images -> [batch, feature_dim] features.
    head: features -> logits.
    feature_dim: Size of the feature vector.
  """

  model: tf.keras.Model
  features: tf.keras.Model
  head: tf.keras.Model
  feature_dim: int


class InitSeeds:
  """Hands out distinct, deterministic initialiser seeds."""

  def __init__(self, seed: int):
    self._seed = int(seed) * 1_000
    self._count = 0

  def __call__(self, kind: str = 'he') -> tf.keras.initializers.Initializer:
    self._count += 1
    seed = self._seed + self._count
    if kind == 'glorot':
      return tf.keras.initializers.GlorotUniform(seed=seed)
    return tf.keras.initializers.HeNormal(seed=seed)


def _norm(norm: str, channels: int) -> tf.keras.layers.Layer:
  if norm == 'batch':
    # PyTorch's defaults (momentum 0.1 there is 0.9 here): with Keras' 0.99
    # the moving statistics barely move in a round of 20 local steps.
    return tf.keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)
  if norm == 'group':
    groups = max(g for g in range(1, 9) if channels % g == 0)
    return tf.keras.layers.GroupNormalization(groups=groups)
  return tf.keras.layers.Identity()


def _conv(seeds: InitSeeds, filters: int, kernel: int, stride: int = 1,
          norm: str = 'none') -> tf.keras.layers.Conv2D:
  return tf.keras.layers.Conv2D(
      filters, kernel, strides=stride, padding='same',
      use_bias=norm == 'none', kernel_initializer=seeds())


def _cnn_features(inputs: tf.Tensor, seeds: InitSeeds, norm: str) -> tf.Tensor:
  h = inputs
  for filters in (6, 16):
    h = _conv(seeds, filters, 3, 2, norm)(h)
    h = _norm(norm, filters)(h)
    h = tf.keras.layers.ReLU()(h)
  h = tf.keras.layers.Flatten()(h)
  return tf.keras.layers.Dense(32, activation='relu',
                               kernel_initializer=seeds('glorot'))(h)


def _bottleneck(h: tf.Tensor, seeds: InitSeeds, planes: int, stride: int,
                norm: str) -> tf.Tensor:
  out_channels = planes * 4
  shortcut = h
  if stride != 1 or h.shape[-1] != out_channels:
    shortcut = _conv(seeds, out_channels, 1, stride, norm)(h)
    shortcut = _norm(norm, out_channels)(shortcut)
  y = _conv(seeds, planes, 1, 1, norm)(h)
  y = tf.keras.layers.ReLU()(_norm(norm, planes)(y))
  y = _conv(seeds, planes, 3, stride, norm)(y)
  y = tf.keras.layers.ReLU()(_norm(norm, planes)(y))
  y = _conv(seeds, out_channels, 1, 1, norm)(y)
  y = _norm(norm, out_channels)(y)
  return tf.keras.layers.ReLU()(tf.keras.layers.Add()([y, shortcut]))


def _resnet11_features(inputs: tf.Tensor, seeds: InitSeeds,
                       norm: str) -> tf.Tensor:
  h = _conv(seeds, 16, 3, 1, norm)(inputs)
  h = tf.keras.layers.ReLU()(_norm(norm, 16)(h))
  for planes, stride in ((16, 1), (32, 2), (64, 2)):
    for block in range(2):
      h = _bottleneck(h, seeds, planes, stride if block == 0 else 1, norm)
  return tf.keras.layers.GlobalAveragePooling2D()(h)


_FeatureFn = Callable[[tf.Tensor, InitSeeds, str], tf.Tensor]
_ARCHITECTURES: dict[str, _FeatureFn] = {
    'cnn': _cnn_features,
    'resnet11': _resnet11_features,
}
MODELS: tuple[str, ...] = tuple(_ARCHITECTURES)


def build_classifier(name: str, *, input_shape: Sequence[int],
                     num_classes: int, norm: str = 'batch',
                     seed: int = 0) -> Classifier:
  """Builds a seeded classifier with separate feature extractor and head.

  Args:
    name: One of `MODELS`.
    input_shape: (H, W, C) of the images.
    num_classes: Number of logits.
    norm: One of `NORMS`.
    seed: Initialiser seed.

  Returns:
    A `Classifier`.

  Raises:
    ConfigError: unknown name or norm.
  """
  if name not in _ARCHITECTURES:
    raise errors.ConfigError(
        f"model {name!r} is unknown; choose one of {', '.join(MODELS)}")
  if norm not in NORMS:
    raise errors.ConfigError(
        f"model.norm {norm!r} is unknown; choose one of {', '.join(NORMS)}")
  seeds = InitSeeds(seed)
  inputs = tf.keras.Input(tuple(input_shape), name='images')
  feature = _ARCHITECTURES[name](inputs, seeds, norm)
  features = tf.keras.Model(inputs, feature, name=f'{name}_features')
  feature_dim = int(feature.shape[-1])
  feature_in = tf.keras.Input((feature_dim,), name='features')
  logits = tf.keras.layers.Dense(
      num_classes, kernel_initializer=seeds('glorot'),
      name='classifier')(feature_in)
  head = tf.keras.Model(feature_in, logits, name=f'{name}_head')
  model = tf.keras.Model(inputs, head(features(inputs)), name=name)
  return Classifier(model, features, head, feature_dim)


def parse_model_list(spec: str, *, default_norm: str,
                     key: str) -> list[tuple[str, str]]:
  """(name, norm) of each entry of a comma list `name[:norm]`.

  Args:
    spec: E.g. 'cnn,resnet11:group'; '' gives [].
    default_norm: The norm of entries without one.
    key: The config key, for the error message.

  Raises:
    ConfigError: an entry with an unknown model or norm.
  """
  result = []
  for item in (i.strip() for i in spec.split(',')) if spec.strip() else ():
    name, _, norm = item.partition(':')
    norm = norm or default_norm
    if name not in _ARCHITECTURES or norm not in NORMS:
      raise errors.ConfigError(
          f'{key} entry {item!r} is not model[:norm] with model in '
          f"{', '.join(MODELS)} and norm in {', '.join(NORMS)}")
    result.append((name, norm))
  return result


def num_parameters(model: tf.keras.Model) -> int:
  """Number of trainable scalars."""
  return sum(math.prod(v.shape) for v in model.trainable_weights)
