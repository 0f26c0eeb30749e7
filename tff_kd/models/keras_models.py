"""Any functional Keras classifier as the library's `Classifier`.

`from_keras(model, feature_layer=...)` splits a functional Keras model at
one layer: the feature extractor is the model up to that layer's output,
the head is the rest, and both share the model's variables (so training
`Classifier.model` trains the user's model). Every method then uses it as
it uses the library's own CNN: DaFKD's discriminator and FedD3A's
subspaces read the extractor's output, FedGen feeds generated features to
the head.

The library's classifiers output logits. A softmax output is stripped:
a last `Softmax` layer or `Activation('softmax')` is left out of the head,
and a last `Dense` layer with `activation='softmax'` is used without its
activation (same kernel and bias). Any other layer with a softmax
activation is refused.

The model's builder must be deterministic (seeded initialisers) where a
method builds it more than once, as TFF's processes do.
"""

from typing import Optional, Union

import tensorflow as tf

from tff_kd import errors
from tff_kd.models import base


class DenseLogits(tf.keras.layers.Layer):
  """A `Dense` layer's pre-activation output, with that layer's variables."""

  def __init__(self, dense: tf.keras.layers.Dense, **kwargs):
    super().__init__(**kwargs)
    self.dense = dense

  def call(self, inputs: tf.Tensor) -> tf.Tensor:
    out = tf.tensordot(inputs, self.dense.kernel, axes=1)
    if self.dense.use_bias:
      out = tf.nn.bias_add(out, self.dense.bias)
    return out


def _is_softmax(activation) -> bool:
  return getattr(activation, '__name__', '') == 'softmax'


def _find_layer(model: tf.keras.Model,
                feature_layer: Union[str, int]) -> tf.keras.layers.Layer:
  if isinstance(feature_layer, bool) or not isinstance(feature_layer,
                                                       (str, int)):
    raise errors.ConfigError(
        f'feature_layer must be a layer name or index, got {feature_layer!r}')
  if isinstance(feature_layer, int):
    if not -len(model.layers) <= feature_layer < len(model.layers):
      raise errors.ConfigError(
          f'feature_layer index {feature_layer} is out of range: '
          f'{model.name!r} has {len(model.layers)} layers')
    return model.layers[feature_layer]
  for layer in model.layers:
    if layer.name == feature_layer:
      return layer
  raise errors.ConfigError(
      f'feature_layer {feature_layer!r} is not a layer of {model.name!r}; '
      f"its layers: {', '.join(l.name for l in model.layers)}")


def _head_chain(model: tf.keras.Model, layer: tf.keras.layers.Layer):
  """The layers from just after `layer` to the output, in call order, and
  `layer`'s output they read.

  Walks back from the output through each layer's input. The head must be a
  chain of one-input layers (what classifier heads are: Dense, Dropout,
  activations); it is rebuilt on a new input by calling them in order,
  which works in eager and graph mode alike.
  """
  chain = []
  tensor = model.outputs[0]
  while True:
    history = tensor._keras_history  # pylint: disable=protected-access
    current, node_index = history.layer, history.node_index
    if current is layer:
      return chain[::-1], tensor
    if isinstance(current, tf.keras.layers.InputLayer):
      raise errors.ConfigError(
          f'feature_layer {layer.name!r} is not on the chain of one-input '
          f'layers that ends at the output of {model.name!r}; split at a '
          'layer the head reads')
    inputs = current.get_input_at(node_index)
    if isinstance(inputs, (list, tuple, dict)):
      raise errors.ConfigError(
          f'the head after feature_layer {layer.name!r} must be a chain of '
          f'one-input layers, but {current.name!r} reads several tensors; '
          'split at a later layer')
    chain.append(current)
    tensor = inputs


def _logits_chain(model: tf.keras.Model, chain: list) -> list:
  """The head's layers giving logits: a final softmax stripped."""
  last = chain[-1] if chain else None
  if isinstance(last, tf.keras.layers.Softmax) or (
      isinstance(last, tf.keras.layers.Activation) and
      _is_softmax(last.activation)):
    return chain[:-1]
  if _is_softmax(getattr(last, 'activation', None)):
    if isinstance(last, tf.keras.layers.Dense):
      return chain[:-1] + [DenseLogits(last, name=f'{last.name}_logits')]
    raise errors.ConfigError(
        f'{model.name!r} ends in layer {last.name!r} with a softmax '
        'activation; the library needs logits: build it with '
        'activation=None, or end with a separate Softmax layer')
  return chain


def from_keras(model: tf.keras.Model, feature_layer: Union[str, int],
               num_classes: Optional[int] = None) -> base.Classifier:
  """Splits a functional Keras classifier into extractor and head.

  Args:
    model: A functional (or Sequential, built) Keras model with one input
      (images) and one output (logits, or probabilities under a final
      softmax, which is stripped: see the module docstring).
    feature_layer: The last layer of the feature extractor: its name, or
      its index in `model.layers`. Its output must be [batch, d] (add a
      pooling or Flatten layer before the head otherwise), and the layers
      after it must be a chain of one-input layers (Dense, Dropout, ...).
    num_classes: The logits the head must give; None: whatever it gives.

  Returns:
    A `Classifier` whose `features` and `head` share `model`'s
    variables, and whose `model` is `head(features(images))` (logits),
    with the extractor's variables first in `trainable_weights`.

  Raises:
    ConfigError: the model is not functional or has several inputs or
      outputs, the layer is missing, its output is not [batch, d], the head
      is not a chain of one-input layers or does not map to
      [batch, num_classes].
  """
  if not isinstance(model, tf.keras.Model) or not getattr(
      model, '_is_graph_network', False):
    raise errors.ConfigError(
        f'from_keras needs a functional Keras model (tf.keras.Model(inputs, '
        f'outputs) or a built Sequential), got {type(model).__name__}')
  if len(model.inputs) != 1 or len(model.outputs) != 1:
    raise errors.ConfigError(
        f'from_keras needs one input and one output; {model.name!r} has '
        f'{len(model.inputs)} inputs and {len(model.outputs)} outputs')
  layer = _find_layer(model, feature_layer)
  if isinstance(layer, tf.keras.layers.InputLayer):
    raise errors.ConfigError(
        f'feature_layer {layer.name!r} is the input; split after it')
  chain, feature = _head_chain(model, layer)
  shape = getattr(feature, 'shape', None)
  if shape is None or shape.rank != 2 or shape[-1] is None:
    raise errors.ConfigError(
        f'feature_layer {layer.name!r} must output one [batch, d] tensor, '
        f'got {shape}; split at a pooling or Flatten layer')
  chain = _logits_chain(model, chain)
  if not chain:
    raise errors.ConfigError(
        f'feature_layer {layer.name!r} leaves no head: it gives the '
        "model's output")
  feature_in = tf.keras.Input((int(shape[-1]),), name='features')
  logits = feature_in
  for head_layer in chain:
    logits = head_layer(logits)
  head = tf.keras.Model(feature_in, logits, name=f'{model.name}_head')
  out_shape = tuple(head.output_shape)
  if (len(out_shape) != 2 or out_shape[-1] is None or
      (num_classes is not None and out_shape[-1] != num_classes)):
    want = f'[batch, {num_classes}]' if num_classes else '[batch, classes]'
    raise errors.ConfigError(
        f'the head after {layer.name!r} gives {out_shape}, not {want} '
        'logits')
  features = tf.keras.Model(model.inputs[0], feature,
                            name=f'{model.name}_features')
  images = tf.keras.Input(model.inputs[0].shape[1:],
                          dtype=model.inputs[0].dtype, name='images')
  whole = tf.keras.Model(images, head(features(images)), name=model.name)
  return base.Classifier(whole, features, head, int(feature.shape[-1]))
