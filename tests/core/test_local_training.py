"""Golden numbers for local (proximal) SGD against a numpy reference."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import local_training


def _linear_model() -> tf.keras.Model:
  inputs = tf.keras.Input((2,))
  return tf.keras.Model(
      inputs, tf.keras.layers.Dense(2, use_bias=False,
                                    kernel_initializer='zeros')(inputs))


def _np_ce_grad(w, x, y):
  logits = x @ w
  p = np.exp(logits - logits.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  onehot = np.eye(w.shape[1])[y]
  loss = -np.log(p[np.arange(len(y)), y]).sum()
  return x.T @ (p - onehot) / len(y), loss


def _dataset(x, y, steps):
  ds = tf.data.Dataset.from_tensor_slices({'x': x, 'y': y}).batch(len(y))
  return ds.repeat(steps)


def test_two_proximal_sgd_steps_match_numpy():
  x = np.array([[1.0, 2.0], [0.5, -1.0]], np.float32)
  y = np.array([0, 1], np.int32)
  lr, mu = 0.1, 0.5
  w0 = np.array([[0.2, -0.1], [0.0, 0.3]], np.float32)
  model = _linear_model()
  init = tff.learning.models.ModelWeights(trainable=[w0], non_trainable=[])
  result = local_training.train_locally(
      model, tff.learning.optimizers.build_sgdm(1.0), init,
      _dataset(x, y, 2), tf.constant(lr), proximal_strength=mu)

  w, loss_sum = w0.astype(np.float64), 0.0
  for _ in range(2):
    g, loss = _np_ce_grad(w, x, y)
    loss_sum += loss
    w = w - lr * (g + mu * (w - w0))
  np.testing.assert_allclose(result.weights_delta.trainable[0], w - w0,
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(result.loss_sum), loss_sum, rtol=1e-5)
  assert float(result.num_examples) == 4.0
  assert int(result.num_steps) == 2


def test_without_proximal_term_first_step_is_plain_sgd():
  x = np.array([[1.0, 2.0]], np.float32)
  y = np.array([0], np.int32)
  model = _linear_model()
  init = tff.learning.models.ModelWeights(
      trainable=[np.zeros((2, 2), np.float32)], non_trainable=[])
  result = local_training.train_locally(
      model, tff.learning.optimizers.build_sgdm(1.0), init,
      _dataset(x, y, 1), tf.constant(0.1))
  # Zero weights give p = (0.5, 0.5): grad = x^T (p - onehot).
  expected = -0.1 * np.array([[-0.5, 0.5], [-1.0, 1.0]])
  np.testing.assert_allclose(result.weights_delta.trainable[0], expected,
                             rtol=1e-6)
  np.testing.assert_allclose(float(result.loss_sum), np.log(2.0), rtol=1e-6)


def test_batchnorm_statistics_are_returned_as_values():
  inputs = tf.keras.Input((2,))
  h = tf.keras.layers.BatchNormalization(momentum=0.0)(inputs)
  model = tf.keras.Model(inputs, tf.keras.layers.Dense(2)(h))
  init = tff.learning.models.ModelWeights(
      trainable=[v.numpy() for v in model.trainable_weights],
      non_trainable=[v.numpy() for v in model.non_trainable_weights])
  x = np.array([[1.0, 3.0], [3.0, 5.0]], np.float32)
  result = local_training.train_locally(
      model, tff.learning.optimizers.build_sgdm(1.0), init,
      _dataset(x, np.array([0, 1], np.int32), 1), tf.constant(0.0))
  moving_mean, moving_var = result.weights_delta.non_trainable
  # momentum 0: the moving statistics are the batch's.
  np.testing.assert_allclose(moving_mean, [2.0, 4.0], rtol=1e-6)
  np.testing.assert_allclose(moving_var, [1.0, 1.0], rtol=1e-5)
  # lr 0: trainable delta is exactly zero.
  for d in result.weights_delta.trainable:
    np.testing.assert_array_equal(d, np.zeros_like(d))


def test_structure_of_builds_once_per_function_in_its_own_graph():
  calls = []

  def build():
    calls.append(1)
    return _linear_model()

  model = local_training.structure_of(build)
  assert local_training.structure_of(build) is model and len(calls) == 1
  assert model.trainable_weights[0].graph is not tf.compat.v1.get_default_graph()
  assert model.output_shape == (None, 2)
  # Another function (even one building the same model) builds again.
  assert local_training.structure_of(lambda: build()) is not model
  assert len(calls) == 2
