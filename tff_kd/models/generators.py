"""Conditional generators, DaFKD's discriminator head, and seeded noise.

* `build_image_generator`: the conditional image generator DaFKD (Wang et
  al., CVPR 2023, Sec. 5 "Configurations") and FedFTG (Zhang et al., CVPR
  2022) describe: "two embedding layers (for one-hot label vector and noise
  vector respectively) and the fully-connected layer with LeakyReLU and
  BatchNorm layers". Here:

      e_y = Dense(embed_dim)(one_hot(y))      # the label embedding
      e_z = Dense(embed_dim)(z)               # the noise embedding
      h   = concat(e_y, e_z)   (or e_y * e_z with combine='multiply')
      h   = [Dense(h_i) -> BatchNorm -> LeakyReLU(0.2)] for h_i in hidden
      x   = reshape(tanh(Dense(H*W*C)(h)), image_shape)

  `tanh` because the data pipeline normalises images to [-1, 1]. The paper
  does not say how the two embeddings are combined; concatenation is the
  default (it keeps both intact; the product is the ACGAN-style
  alternative). DaFKD's released code instead uses an unconditional DCGAN
  (see shared REFERENCE_NOTES); the paper's description is implemented.

* `build_feature_generator`: FedGen's generator (Zhu et al., ICML 2021,
  supplement Sec. 9.2, Table 6: d_n = 32, d_h = 256, d = the classifier's
  feature size), in feature space:

      z = Dense(feature_dim)(ReLU(BatchNorm(Dense(hidden)([eps || one_hot(y)]))))

  The reference code's last layer is linear (no activation) although the
  classifier's feature it imitates is post-ReLU (non-negative);
  `output_activation=None` keeps the reference, `'relu'` matches the range
  of the real features.

* `build_discriminator_head`: DaFKD's domain discriminator (Sec. 3.4, Fig. 2):
  `features -> Dense(1) -> sigmoid` on the classifier's *shared* extractor,
  so the discriminator's extractor variables are the classifier's own
  objects and training either trains both. `shared=False` builds a separate
  extractor of the same architecture (the "no sharing" ablation of Table 3).

* `sample_noise`: stateless Gaussian N(0, I) (FedGen's paper, supplement
  Sec. 9) or uniform U[0, 1) (what FedGen's released code draws, despite its
  "Gaussian" comment). DaFKD's code draws Gaussian noise.

Generators take two inputs, `[noise [B, noise_dim], labels]`, where labels
are int class ids [B] (`label_format='int'`, default) or one-hot / soft
label vectors [B, C] (`label_format='one_hot'`). Initialisers are seeded (as
in `classifiers`), so the same seed gives the same initial weights.
"""

import math
from typing import Callable, NamedTuple, Sequence

import tensorflow as tf

from tff_kd import errors
from tff_kd.models import base
from tff_kd.models import classifiers
# The classifiers' seed dispenser; reused so that generators and
# discriminator heads are seeded the same way as the classifiers.
from tff_kd.models.classifiers import InitSeeds
# The noise kinds a config may name (no TensorFlow there), re-exported here.
from tff_kd.models.names import NOISE_KINDS

LABEL_FORMATS = ('int', 'one_hot')
COMBINES = ('concat', 'multiply')
_LEAKY_SLOPE = 0.2  # DCGAN's slope (Radford et al., 2016).


@tf.autograph.experimental.do_not_convert
def sample_noise(shape: Sequence[int] | tf.Tensor,
                 kind: str = 'gaussian',
                 seed: int | Sequence[int] | tf.Tensor = 0) -> tf.Tensor:
  """Stateless generator noise: the same seed gives the same tensor.

  Args:
    shape: Output shape, e.g. [B, noise_dim] (may be a tensor).
    kind: 'gaussian' for N(0, 1) (FedGen's paper, DaFKD's code) or
      'uniform' for U[0, 1) (FedGen's released code, `torch.rand`).
    seed: An int, or a shape-[2] int seed (tensor allowed).

  Returns:
    float32 tensor of `shape`.

  Raises:
    ValueError: Unknown `kind`.
  """
  if kind not in NOISE_KINDS:
    raise ValueError(f'noise kind {kind!r} is unknown; choose one of '
                     f"{', '.join(NOISE_KINDS)}")
  seed = _as_seed(seed)
  if kind == 'gaussian':
    return tf.random.stateless_normal(shape, seed=seed)
  return tf.random.stateless_uniform(shape, seed=seed)


@tf.autograph.experimental.do_not_convert
def _as_seed(seed) -> tf.Tensor:
  if isinstance(seed, int):
    return tf.constant([seed, 0], tf.int64)
  return tf.cast(tf.convert_to_tensor(seed), tf.int64)


def _batch_norm() -> tf.keras.layers.Layer:
  # Same PyTorch-like statistics as the classifiers (BUILD_NOTES).
  return tf.keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)


def _label_input(num_classes: int, label_format: str):
  """(Keras input, float one-hot [B, C] tensor) for the label input."""
  if label_format not in LABEL_FORMATS:
    raise errors.ConfigError(
        f"label_format {label_format!r} is unknown; choose one of "
        f"{', '.join(LABEL_FORMATS)}")
  if label_format == 'int':
    labels = tf.keras.Input((), dtype=tf.int32, name='labels')
    one_hot = tf.keras.layers.CategoryEncoding(
        num_classes, output_mode='one_hot', name='one_hot')(
            tf.keras.layers.Reshape((1,))(labels))
    return labels, one_hot
  labels = tf.keras.Input((num_classes,), name='labels')
  return labels, labels


def _check_positive(**values) -> None:
  for name, value in values.items():
    if not isinstance(value, int) or value < 1:
      raise errors.ConfigError(f'{name} must be an integer >= 1, got {value!r}')


@base.constructs_keras_models
def build_image_generator(*,
                          noise_dim: int,
                          num_classes: int,
                          image_shape: Sequence[int],
                          hidden: Sequence[int] = (256, 512),
                          embed_dim: int | None = None,
                          combine: str = 'concat',
                          label_format: str = 'int',
                          seed: int = 0) -> tf.keras.Model:
  """DaFKD / FedFTG conditional image generator (see module docstring).

  Args:
    noise_dim: Size of the noise vector z (DaFKD: 100).
    num_classes: C, the number of labels.
    image_shape: (H, W, C) of the generated images.
    hidden: Widths of the FC -> BatchNorm -> LeakyReLU blocks.
    embed_dim: Width of each embedding (default: `noise_dim`).
    combine: 'concat' or 'multiply' (element-wise) the two embeddings.
    label_format: 'int' (labels [B]) or 'one_hot' (labels [B, C]).
    seed: Initialiser seed.

  Returns:
    A Keras model `[noise, labels] -> images [B, H, W, C]` in [-1, 1].

  Raises:
    ConfigError: Bad sizes or an unknown `combine` / `label_format`.
  """
  embed_dim = noise_dim if embed_dim is None else embed_dim
  _check_positive(noise_dim=noise_dim, num_classes=num_classes,
                  embed_dim=embed_dim)
  _check_positive(**{f'hidden[{i}]': h for i, h in enumerate(hidden)})
  _check_positive(**{f'image_shape[{i}]': s for i, s in enumerate(image_shape)})
  if combine not in COMBINES:
    raise errors.ConfigError(
        f"combine {combine!r} is unknown; choose one of {', '.join(COMBINES)}")
  seeds = InitSeeds(seed)
  noise = tf.keras.Input((noise_dim,), name='noise')
  labels, one_hot = _label_input(num_classes, label_format)
  label_embedding = tf.keras.layers.Dense(
      embed_dim, kernel_initializer=seeds('glorot'),
      name='label_embedding')(one_hot)
  noise_embedding = tf.keras.layers.Dense(
      embed_dim, kernel_initializer=seeds('glorot'),
      name='noise_embedding')(noise)
  if combine == 'concat':
    h = tf.keras.layers.Concatenate()([label_embedding, noise_embedding])
  else:
    h = tf.keras.layers.Multiply()([label_embedding, noise_embedding])
  for width in hidden:
    h = tf.keras.layers.Dense(width, kernel_initializer=seeds('glorot'))(h)
    h = _batch_norm()(h)
    h = tf.keras.layers.LeakyReLU(_LEAKY_SLOPE)(h)
  h = tf.keras.layers.Dense(
      math.prod(image_shape), activation='tanh',
      kernel_initializer=seeds('glorot'))(h)
  images = tf.keras.layers.Reshape(tuple(image_shape), name='images')(h)
  return tf.keras.Model([noise, labels], images, name='image_generator')


@base.constructs_keras_models
def build_dcgan_generator(*,
                          noise_dim: int,
                          num_classes: int,
                          image_shape: Sequence[int],
                          width: int = 64,
                          label_format: str = 'int',
                          seed: int = 0) -> tf.keras.Model:
  """A DCGAN image generator (Radford et al., ICLR 2016), as DaFKD's code uses.

  DaFKD's released code trains an unconditional DCGAN instead of the paper's
  embedding + FC generator. Here, for images of H x W (both divisible by 4):

      h = ReLU(BatchNorm(Dense(H/4 * W/4 * 2 width)([z || one_hot(y)])))
      h = ReLU(BatchNorm(Conv2DTranspose(width, 4, stride 2)(h)))  # H/2
      x = tanh(Conv2DTranspose(C, 4, stride 2)(h))                  # H

  The label is concatenated to the noise so that the model has the same
  `[noise, labels]` inputs as `build_image_generator`; DaFKD's eq. (3) gives
  it no label signal (the discriminators are unconditional), so it acts as
  an unconditional generator whose samples the teachers label.

  Args:
    noise_dim: Size of z (DaFKD: 100).
    num_classes: C.
    image_shape: (H, W, C), H and W divisible by 4.
    width: Channels of the last hidden feature map (twice that before it).
    label_format: 'int' (labels [B]) or 'one_hot' (labels [B, C]).
    seed: Initialiser seed.

  Returns:
    A Keras model `[noise, labels] -> images [B, H, W, C]` in [-1, 1].

  Raises:
    ConfigError: Bad sizes, or H or W not divisible by 4.
  """
  _check_positive(noise_dim=noise_dim, num_classes=num_classes, width=width)
  _check_positive(**{f'image_shape[{i}]': s for i, s in enumerate(image_shape)})
  height, wide, channels = image_shape
  if height % 4 or wide % 4:
    raise errors.ConfigError(
        f'the DCGAN generator needs an image height and width divisible by '
        f'4, got {tuple(image_shape)}')
  seeds = InitSeeds(seed)
  noise = tf.keras.Input((noise_dim,), name='noise')
  labels, one_hot = _label_input(num_classes, label_format)
  h = tf.keras.layers.Concatenate()([noise, one_hot])
  h = tf.keras.layers.Dense(height // 4 * wide // 4 * 2 * width,
                            use_bias=False,
                            kernel_initializer=seeds('glorot'))(h)
  h = tf.keras.layers.ReLU()(_batch_norm()(h))
  h = tf.keras.layers.Reshape((height // 4, wide // 4, 2 * width))(h)
  h = tf.keras.layers.Conv2DTranspose(
      width, 4, strides=2, padding='same', use_bias=False,
      kernel_initializer=seeds('glorot'))(h)
  h = tf.keras.layers.ReLU()(_batch_norm()(h))
  images = tf.keras.layers.Conv2DTranspose(
      channels, 4, strides=2, padding='same', activation='tanh',
      kernel_initializer=seeds('glorot'), name='images')(h)
  return tf.keras.Model([noise, labels], images, name='dcgan_generator')


@base.constructs_keras_models
def build_feature_generator(*,
                            noise_dim: int = 32,
                            num_classes: int,
                            feature_dim: int,
                            hidden: int = 256,
                            output_activation: str | None = None,
                            label_format: str = 'int',
                            seed: int = 0) -> tf.keras.Model:
  """FedGen's feature-space generator (see module docstring).

  Args:
    noise_dim: d_n (FedGen: 32).
    num_classes: C.
    feature_dim: d, the classifier's feature size (`Classifier.feature_dim`).
    hidden: d_h (FedGen: 256 for MNIST/EMNIST, 128 for CelebA).
    output_activation: None (linear, FedGen's code) or e.g. 'relu' (the
      range of a post-ReLU classifier feature).
    label_format: 'int' (labels [B]) or 'one_hot' (labels [B, C]).
    seed: Initialiser seed.

  Returns:
    A Keras model `[noise, labels] -> features [B, feature_dim]`.
  """
  _check_positive(noise_dim=noise_dim, num_classes=num_classes,
                  feature_dim=feature_dim, hidden=hidden)
  seeds = InitSeeds(seed)
  noise = tf.keras.Input((noise_dim,), name='noise')
  labels, one_hot = _label_input(num_classes, label_format)
  h = tf.keras.layers.Concatenate()([noise, one_hot])
  h = tf.keras.layers.Dense(hidden, kernel_initializer=seeds('glorot'))(h)
  h = tf.keras.layers.ReLU()(_batch_norm()(h))
  features = tf.keras.layers.Dense(
      feature_dim, activation=output_activation,
      kernel_initializer=seeds('glorot'), name='features')(h)
  return tf.keras.Model([noise, labels], features, name='feature_generator')


class DiscriminatorHead(NamedTuple):
  """DaFKD's domain discriminator f(theta_k^d; x) (Sec. 3.2, 3.4).

  Attributes:
    model: images -> f(x) = P(x is local real data), [B, 1] in (0, 1);
      with a projection head `[images, labels] -> f(x, y)`.
    logit_model: The pre-sigmoid logit [B, 1] (same variables and inputs);
      losses use it for numerical stability.
    extractor: The feature extractor it runs on: the classifier's own
      `features` model when shared, a separate copy otherwise.
    head: features (and labels) -> logit [B, 1]: the discriminator-only
      layers.
    head_variables: The discriminator-only trainable variables (the head's).
      With sharing, these plus the classifier's variables are everything a
      client trains; without, `model.trainable_weights` is the whole
      discriminator.
    shared: Whether `extractor` is the classifier's.
    num_classes: 0 for DaFKD's unconditional head; C for a projection head
      (Miyato & Koyama, ICLR 2018) that also reads the sample's label:
      logit = w . phi(x) + b + e_y . phi(x).
  """

  model: tf.keras.Model
  logit_model: tf.keras.Model
  extractor: tf.keras.Model
  head: tf.keras.Model
  head_variables: list
  shared: bool
  num_classes: int = 0

  @property
  def conditional(self) -> bool:
    """Whether the head reads labels (projection)."""
    return bool(self.num_classes)

  def inputs(self, x, labels):
    """The models' input: `x`, or `[x, labels]` for a projection head."""
    if not self.conditional:
      return x
    if labels is None:
      raise ValueError('a projection discriminator needs the labels of the '
                       'samples it scores')
    return [x, tf.cast(labels, tf.int32)]

  def logits(self, x, labels=None, *, training: bool = False) -> tf.Tensor:
    """Pre-sigmoid logits [B, 1] of images (and labels)."""
    return self.logit_model(self.inputs(x, labels), training=training)

  def head_logits(self, features, labels=None, *,
                  training: bool = False) -> tf.Tensor:
    """Pre-sigmoid logits [B, 1] of extracted features (and labels)."""
    return self.head(self.inputs(features, labels), training=training)


@base.constructs_keras_models
def build_discriminator_head(
    classifier: classifiers.Classifier,
    *,
    seed: int = 0,
    shared: bool = True,
    extractor_fn: Callable[[], tf.keras.Model] | None = None,
    num_classes: int = 0,
) -> DiscriminatorHead:
  """DaFKD's discriminator: a linear-sigmoid head on a feature extractor.

  With `shared=True` (Sec. 3.4: "all previous layers before the last
  fully-connected layer as share layers"), the head sits on
  `classifier.features` itself: the returned models hold the very same
  variable objects, so a discriminator step changes the classifier's
  features and vice versa. BatchNorm moving statistics are shared too.

  With `shared=False` (Table 3's ablation), the extractor is a new model of
  the same architecture: `extractor_fn()` if given (e.g.
  `lambda: build_classifier(name, ..., seed=s).features`), otherwise
  `tf.keras.models.clone_model(classifier.features)`, whose layers are
  re-created from their configs, seeded initialisers included, so the copy
  starts from the values a fresh classifier of the same seed would have.

  With `num_classes=C` the head is a projection discriminator: a label
  embedding e_y ([C, d], initialised at zero, so it starts as the plain
  head) adds e_y . phi(x) to the logit, and the models take `[x, labels]`.

  Args:
    classifier: A `Classifier` (`build_classifier`).
    seed: Initialiser seed of the head.
    shared: Share the classifier's extractor (DaFKD) or not (ablation).
    extractor_fn: Builds the separate extractor when `shared=False`; must map
      the classifier's images to a [B, d] feature. Ignored when shared.
    num_classes: 0 (DaFKD's head) or C (projection head).

  Returns:
    A `DiscriminatorHead`.
  """
  if shared:
    extractor = classifier.features
  elif extractor_fn is not None:
    extractor = extractor_fn()
  else:
    extractor = tf.keras.models.clone_model(classifier.features)
  if extractor is classifier.features and not shared:
    raise ValueError('extractor_fn returned the classifier\'s own extractor '
                     'with shared=False')
  if not isinstance(num_classes, int) or num_classes < 0:
    raise errors.ConfigError(
        f'num_classes must be an integer >= 0, got {num_classes!r}')
  feature_dim = int(extractor.output_shape[-1])
  seeds = InitSeeds(seed)
  feature_in = tf.keras.Input((feature_dim,), name='features')
  logit = tf.keras.layers.Dense(
      1, kernel_initializer=seeds('glorot'), name='discriminator')(feature_in)
  images = tf.keras.Input(classifier.features.input_shape[1:], name='images')
  if num_classes:
    label_in = tf.keras.Input((), dtype=tf.int32, name='labels')
    embedded = tf.keras.layers.Embedding(
        num_classes, feature_dim, embeddings_initializer='zeros',
        name='label_projection')(label_in)
    projection = tf.keras.layers.Dot(axes=1)([embedded, feature_in])
    logit = tf.keras.layers.Add()([logit, projection])
    head = tf.keras.Model([feature_in, label_in], logit,
                          name='discriminator_head')
    labels = tf.keras.Input((), dtype=tf.int32, name='image_labels')
    inputs = [images, labels]
    logits = head([extractor(images), labels])
  else:
    head = tf.keras.Model(feature_in, logit, name='discriminator_head')
    inputs = images
    logits = head(extractor(images))
  logit_model = tf.keras.Model(inputs, logits, name='discriminator_logit')
  probs = tf.keras.layers.Activation('sigmoid')(logits)
  model = tf.keras.Model(inputs, probs, name='discriminator')
  return DiscriminatorHead(model, logit_model, extractor, head,
                           list(head.trainable_weights), shared, num_classes)
