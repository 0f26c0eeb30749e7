"""FedAvg's process: TFF signatures and golden numbers.

Two toy clients with a bias-free linear softmax model; each does one
full-batch step, so the expected new global weights follow from a numpy
reference: w0 + sum_k n_k * delta_k / sum_k n_k. FedProx's tests
(tests/methods/fedprox/test_fedprox.py) use the same toy.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.federated import client_data
from tff_kd.federated import learning
from tff_kd.methods import registry
from tff_kd.methods.fedavg import fedavg_tff as fedavg

W0 = np.array([[0.2, -0.1], [0.0, 0.3]], np.float32)
X = np.array([[1.0, 2.0], [0.5, -1.0], [2.0, 0.0], [-1.0, 1.0]], np.float32)
Y = np.array([0, 1, 1, 0], np.int32)
PARTS = [np.array([0]), np.array([1, 2, 3])]


def _model_fn() -> tf.keras.Model:
  inputs = tf.keras.Input((2,))
  return tf.keras.Model(inputs, tf.keras.layers.Dense(
      2, use_bias=False, kernel_initializer='zeros')(inputs))


def _client_delta(idx, lr, mu=0.0, steps=1):
  w = W0.astype(np.float64)
  x, y = X[idx], Y[idx]
  for _ in range(steps):
    logits = x @ w
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    w = w - lr * (x.T @ (p - np.eye(2)[y]) / len(y) + mu * (w - W0))
  return w - W0


@pytest.fixture(scope='module')
def data(tmp_path_factory):
  return client_data.FileClientData.create(
      str(tmp_path_factory.mktemp('clients')), X, Y, PARTS)


def _run_round(process, data, steps=1):
  process = tff.simulation.compose_dataset_computation_with_learning_process(
      data.dataset_computation(client_data.LocalWork('epochs', steps, 32)),
      process)
  state = process.initialize()
  state = process.set_model_weights(
      state, tff.learning.models.ModelWeights(trainable=[W0],
                                              non_trainable=[]))
  output = process.next(state, data.keys([0, 1], seed=0, round_num=0))
  return process, output


def _training(learning_rate_decay: float = 1.0) -> learning.Training:
  return learning.Training(
      client_optimizer=tff.learning.optimizers.build_sgdm(1.0),
      server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
      learning_rate=0.1, learning_rate_decay=learning_rate_decay)


def test_fedavg_round_is_example_weighted_mean(data):
  process = fedavg.build_fedavg_process(
      _model_fn, data.element_spec, training=_training())
  assert isinstance(process, tff.learning.templates.LearningProcess)
  process, output = _run_round(process, data)
  expected = W0 + (1 * _client_delta(PARTS[0], 0.1) +
                   3 * _client_delta(PARTS[1], 0.1)) / 4
  new = process.get_model_weights(output.state).trainable[0]
  np.testing.assert_allclose(new, expected, rtol=1e-5, atol=1e-6)
  cw = output.metrics['client_work']['train']
  assert cw['num_examples'] == 4.0
  assert cw['num_clients'] == 2.0
  # 4 float32 weights broadcast to each of 2 clients; + the weight going up.
  assert cw['bytes_down'] == 2 * 4 * 4
  assert cw['bytes_up'] == 2 * (4 * 4 + 4)


def test_learning_rate_schedule_decays_per_round(data):
  process = fedavg.build_fedavg_process(
      _model_fn, data.element_spec,
      training=_training(learning_rate_decay=0.5))
  process = tff.simulation.compose_dataset_computation_with_learning_process(
      data.dataset_computation(client_data.LocalWork('steps', 1, 4)), process)
  state = process.initialize()
  rates = []
  for r in range(3):
    out = process.next(state, data.keys([0, 1], seed=0, round_num=r))
    state = out.state
    rates.append(out.metrics['client_work']['train']['learning_rate'])
  np.testing.assert_allclose(rates, [0.1, 0.05, 0.025], rtol=1e-6)


def test_set_and_get_model_weights_round_trip(data):
  process = fedavg.build_fedavg_process(
      _model_fn, data.element_spec, training=_training())
  state = process.initialize()
  new = tff.learning.models.ModelWeights(trainable=[W0 * 3],
                                         non_trainable=[])
  got = process.get_model_weights(process.set_model_weights(state, new))
  np.testing.assert_array_equal(got.trainable[0], W0 * 3)


def test_registry_lists_methods_and_rejects_unknown():
  assert {'fedavg', 'fedprox'} <= set(registry.METHODS)
  with pytest.raises(errors.ConfigError, match="'fedfoo' is unknown"):
    registry.get_method('fedfoo')
