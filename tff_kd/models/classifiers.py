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

* `keras:<Application>` (e.g. `keras:ResNet50`, `keras:MobileNetV2`,
  `keras:ResNet50V2`; any name of `APPLICATIONS`): a Keras Applications
  backbone (`include_top=False, pooling='avg'`: its pooled features are the
  feature vector) with a new seeded linear head over the classes. The
  library's images are normalised to [-1, 1] (`(p - 0.5) / 0.5`,
  `tff_kd.data.normalise`); the extractor maps them back to pixels in
  [0, 255] and applies the Application's own `preprocess_input` (so
  ResNet50's BGR mean subtraction, MobileNetV2's [-1, 1] scaling and
  DenseNet's ImageNet standardisation are each what the Application expects;
  EfficientNet, ConvNeXt, RegNet and MobileNetV3 scale inside the network).
  Smaller inputs are resized (bilinear, inside the extractor) so that each
  side is at least the Application's minimum (`min_input_size`: 32, 71 for
  Xception, 75 for InceptionV3 and InceptionResNetV2), and 1-channel images
  are made RGB by repeating the channel. `norm` does not apply: an
  Application keeps its own normalisation layers, whose BatchNorm momentum
  is set to 0.9 as in the library's models (Keras' 0.99 / 0.999 barely
  move in a round of local steps). BatchNorm follows the `training` flag
  of the call, like the library's models: training mode in local training,
  inference mode in evaluation and as a teacher. Its initialisers are
  reseeded from `seed` (`_SeededInitialisers`). Pretrained weights
  (ImageNet or a file) come from `tff_kd.models.pretrained`.

* `py:<module>:<function>` (e.g. `py:my_models:build`): the user's own
  Keras model, built by that function (`tff_kd.models.py_models`,
  docs/own_model.md) and split by `from_keras`; its initialisers are
  reseeded from `seed` as an Application's are. `norm` does not apply.

`norm` selects BatchNorm (`batch`), GroupNorm (`group`: the largest group
count <= 8 that divides the channels, Hsieh et al. 2020 recommend it for
non-IID FL) or none. Initialisers are seeded, so the same seed gives the same
initial weights in eager and graph mode.

Any functional Keras classifier becomes a `Classifier` with
`tff_kd.models.keras_models.from_keras`.

`architecture_digest` names a built model's architecture (its layers and
their variables' shapes), which a run folder records so that a resumed run
cannot silently continue with another architecture
(`tff_kd.program.checkpoints`).
"""

import functools
import hashlib
import json
import math
import sys
from typing import Callable, Optional, Sequence

import tensorflow as tf

from tff_kd import errors
from tff_kd.models import py_models
from tff_kd.models import base
from tff_kd.models.base import Classifier  # What every builder returns.
# The text-only names and checks (no TensorFlow), re-exported here.
from tff_kd.models.names import APPLICATIONS
from tff_kd.models.names import application_of
from tff_kd.models.names import check_model_name
from tff_kd.models.names import is_application
from tff_kd.models.names import is_py_model
from tff_kd.models.names import KERAS_PREFIX
from tff_kd.models.names import MODELS
from tff_kd.models.names import NORMS
from tff_kd.models.names import parse_model_list


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
# The feature extractor of each of `MODELS` (in its order; a test checks).
_ARCHITECTURES: dict[str, _FeatureFn] = {
    'cnn': _cnn_features,
    'resnet11': _resnet11_features,
}

# Keras' smallest accepted input side per Application (32 where unlisted).
_MIN_INPUT_SIZE = {'Xception': 71, 'InceptionV3': 75, 'InceptionResNetV2': 75}


def min_input_size(app: str) -> int:
  """The smallest input side Keras accepts for Application `app`."""
  return _MIN_INPUT_SIZE.get(app, 32)


class ApplicationInput(tf.keras.layers.Layer):
  """The library's images -> an Application's expected input.

  Resizes (bilinear) to `size` when given, repeats a single channel to RGB,
  maps [-1, 1] back to pixels in [0, 255] and applies the Application's
  `preprocess_input`. No variables.
  """

  def __init__(self, application: str, size: Optional[Sequence[int]] = None,
               **kwargs):
    super().__init__(**kwargs)
    self.application = application
    self.size = None if size is None else tuple(int(v) for v in size)
    module = sys.modules[getattr(tf.keras.applications,
                                 application).__module__]
    self._preprocess = module.preprocess_input

  def call(self, images: tf.Tensor) -> tf.Tensor:
    x = images
    if self.size is not None:
      x = tf.image.resize(x, self.size, method='bilinear')
    if x.shape[-1] == 1:
      x = tf.repeat(x, 3, axis=-1)
    return self._preprocess((x + 1.0) * 127.5)

  def get_config(self) -> dict:
    return {**super().get_config(), 'application': self.application,
            'size': self.size}


class _SeededInitialisers:
  """A variable creator that reseeds Keras' initialisers deterministically.

  Keras Applications build with unseeded initialisers; inside this scope the
  k-th variable made from a seedable Keras initialiser gets seed
  `seed * 100_003 + 50_000 + k` instead, so the same seed gives the same
  initial weights in every build, eager or graph (as the library's own
  models' `InitSeeds` do).
  """

  def __init__(self, seed: int):
    self._base = int(seed) * 100_003 + 50_000
    self._count = 0

  def __call__(self, next_creator, **kwargs):
    init = kwargs.get('initial_value')
    if isinstance(init, functools.partial) and isinstance(
        init.func, tf.keras.initializers.Initializer):
      config = init.func.get_config()
      if 'seed' in config:
        self._count += 1
        seeded = type(init.func).from_config(
            {**config, 'seed': self._base + self._count})
        kwargs['initial_value'] = functools.partial(seeded, *init.args,
                                                    **init.keywords)
    return next_creator(**kwargs)


def _application_features(app: str, inputs: tf.Tensor,
                          backbone_weights: Optional[str],
                          options: dict) -> tf.Tensor:
  """The pooled features of Application `app` on the library's images."""
  h, w, c = (int(v) for v in inputs.shape[1:])
  if c not in (1, 3):
    raise errors.ConfigError(
        f'keras:{app} needs 1- or 3-channel images, got {c} channels')
  low = min_input_size(app)
  size = (max(h, low), max(w, low))
  x = ApplicationInput(app, size if size != (h, w) else None,
                       name='application_input')(inputs)
  try:
    backbone = getattr(tf.keras.applications, app)(
        include_top=False, weights=backbone_weights,
        input_shape=size + (3,), pooling='avg', **options)
  except ValueError as e:
    raise errors.ConfigError(
        f'keras:{app} cannot be built for {h}x{w}x{c} images: '
        f'{str(e).strip().splitlines()[0]}') from None
  for layer in backbone.submodules:
    if isinstance(layer, tf.keras.layers.BatchNormalization):
      layer.momentum = 0.9
  return backbone(x)


@base.constructs_keras_models
def build_classifier(name: str, *, input_shape: Sequence[int],
                     num_classes: int, norm: str = 'batch', seed: int = 0,
                     backbone_weights: Optional[str] = None,
                     options: Optional[dict] = None) -> Classifier:
  """Builds a seeded classifier with separate feature extractor and head.

  Pretrained weights: `tff_kd.models.pretrained.classifier_builder`.

  Args:
    name: One of `MODELS`, `keras:<Application>` (`APPLICATIONS`) or
      `py:<module>:<function>` (`tff_kd.models.py_models`).
    input_shape: (H, W, C) of the images.
    num_classes: Number of logits.
    norm: One of `NORMS` (unused by Keras Applications and `py:` models).
    seed: Initialiser seed.
    backbone_weights: Keras Applications only: Keras' `weights` argument of
      the backbone (None: seeded random; 'imagenet': Keras' ImageNet
      weights, downloaded by Keras).
    options: Keras Applications only: further constructor arguments, e.g.
      `{'alpha': 0.35}` for MobileNetV2.

  Returns:
    A `Classifier`.

  Raises:
    ConfigError: unknown name or norm, an Application that cannot take
      these images, or a `py:` model that cannot be built
      (`py_models.build`).
  """
  if not (is_application(name) or is_py_model(name)) and name not in MODELS:
    raise errors.ConfigError(
        f"model {name!r} is unknown; choose one of {', '.join(MODELS)}, "
        'keras:<Application> or py:<module>:<function>')
  if norm not in NORMS:
    raise errors.ConfigError(
        f"model.norm {norm!r} is unknown; choose one of {', '.join(NORMS)}")
  if is_py_model(name):
    with tf.variable_creator_scope(_SeededInitialisers(seed)):
      return py_models.build(name, input_shape=input_shape,
                             num_classes=num_classes, seed=seed)
  seeds = InitSeeds(seed)
  inputs = tf.keras.Input(tuple(input_shape), name='images')
  if is_application(name):
    app = application_of(name)
    with tf.variable_creator_scope(_SeededInitialisers(seed)):
      feature = _application_features(app, inputs, backbone_weights,
                                      dict(options or {}))
    name = app
  else:
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


def _leaf_layers(layer: tf.keras.layers.Layer):
  """The layers of a model, nested models' layers in their place."""
  if isinstance(layer, tf.keras.Model):
    for inner in layer.layers:
      yield from _leaf_layers(inner)
  else:
    yield layer


def architecture_digest(model: tf.keras.Model) -> str:
  """A stable digest of a model's architecture (16 hex digits).

  The SHA-256 of its layers in order (nested models' layers in their
  place), each as its class name and the shape and dtype of each of its
  variables. It does not depend on the variables' values, the layers'
  names or the build (eager or graph): the same code builds the same
  digest, and a change of layer types or widths changes it.

  Args:
    model: A built Keras model (e.g. `Classifier.model`).
  """
  layers = [[type(layer).__name__,
             [[list(v.shape), v.dtype.name] for v in layer.weights]]
            for layer in _leaf_layers(model)]
  text = json.dumps(layers, separators=(',', ':'))
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def num_parameters(model: tf.keras.Model) -> int:
  """Number of trainable scalars."""
  return sum(math.prod(v.shape) for v in model.trainable_weights)
