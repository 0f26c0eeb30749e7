"""Fused clients: several clients' local training as one batched computation.

FedAvg's clients (McMahan et al., AISTATS 2017, Algorithm 1, ClientUpdate)
and FedProx's (Li et al., MLSys 2020, eq. 2) are independent runs of local
SGD from the same broadcast weights. Run one after another, a small client's
fixed costs (its `tf.data` pipeline, its training loop's set-up, a few
milliseconds each) outweigh its two or three steps: at K = 100 clients of 2
steps a FedAvg round cost 2.2x K = 10 clients of 20 steps on the same
examples (studies/speed/results/client_cost.md). `train_fused` runs G clients
in lockstep as one computation instead:

* the weights are stacked, [G, ...] per variable, and so is the optimiser
  state (the `tff.learning.optimizers` optimisers are elementwise, so one
  `next` updates every client by its own gradient);
* every step gathers one batch of each client, [G, B, ...], from the G
  clients' arrays (no `tf.data`), and `StackedModel` runs the Keras model on
  it with each client's own weights (a grouped convolution, a batched
  matmul, per-client BatchNorm statistics);
* the loss is the sum over clients of each client's mean batch loss (plus
  its proximal term, or a method's own `Term`, e.g. FedGen's generator
  regulariser), so each client's slice of the gradient is exactly its own
  gradient: the clients do not interact;
* clients with fewer steps (`local.unit='epochs'`, unequal data) are masked:
  padded examples have weight 0 in the loss and in BatchNorm's statistics,
  and a client's weights stop changing after its last step.

Each client's batch order is drawn by `fused_schedule` (stateless, from the
client's key), not by the unfused path's `tf.data` shuffle, so a fused run is
a different (equally distributed) draw of the same algorithm. Given the same
batches, a fused client computes what `local_training.train_locally`
computes, up to float round-off (`tests/core/test_fused.py`).

`StackedModel` runs functional Keras models (nested ones too) built from
`Conv2D`, `Dense`, `BatchNormalization` and `GroupNormalization` plus any
layer without weights and without randomness (activations, pooling,
flattening, reshaping, merging, padding; such a layer is called on the G
clients' batches merged into one, so it must treat axis 0 as the batch, as
every Keras layer does). `unsupported` names the first layer it cannot run.

`StackedModel.infer_shared` is the inference-mode forward pass of the G
models on one batch that all of them read (a server's teachers on one
generated batch, `tff_kd.methods.fedftg.fedftg_tf.StackedTeachers`): the
batch is not copied G times, and convolutional feature maps stay in one
[B, ..., G*C] tensor (`_Merged`) from one grouped convolution to the next.
It is differentiable with respect to the batch.
"""

import collections
from typing import Callable, NamedTuple, Optional, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import loops

_RANDOM_LAYER = tf.keras.__internal__.layers.BaseRandomLayer


def _is_graph_model(layer: tf.keras.layers.Layer) -> bool:
  return isinstance(layer, tf.keras.Model) and getattr(
      layer, '_is_graph_network', False)


def unsupported(model: tf.keras.Model) -> Optional[str]:
  """Why `StackedModel` cannot run `model`, naming the layer; None if it can.

  Args:
    model: A Keras model.

  Returns:
    One line, or None.
  """
  if not _is_graph_model(model):
    return (f'model {model.name!r} is not a functional Keras model (a '
            'subclassed model has no layer graph to stack)')
  if len(model.inputs) != 1:
    return f'model {model.name!r} has {len(model.inputs)} inputs, not 1'
  for layer in model.layers:
    if isinstance(layer, tf.keras.layers.InputLayer):
      continue
    if _is_graph_model(layer):
      reason = unsupported(layer)
    else:
      reason = _unsupported_layer(layer)
    if reason:
      return reason
  return None


def _unsupported_layer(layer: tf.keras.layers.Layer) -> Optional[str]:
  name = f'{type(layer).__name__} layer {layer.name!r}'
  if type(layer) in _WEIGHTED:  # pylint: disable=unidiomatic-typecheck
    return _WEIGHTED[type(layer)][1](layer, name)
  if layer.weights:
    return f'{name} has weights and is not one of ' + ', '.join(
        t.__name__ for t in _WEIGHTED)
  if isinstance(layer, _RANDOM_LAYER) and getattr(layer, 'rate', 1.0) != 0:
    return f'{name} draws random numbers in training'
  return None


def _check_conv(layer: tf.keras.layers.Conv2D, name: str) -> Optional[str]:
  if layer.groups != 1 or layer.data_format != 'channels_last':
    return f'{name}: only groups=1 and channels_last'
  return None


def _check_batch_norm(layer: tf.keras.layers.BatchNormalization,
                      name: str) -> Optional[str]:
  if layer.renorm or layer.virtual_batch_size or layer.adjustment:
    return f'{name}: renorm, virtual_batch_size and adjustment are not run'
  if list(layer.axis) != [layer.input_spec.ndim - 1]:
    return f'{name}: only the last axis'
  return None


def _check_group_norm(layer: tf.keras.layers.GroupNormalization,
                      name: str) -> Optional[str]:
  if layer.axis not in (-1, layer.input_spec.ndim - 1):
    return f'{name}: only the last axis'
  return None


def _no_check(layer: tf.keras.layers.Layer, name: str) -> Optional[str]:
  del layer, name
  return None


class _Run:
  """One call of `StackedModel`: the stacked weights, read and updated."""

  def __init__(self, index: dict, trainable: Sequence[tf.Tensor],
               non_trainable: Sequence[tf.Tensor], mask: Optional[tf.Tensor],
               training: bool, num_clients: Optional[int] = None):
    self.index = index
    self.values = {'t': list(trainable), 'n': list(non_trainable)}
    self.mask = mask
    self.training = training
    self.num_clients = (int(mask.shape[0]) if num_clients is None else
                        num_clients)

  def read(self, variable: tf.Variable) -> tf.Tensor:
    kind, i = self.index[variable.ref()]
    return self.values[kind][i]

  def write(self, variable: tf.Variable, value: tf.Tensor) -> None:
    kind, i = self.index[variable.ref()]
    self.values[kind][i] = value

  def per_client(self, value: tf.Tensor, rank: int) -> tf.Tensor:
    """A [G, C] weight shaped to broadcast over [G, B, ..., C] (rank)."""
    return tf.reshape(value, [self.num_clients] + [1] * (rank - 2) +
                      [value.shape[-1]])


def _conv2d(layer: tf.keras.layers.Conv2D, x: tf.Tensor, run: _Run,
            training: bool) -> tf.Tensor:
  """Per-client kernels as one grouped convolution over [B, H, W, G*C]."""
  del training
  g = run.num_clients
  kernel = run.read(layer.kernel)  # [G, kh, kw, C, O]
  _, kh, kw, c, o = kernel.shape
  batch = tf.shape(x)[1]
  merged = tf.reshape(tf.transpose(x, [1, 2, 3, 0, 4]),
                      tf.concat([[batch], tf.shape(x)[2:4], [g * c]], 0))
  grouped = tf.reshape(tf.transpose(kernel, [1, 2, 3, 0, 4]),
                       [kh, kw, c, g * o])
  y = tf.nn.conv2d(merged, grouped, strides=layer.strides,
                   padding=layer.padding.upper(),
                   dilations=layer.dilation_rate)
  shape = tf.shape(y)
  y = tf.transpose(tf.reshape(y, tf.concat([shape[:3], [g, o]], 0)),
                   [3, 0, 1, 2, 4])
  if layer.use_bias:
    y += run.per_client(run.read(layer.bias), 5)
  return layer.activation(y)


def _dense(layer: tf.keras.layers.Dense, x: tf.Tensor, run: _Run,
           training: bool) -> tf.Tensor:
  """Per-client kernels as one batched matmul over [G, examples, I]."""
  del training
  kernel = run.read(layer.kernel)  # [G, I, O]
  shape = tf.shape(x)
  y = tf.matmul(tf.reshape(x, [run.num_clients, -1, kernel.shape[1]]),
                kernel)
  if layer.use_bias:
    y += run.read(layer.bias)[:, tf.newaxis, :]
  y = tf.reshape(y, tf.concat([shape[:-1], [kernel.shape[2]]], 0))
  return layer.activation(y)


def _batch_norm(layer: tf.keras.layers.BatchNormalization, x: tf.Tensor,
                run: _Run, training: bool) -> tf.Tensor:
  """BatchNorm with each client's own batch statistics and moving averages.

  In training mode (and a trainable layer, as Keras), each client's batch
  mean and (biased) variance over its real examples normalise its batch,
  and its moving statistics move towards them by `1 - momentum`, as Keras'
  update does (towards the unbiased variance where Keras' fused kernel
  runs the layer); in inference mode the moving statistics normalise.
  """
  rank = x.shape.rank
  mean_var = run.read(layer.moving_mean), run.read(layer.moving_variance)
  if training and layer.trainable:
    axes = list(range(1, rank - 1))
    mask = tf.reshape(run.mask, [run.num_clients, -1] + [1] * (rank - 2))
    count = tf.reduce_sum(mask * tf.ones_like(x[..., :1]), axes,
                          keepdims=True)
    mean = tf.math.divide_no_nan(tf.reduce_sum(mask * x, axes, keepdims=True),
                                 count)
    variance = tf.math.divide_no_nan(
        tf.reduce_sum(mask * tf.square(x - mean), axes, keepdims=True), count)
    decay = 1.0 - layer.momentum
    # Keras' fused kernel (4-D inputs) moves the moving variance towards the
    # unbiased batch variance, its other path towards the biased one.
    moving_variance = variance
    if layer.fused:
      moving_variance *= tf.math.divide_no_nan(count, count - 1.0)
    for variable, moving, batch in zip(
        (layer.moving_mean, layer.moving_variance), mean_var,
        (mean, moving_variance)):
      batch = tf.reshape(batch, moving.shape)
      run.write(variable, moving - (moving - batch) * decay)
  else:
    mean, variance = (run.per_client(v, rank) for v in mean_var)
  return _scale_and_offset(
      layer, (x - mean) * tf.math.rsqrt(variance + layer.epsilon), run)


def _group_norm(layer: tf.keras.layers.GroupNormalization, x: tf.Tensor,
                run: _Run, training: bool) -> tf.Tensor:
  """GroupNorm: per-example statistics, each client's own scale and offset."""
  del training
  rank = x.shape.rank
  channels = x.shape[-1]
  shape = tf.shape(x)
  grouped = tf.reshape(x, tf.concat(
      [shape[:-1], [layer.groups, channels // layer.groups]], 0))
  axes = list(range(2, rank - 1)) + [rank]
  mean, variance = tf.nn.moments(grouped, axes, keepdims=True)
  return _scale_and_offset(layer, tf.reshape(
      (grouped - mean) * tf.math.rsqrt(variance + layer.epsilon), shape), run)


def _scale_and_offset(layer: tf.keras.layers.Layer, y: tf.Tensor,
                      run: _Run) -> tf.Tensor:
  """A normalisation layer's per-client gamma and beta, where it has them."""
  if layer.scale:
    y *= run.per_client(run.read(layer.gamma), y.shape.rank)
  if layer.center:
    y += run.per_client(run.read(layer.beta), y.shape.rank)
  return y


# Layers with weights that `StackedModel` runs: (stacked call, check).
_WEIGHTED = {
    tf.keras.layers.Conv2D: (_conv2d, _check_conv),
    tf.keras.layers.Dense: (_dense, _no_check),
    tf.keras.layers.BatchNormalization: (_batch_norm, _check_batch_norm),
    tf.keras.layers.GroupNormalization: (_group_norm, _check_group_norm),
}


def _merged_call(layer: tf.keras.layers.Layer, args: list, kwargs: dict,
                 num_clients: int):
  """A weightless layer on the G clients' batches merged into one batch."""
  def merge(t):
    return tf.reshape(t, tf.concat([[-1], tf.shape(t)[2:]], 0))

  def split(t):
    return tf.reshape(t, tf.concat([[num_clients, -1], tf.shape(t)[1:]], 0))

  outputs = layer(*tf.nest.map_structure(merge, args), **kwargs)
  return tf.nest.map_structure(split, outputs)


def _walk(model: tf.keras.Model, x, call_layer: Callable):
  """Keras' own walk of a functional model's nodes
  (`Functional._run_internal_graph`), each layer call replaced by
  `call_layer(layer, args, kwargs)`."""
  usage = model._tensor_usage_count  # pylint: disable=protected-access
  tensors = {}
  x_id = str(id(model.inputs[0]))
  tensors[x_id] = [x] * usage[x_id]
  nodes_by_depth = model._nodes_by_depth  # pylint: disable=protected-access
  for depth in sorted(nodes_by_depth, reverse=True):
    for node in nodes_by_depth[depth]:
      if node.is_input or any(t not in tensors for t in node.flat_input_ids):
        continue
      args, kwargs = node.map_arguments(tensors)
      outputs = call_layer(node.layer, args, kwargs)
      for out_id, y in zip(node.flat_output_ids, tf.nest.flatten(outputs)):
        tensors[out_id] = [y] * usage[out_id]
  outputs = [tensors[str(id(t))].pop() for t in model.outputs]
  return tf.nest.pack_sequence_as(
      model._nested_outputs, outputs)  # pylint: disable=protected-access


class StackedModel:
  """A functional Keras model run on G clients at once, each its own weights.

  `__call__(trainable, non_trainable, x, mask)` is the model's forward pass
  with client g's weights on client g's batch: `trainable` and
  `non_trainable` are the model's `trainable_weights` and
  `non_trainable_weights`, each stacked to [G, ...]; `x` is [G, B, ...]. It
  returns the logits [G, B, ...] and the non-trainable weights after the
  pass (BatchNorm's moving statistics in training mode).
  """

  def __init__(self, model: tf.keras.Model):
    """Wraps `model` (its variables are only used as keys).

    Raises:
      ValueError: `unsupported(model)` names a layer it cannot run.
    """
    reason = unsupported(model)
    if reason:
      raise ValueError(f'fused clients: {reason}')
    self.model = model
    self._index = {}
    for kind, variables in (('t', model.trainable_weights),
                            ('n', model.non_trainable_weights)):
      for i, variable in enumerate(variables):
        self._index[variable.ref()] = (kind, i)

  def __call__(self, trainable: Sequence[tf.Tensor],
               non_trainable: Sequence[tf.Tensor], x: tf.Tensor,
               mask: tf.Tensor, *, training: bool = True
               ) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """Runs the model.

    Args:
      trainable: Stacked trainable weights, [G, ...] each, in Keras order.
      non_trainable: Stacked non-trainable weights.
      x: The clients' batches, [G, B, ...].
      mask: [G, B] float32, 1 for real examples and 0 for padding (left out
        of BatchNorm's statistics).
      training: Training mode (BatchNorm's batch statistics and updates).

    Returns:
      (outputs [G, B, ...], non-trainable weights after the pass).
    """
    run = _Run(self._index, trainable, non_trainable, mask, training)
    return self._run_model(self.model, x, run), run.values['n']

  def _run_model(self, model: tf.keras.Model, x: tf.Tensor,
                 run: _Run) -> tf.Tensor:
    return _walk(model, x,
                 lambda layer, args, kwargs: self._call_layer(
                     layer, args, kwargs, run))

  def _call_layer(self, layer: tf.keras.layers.Layer, args: list,
                  kwargs: dict, run: _Run):
    training = kwargs.pop('training', None)
    training = run.training if training is None else bool(training)
    if _is_graph_model(layer):
      saved, run.training = run.training, training
      try:
        return self._run_model(layer, args[0], run)
      finally:
        run.training = saved
    if type(layer) in _WEIGHTED:  # pylint: disable=unidiomatic-typecheck
      return _WEIGHTED[type(layer)][0](layer, args[0], run, training)
    if getattr(layer, '_expects_training_arg', False):
      kwargs['training'] = training
    return _merged_call(layer, args, kwargs, run.num_clients)

  def infer_shared(self, trainable: Sequence[tf.Tensor],
                   non_trainable: Sequence[tf.Tensor],
                   x: tf.Tensor) -> tf.Tensor:
    """The G models, in inference mode, on one batch that all of them read.

    Computes what `__call__(trainable, non_trainable, x_g, mask,
    training=False)` computes with `x_g` = `x` for every g (each model
    with its own weights and BatchNorm moving statistics), up to float
    round-off, in fewer operations:

    * a tensor every model sees alike (`_Shared`: the input, and any
      weightless layer's output on it) is kept once, [B, ...];
    * a convolution on it is one ordinary convolution with the G kernels
      side by side, [kh, kw, C, G*O]; on the G models' feature maps, one
      grouped convolution; both give a `_Merged` [B, ..., G*O] tensor
      (model g's channels g*O to (g+1)*O - 1), which BatchNorm and
      GroupNorm (per-channel weights), elementwise activations, pooling,
      padding and elementwise merging layers take as it is (BatchNorm with
      Keras' own kernel, `fused_batch_norm`, where Keras uses it);
    * every other layer gets the usual [G, B, ...] tensor.

    Args:
      trainable: Stacked trainable weights, [G, ...] each, in Keras order.
      non_trainable: Stacked non-trainable weights.
      x: The batch, [B, ...].

    Returns:
      The outputs, [G, B, ...] (a nest as the model's outputs).
    """
    weights = list(trainable) + list(non_trainable)
    if not weights:
      raise ValueError('infer_shared needs at least one weight to stack')
    run = _Run(self._index, trainable, non_trainable, None, False,
               num_clients=int(weights[0].shape[0]))
    outputs = self._infer_model(self.model, _Shared(x), run)
    return tf.nest.map_structure(lambda t: _stacked(t, run.num_clients),
                                 outputs)

  def _infer_model(self, model: tf.keras.Model, x, run: _Run):
    # The values are tensors (stacked) or `_Shared` / `_Merged` ones.
    return _walk(model, x,
                 lambda layer, args, kwargs: self._infer_layer(
                     layer, args, kwargs, run))

  def _infer_layer(self, layer: tf.keras.layers.Layer, args: list,
                   kwargs: dict, run: _Run):
    kwargs = dict(kwargs)
    kwargs.pop('training', None)
    g = run.num_clients
    if _is_graph_model(layer):
      return self._infer_model(layer, args[0], run)
    kind = type(layer)
    if kind in _WEIGHTED:
      x = args[0]
      if kind is tf.keras.layers.Conv2D:
        return _infer_conv2d(layer, x, run)
      if kind is tf.keras.layers.Dense and isinstance(x, _Shared):
        return _infer_dense_shared(layer, x.value, run)
      if kind is not tf.keras.layers.Dense:  # BatchNorm, GroupNorm
        return _infer_norm(layer, _merged(x, g), run)
      return _dense(layer, _stacked(x, g), run, False)
    flat = tf.nest.flatten((args, kwargs))
    inputs = [t for t in flat if _is_value(t)]
    if all(isinstance(t, _Shared) for t in inputs):
      layout, convert = _Shared, lambda t: t.value
    elif (_channelwise(layer) and
          any(isinstance(t, _Merged) for t in inputs) and
          all(_model_rank(t) >= 2 for t in inputs)):
      layout, convert = _Merged, lambda t: _merged(t, g).value
    else:
      layout, convert = None, lambda t: _stacked(t, g)
    args, kwargs = tf.nest.pack_sequence_as(
        (args, kwargs), [convert(t) if _is_value(t) else t for t in flat])
    if getattr(layer, '_expects_training_arg', False):
      kwargs['training'] = False
    if layout is None:
      return _merged_call(layer, args, kwargs, g)
    return tf.nest.map_structure(layout, layer(*args, **kwargs))


class _Shared:
  """`infer_shared`: one tensor [B, ...] that every model sees alike."""

  __slots__ = ('value',)

  def __init__(self, value: tf.Tensor):
    self.value = value


class _Merged:
  """`infer_shared`: G models' tensors as one [B, ..., G*C], model-major."""

  __slots__ = ('value',)

  def __init__(self, value: tf.Tensor):
    self.value = value


_LAYOUTS = (_Shared, _Merged)


def _is_value(t) -> bool:
  """Whether a layer argument is a model tensor, in any layout."""
  return isinstance(t, _LAYOUTS) or tf.is_tensor(t)


def _model_rank(t) -> int:
  """One model's rank of a value in any layout (with the batch axis)."""
  if isinstance(t, _LAYOUTS):
    return t.value.shape.rank
  return t.shape.rank - 1


def _stacked(t, num_clients: int) -> tf.Tensor:
  """Any layout as the usual stacked [G, B, ..., C]."""
  if isinstance(t, _Shared):
    v = t.value
    return tf.tile(v[tf.newaxis], [num_clients] + [1] * v.shape.rank)
  if isinstance(t, _Merged):
    v = t.value
    shape = tf.shape(v)
    channels = v.shape[-1] // num_clients
    # A 3-D transpose, [B*..., G, C] -> [G, B*..., C].
    v = tf.transpose(tf.reshape(v, [-1, num_clients, channels]), [1, 0, 2])
    return tf.reshape(v, tf.concat([[num_clients], shape[:-1], [channels]],
                                   0))
  return t


def _merged(t, num_clients: int) -> _Merged:
  """Any layout as `_Merged` [B, ..., G*C]."""
  if isinstance(t, _Merged):
    return t
  if isinstance(t, _Shared):
    v = t.value
    return _Merged(tf.tile(v, [1] * (v.shape.rank - 1) + [num_clients]))
  shape = tf.shape(t)  # [G, B, ..., C]
  channels = t.shape[-1]
  # A 3-D transpose, [G, B*..., C] -> [B*..., G, C].
  v = tf.transpose(tf.reshape(t, [num_clients, -1, channels]), [1, 0, 2])
  return _Merged(tf.reshape(v, tf.concat(
      [shape[1:-1], [num_clients * channels]], 0)))


def _flat(value: tf.Tensor) -> tf.Tensor:
  """A stacked [G, C] per-channel weight as [G*C] (model-major)."""
  return tf.reshape(value, [-1])


def _softmax_like(activation) -> bool:
  return getattr(activation, '__name__', '') in ('softmax', 'log_softmax')


def _infer_conv2d(layer: tf.keras.layers.Conv2D, x, run: _Run):
  """One convolution of the G kernels side by side, to `_Merged`.

  On a `_Shared` input an ordinary convolution [kh, kw, C, G*O]; on the
  models' own feature maps the grouped one (G groups of C channels).
  """
  g = run.num_clients
  kernel = run.read(layer.kernel)  # [G, kh, kw, C, O]
  _, kh, kw, c, o = kernel.shape
  kernel = tf.reshape(tf.transpose(kernel, [1, 2, 3, 0, 4]),
                      [kh, kw, c, g * o])
  value = x.value if isinstance(x, _Shared) else _merged(x, g).value
  y = tf.nn.conv2d(value, kernel, strides=layer.strides,
                   padding=layer.padding.upper(),
                   dilations=layer.dilation_rate)
  if layer.use_bias:
    y = tf.nn.bias_add(y, _flat(run.read(layer.bias)))
  if _softmax_like(layer.activation):
    return layer.activation(_stacked(_Merged(y), g))
  return _Merged(layer.activation(y))


def _infer_dense_shared(layer: tf.keras.layers.Dense, x: tf.Tensor,
                        run: _Run) -> tf.Tensor:
  """A dense layer on a `_Shared` [B, ..., I]: one matmul, [I, G*O]."""
  g = run.num_clients
  kernel = run.read(layer.kernel)  # [G, I, O]
  _, i, o = kernel.shape
  shape = tf.shape(x)
  y = tf.matmul(tf.reshape(x, [-1, i]),
                tf.reshape(tf.transpose(kernel, [1, 0, 2]), [i, g * o]))
  if layer.use_bias:
    y = tf.nn.bias_add(y, _flat(run.read(layer.bias)))
  y = tf.transpose(tf.reshape(y, [-1, g, o]), [1, 0, 2])
  y = tf.reshape(y, tf.concat([[g], shape[:-1], [o]], 0))
  return layer.activation(y)


def _infer_norm(layer: tf.keras.layers.Layer, x: _Merged,
                run: _Run) -> _Merged:
  """Inference BatchNorm or GroupNorm on `_Merged` [B, ..., G*C]."""
  v = x.value
  channels = v.shape[-1]
  ones = tf.ones([channels], v.dtype)
  gamma = _flat(run.read(layer.gamma)) if layer.scale else ones
  beta = _flat(run.read(layer.beta)) if layer.center else 0.0 * ones
  if isinstance(layer, tf.keras.layers.BatchNormalization):
    mean = _flat(run.read(layer.moving_mean))
    variance = _flat(run.read(layer.moving_variance))
    if layer.fused and v.shape.rank == 4:
      # Keras' own inference kernel for 4-D inputs.
      y, _, _ = tf.compat.v1.nn.fused_batch_norm(
          v, gamma, beta, mean=mean, variance=variance,
          epsilon=layer.epsilon, is_training=False)
      return _Merged(y)
    return _Merged(tf.nn.batch_normalization(v, mean, variance, beta, gamma,
                                             layer.epsilon))
  # GroupNorm: statistics per example and (model, group) over the other
  # axes, as Keras' (tf.nn.moments, then tf.nn.batch_normalization).
  rank = v.shape.rank
  shape = tf.shape(v)
  grouped = tf.reshape(v, tf.concat(
      [shape[:-1], [run.num_clients * layer.groups,
                    channels // (run.num_clients * layer.groups)]], 0))
  axes = list(range(1, rank - 1)) + [rank]
  mean, variance = tf.nn.moments(grouped, axes, keepdims=True)
  y = tf.reshape((grouped - mean) * tf.math.rsqrt(variance + layer.epsilon),
                 shape)
  return _Merged(y * gamma + beta)


# Weightless layers that act on each channel alone (or elementwise on
# several inputs of the same shape), so a `_Merged` tensor goes through
# them as it is (channels_last only).
_CHANNELWISE = (
    tf.keras.layers.ReLU, tf.keras.layers.LeakyReLU, tf.keras.layers.ELU,
    tf.keras.layers.ThresholdedReLU, tf.keras.layers.MaxPooling1D,
    tf.keras.layers.MaxPooling2D, tf.keras.layers.MaxPooling3D,
    tf.keras.layers.AveragePooling1D, tf.keras.layers.AveragePooling2D,
    tf.keras.layers.AveragePooling3D, tf.keras.layers.GlobalAveragePooling1D,
    tf.keras.layers.GlobalAveragePooling2D,
    tf.keras.layers.GlobalAveragePooling3D,
    tf.keras.layers.GlobalMaxPooling1D, tf.keras.layers.GlobalMaxPooling2D,
    tf.keras.layers.GlobalMaxPooling3D, tf.keras.layers.ZeroPadding1D,
    tf.keras.layers.ZeroPadding2D, tf.keras.layers.ZeroPadding3D,
    tf.keras.layers.Cropping1D, tf.keras.layers.Cropping2D,
    tf.keras.layers.Cropping3D, tf.keras.layers.UpSampling1D,
    tf.keras.layers.UpSampling2D, tf.keras.layers.UpSampling3D,
    tf.keras.layers.Add, tf.keras.layers.Subtract,
    tf.keras.layers.Multiply, tf.keras.layers.Average,
    tf.keras.layers.Maximum, tf.keras.layers.Minimum)


def _channelwise(layer: tf.keras.layers.Layer) -> bool:
  """Whether `layer` may run on `_Merged` tensors (`_CHANNELWISE`)."""
  kind = type(layer)
  if kind not in _CHANNELWISE and not (
      kind is tf.keras.layers.Activation and
      not _softmax_like(layer.activation)):
    return False
  return getattr(layer, 'data_format', 'channels_last') == 'channels_last'


class Schedule(NamedTuple):
  """The example order of G clients' lockstep local training.

  Attributes:
    indices: [S, G, B] int32 rows of the clients' concatenated arrays (the
      padding row, one past the last example, where `mask` is 0).
    mask: [S, G, B] float32, 1 for real examples.
  """

  indices: tf.Tensor
  mask: tf.Tensor


def client_order(num_examples: tf.Tensor, seed: tf.Tensor, *, unit: str,
                 amount: int, batch_size: int) -> tf.Tensor:
  """One client's batches of example indices, -1 padding a short batch.

  Every epoch is a fresh stateless permutation of the client's examples
  (from `seed`, [2] int64, and the epoch). `unit='epochs'`: `amount`
  passes of ceil(n / B) batches each, the last one short; `unit='steps'`:
  `amount` full batches of B, cycling through as many epochs as they need.
  No examples: no batches.

  Returns:
    [steps, B] int32.
  """
  n = tf.cast(num_examples, tf.int32)
  if unit == 'epochs':
    epochs = tf.constant(amount)
  else:
    epochs = (amount * batch_size + n - 1) // tf.maximum(n, 1)
  epochs = tf.where(n > 0, epochs, 0)
  keys = tf.random.stateless_uniform(tf.stack([epochs, n]), seed=seed)
  order = tf.argsort(keys, axis=1, stable=True)
  if unit == 'epochs':
    per_epoch = (n + batch_size - 1) // batch_size
    order = tf.pad(order, [[0, 0], [0, per_epoch * batch_size - n]],
                   constant_values=-1)
  else:
    order = tf.reshape(order, [-1])[:amount * batch_size]
  return tf.reshape(order, [-1, batch_size])


def fused_schedule(num_examples: tf.Tensor, seeds: tf.Tensor, *, unit: str,
                   amount: int, batch_size: int) -> Schedule:
  """The lockstep schedule of G clients whose arrays are concatenated.

  A graph loop over the clients (`client_order` each), so the graph's size
  does not grow with G.

  Args:
    num_examples: [G] int32, each client's number of examples, in the
      order of the concatenation.
    seeds: [G, 2] int64, each client's stateless seed.
    unit: 'steps' or 'epochs' (`tff_kd.federated.client_data.LocalWork`).
    amount: Steps or epochs.
    batch_size: B.

  Returns:
    A `Schedule` of S = the most steps any client takes.
  """
  num_examples = tf.cast(num_examples, tf.int32)
  per_epoch = (num_examples + batch_size - 1) // batch_size
  steps = tf.where(num_examples > 0,
                   amount * per_epoch if unit == 'epochs' else amount, 0)
  most = tf.reduce_max(steps)
  offsets = tf.cumsum(num_examples, exclusive=True)
  total = tf.reduce_sum(num_examples)

  def client(rows, g):
    order = client_order(num_examples[g], seeds[g], unit=unit,
                         amount=amount, batch_size=batch_size)
    order = tf.pad(order, [[0, most - tf.shape(order)[0]], [0, 0]],
                   constant_values=-1)
    return rows.write(g, tf.where(order >= 0, order + offsets[g], total))

  rows = loops.fold_range(
      tf.size(num_examples), client,
      tf.TensorArray(tf.int32, size=tf.size(num_examples),
                     element_shape=[None, batch_size]))
  indices = tf.transpose(rows.stack(), [1, 0, 2])
  indices.set_shape([None, num_examples.shape[0], batch_size])
  mask = tf.cast(indices < total, tf.float32)
  return Schedule(indices, mask)


class Term(NamedTuple):
  """A method's own term of each client's local loss, in lockstep.

  The lockstep form of `local_training.Regularizer`.

  Attributes:
    loss: `loss(trainable, logits, y, mask, step)` -> [G] float32, client
      g's extra loss at lockstep step `step` (the step index of every client
      that is still training): `trainable` the stacked weights, `logits`
      [G, B, ...] the model's training-mode logits on the batch, `y` [G, B]
      its labels, `mask` [G, B] 1 for a real example. Row g must depend on
      client g's weights only, so the clients stay independent.
    after: Ops the term's reads must follow (loading a broadcast model into
      its variables: a TFF computation's graph orders nothing by itself);
      the caller runs `train_fused` after them.
  """

  loss: Callable[[list, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor],
                 tf.Tensor]
  after: Sequence[tf.Operation] = ()


class FusedResult(NamedTuple):
  """G clients' local training (`local_training.LocalResult`, per client).

  Attributes:
    weights_delta: `ModelWeights` stacked [G, ...]: trainable
      `local - global`, non-trainable the final values.
    num_examples: [G] float32.
    loss_sum: [G] float32, the task loss summed over examples.
    num_steps: [G] int32.
  """

  weights_delta: tff.learning.models.ModelWeights
  num_examples: tf.Tensor
  loss_sum: tf.Tensor
  num_steps: tf.Tensor


def stack(weights: tff.learning.models.ModelWeights, num_clients: int
          ) -> tff.learning.models.ModelWeights:
  """The broadcast weights, repeated for every client ([G, ...])."""
  return tf.nest.map_structure(
      lambda t: tf.tile(t[tf.newaxis], [num_clients] + [1] * t.shape.rank),
      weights)


def select(active: tf.Tensor, new: tf.Tensor, old: tf.Tensor) -> tf.Tensor:
  """`new` for the selected clients ([G] bool), `old` for the rest."""
  return tf.where(tf.reshape(active, [-1] + [1] * (new.shape.rank - 1)),
                  new, old)


def train_fused(stacked: StackedModel,
                optimizer: tff.learning.optimizers.Optimizer,
                initial_weights: tff.learning.models.ModelWeights,
                x: tf.Tensor, y: tf.Tensor, schedule: Schedule,
                learning_rate: tf.Tensor, *,
                proximal_strength: float = 0.0,
                term: Optional[Term] = None) -> FusedResult:
  """G clients' local (proximal) training in lockstep (graph code).

  Client g takes, at step s, the examples `schedule.indices[s, g]` of
  `x`/`y` whose mask is 1, and does what `train_locally` does with that
  batch: one optimiser step on its mean cross-entropy (plus FedProx's
  `mu / 2 * ||w - w_global||^2`, plus `term`'s row g where `train_locally`
  has a regulariser), in training mode. A client with no real example at
  step s (its steps are over) keeps its weights.

  Args:
    stacked: The model.
    optimizer: An elementwise `tff.learning.optimizers` optimizer (all of
      TFF's are), with state fresh for this round.
    initial_weights: The broadcast `ModelWeights` (unstacked).
    x: The clients' examples, concatenated, plus one padding row of zeros
      at the end (the row `schedule` points padding to).
    y: Their int32 labels, likewise.
    schedule: `fused_schedule`'s.
    learning_rate: This round's client learning rate.
    proximal_strength: FedProx mu (0: FedAvg).
    term: A method's own term of the loss, or None (run this after its
      `after` ops).

  Returns:
    A `FusedResult`.
  """
  g = int(schedule.indices.shape[1])
  start = stack(initial_weights, g)
  specs = tuple(tf.TensorSpec(t.shape, t.dtype) for t in start.trainable)
  opt_state = optimizer.initialize(specs)
  hparams = optimizer.get_hparams(opt_state)
  hparams['learning_rate'] = tf.cast(learning_rate, tf.float32)
  opt_state = optimizer.set_hparams(opt_state, hparams)
  zeros = tf.zeros([g])

  def step(state, s):
    trainable, non_trainable, opt_state, examples, loss_sum, steps = state
    mask = schedule.mask[s]
    count = tf.reduce_sum(mask, axis=1)
    active = count > 0
    index = schedule.indices[s]
    labels = tf.gather(y, index)
    with tf.GradientTape() as tape:
      tape.watch(trainable)
      logits, new_non_trainable = stacked(
          trainable, non_trainable, tf.gather(x, index), mask)
      cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=labels, logits=logits)
      task = tf.reduce_sum(mask * cross_entropy, axis=1)
      loss = tf.reduce_sum(tf.math.divide_no_nan(task, count))
      if proximal_strength > 0:
        loss += 0.5 * proximal_strength * tf.add_n([
            tf.reduce_sum(tf.square(w - w0))
            for w, w0 in zip(trainable, start.trainable)])
      if term is not None:
        loss += tf.reduce_sum(term.loss(trainable, logits, labels, mask, s))
    grads = tape.gradient(loss, trainable)
    opt_state, updated = optimizer.next(opt_state, tuple(trainable),
                                        tuple(grads))
    trainable = [select(active, u, w) for u, w in zip(updated, trainable)]
    non_trainable = [select(active, u, w)
                     for u, w in zip(new_non_trainable, non_trainable)]
    return (trainable, non_trainable, opt_state, examples + count,
            loss_sum + tf.where(active, task, 0.0),
            steps + tf.cast(active, tf.int32))

  trainable, non_trainable, _, examples, loss_sum, steps = loops.fold_range(
      tf.shape(schedule.indices)[0], step,
      (list(start.trainable), list(start.non_trainable), opt_state, zeros,
       zeros, tf.zeros([g], tf.int32)))
  delta = tff.learning.models.ModelWeights(
      trainable=[w - w0 for w, w0 in zip(trainable, start.trainable)],
      non_trainable=non_trainable)
  return FusedResult(delta, examples, loss_sum, steps)


def merge_fused(result: FusedResult, present: tf.Tensor
                ) -> tuple[tf.Tensor, collections.OrderedDict]:
  """Screens each fused client as `screen_client` screens one.

  A client whose update or loss is not finite is excluded: weight 0, its
  loss, examples and steps left out, and counted in `excluded`.

  Args:
    result: `train_fused`'s.
    present: [G] bool, the real clients (not padding).

  Returns:
    (keep [G] bool, per-client float32 [G] `loss_sum`, `num_examples`,
    `num_steps` and `excluded` after screening).
  """
  finite = tf.math.is_finite(result.loss_sum)
  for t in tf.nest.flatten(result.weights_delta):
    finite = tf.logical_and(finite, tf.reduce_all(
        tf.math.is_finite(t), axis=list(range(1, t.shape.rank))))
  keep = tf.logical_and(finite, present)
  stats = collections.OrderedDict(
      loss_sum=tf.where(keep, result.loss_sum, 0.0),
      num_examples=tf.where(keep, result.num_examples, 0.0),
      num_steps=tf.where(keep, tf.cast(result.num_steps, tf.float32), 0.0),
      excluded=tf.cast(tf.logical_and(present, tf.logical_not(finite)),
                       tf.float32))
  return keep, stats
