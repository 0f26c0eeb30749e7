"""`fused.StackedModel.infer_shared`: G models on one batch that all read.

It must compute what the stacked forward pass computes with the batch
copied to every model (`StackedModel.__call__(..., training=False)`, itself
pinned to Keras per client in `test_fused.py`), and what each model computes
alone in Keras: the logits, and their gradient with respect to the batch
(FedFTG's generator steps backpropagate to the images through the
teachers, `fedftg_tf.StackedTeachers`). Each case stacks G models with
their own weights and, for BatchNorm, their own moving statistics; the
models' outputs must differ from each other, and swapping two models'
statistics must change them, so a pass that mixed up the models would
fail. One model with every layout the pass keeps apart (the input read
alike, channels side by side, per-model tensors) covers its branches.
"""

import numpy as np
import pytest
import tensorflow as tf

from tff_kd.core import fused
from tff_kd.core import local_training
from tff_kd.models import classifiers

_SHAPE = (8, 8, 1)
_CLASSES = 4
_MODELS = 3
_BATCH = 5
_ATOL = 1e-5


def _cnn(norm):
  return classifiers.build_classifier(
      'cnn', input_shape=_SHAPE, num_classes=_CLASSES, norm=norm,
      seed=3).model


def _branchy_model():
  """BatchNorm on the input (read alike by every model); a convolution with
  bias; pooling, an elementwise activation and an `Add` of two
  convolutional branches; a softmax over channels (run per model); global
  pooling to rank 2 and BatchNorm there (Keras' unfused kernel); a dense
  layer on the flattened input joined to the rest."""
  inputs = tf.keras.Input(_SHAPE)
  h = tf.keras.layers.BatchNormalization()(inputs)
  h = tf.keras.layers.Conv2D(4, 3, padding='same')(h)
  h = tf.keras.layers.MaxPooling2D()(h)
  a = tf.keras.layers.Conv2D(4, 1, use_bias=False)(h)
  a = tf.keras.layers.BatchNormalization(center=False)(a)
  b = tf.keras.layers.Activation('tanh')(h)
  h = tf.keras.layers.Add()([a, b])
  h = tf.keras.layers.Activation('softmax')(h)
  h = tf.keras.layers.GlobalAveragePooling2D()(h)
  h = tf.keras.layers.BatchNormalization(scale=False)(h)
  side = tf.keras.layers.Dense(3, activation='relu')(
      tf.keras.layers.Flatten()(inputs))
  h = tf.keras.layers.Concatenate()([h, side])
  return tf.keras.Model(inputs, tf.keras.layers.Dense(_CLASSES)(h))


def _stacked_weights(model, seed=0):
  """G models' (trainable, non-trainable) weights, [G, ...] each."""
  rng = np.random.default_rng(seed)
  variables = local_training.model_weights(model)
  trainable = [
      (v.numpy()[np.newaxis] + 0.5 * (np.abs(v.numpy()).mean() + 0.1) *
       rng.normal(size=(_MODELS, *v.shape))).astype(np.float32)
      for v in variables.trainable]
  non_trainable = [
      (rng.uniform(0.3, 3.0, size=(_MODELS, *v.shape)) if 'variance' in v.name
       else rng.normal(scale=0.5, size=(_MODELS, *v.shape))).astype(np.float32)
      for v in variables.non_trainable]
  return trainable, non_trainable


def _batch(seed=1):
  rng = np.random.default_rng(seed)
  return tf.constant(rng.normal(size=(_BATCH, *_SHAPE)).astype(np.float32))


def _pass(model, trainable, non_trainable, x, copied=False):
  """(logits [G, B, C], d sum(log_softmax[..., 0]) / dx): `infer_shared`,
  or `StackedModel.__call__` on the batch copied G times (`copied`)."""
  stacked = fused.StackedModel(model)

  def logits(x):
    if not copied:
      return stacked.infer_shared(trainable, non_trainable, x)
    xs = tf.broadcast_to(x[tf.newaxis], [_MODELS, *x.shape])
    return stacked(trainable, non_trainable, xs,
                   tf.ones([_MODELS, x.shape[0]]), training=False)[0]

  @tf.function
  def run(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      out = logits(x)
      loss = tf.reduce_sum(tf.nn.log_softmax(out)[..., 0])
    return out, tape.gradient(loss, x)

  return [t.numpy() for t in run(x)]


def _keras(model, trainable, non_trainable, x):
  """Model g's logits, each model in Keras in turn (inference mode)."""
  variables = local_training.model_weights(model)
  out = []
  for g in range(_MODELS):
    for v, w in zip(variables.trainable, trainable):
      v.assign(w[g])
    for v, w in zip(variables.non_trainable, non_trainable):
      v.assign(w[g])
    out.append(model(x, training=False).numpy())
  return np.stack(out)


@pytest.mark.parametrize('build', [
    lambda: _cnn('batch'), lambda: _cnn('group'), _branchy_model],
                         ids=['cnn_batch', 'cnn_group', 'branchy'])
def test_infer_shared_is_the_copied_batch_and_each_keras_model(build):
  model = build()
  assert fused.unsupported(model) is None
  trainable, non_trainable = _stacked_weights(model)
  x = _batch()
  logits, grad = _pass(model, trainable, non_trainable, x)
  copied_logits, copied_grad = _pass(model, trainable, non_trainable, x,
                                     copied=True)
  np.testing.assert_allclose(logits, copied_logits, rtol=0, atol=_ATOL)
  np.testing.assert_allclose(grad, copied_grad, rtol=1e-4, atol=_ATOL)
  np.testing.assert_allclose(logits, _keras(model, trainable, non_trainable,
                                            x), rtol=0, atol=_ATOL)
  assert np.abs(grad).max() > 1e-3
  for a in range(_MODELS):
    for b in range(a + 1, _MODELS):
      assert np.abs(logits[a] - logits[b]).max() > 1e-2, (a, b)


def test_each_model_reads_its_own_batch_norm_statistics():
  model = _cnn('batch')
  trainable, non_trainable = _stacked_weights(model)
  assert non_trainable, 'the CNN keeps moving statistics'
  x = _batch()
  logits, _ = _pass(model, trainable, non_trainable, x)
  swapped = [n[[1, 0, 2]] for n in non_trainable]
  logits_swapped, _ = _pass(model, trainable, swapped, x)
  np.testing.assert_allclose(logits_swapped[2], logits[2], rtol=0,
                             atol=_ATOL)
  for g in (0, 1):
    assert np.abs(logits_swapped[g] - logits[g]).max() > 1e-3, g
