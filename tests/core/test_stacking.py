"""The stack of a round's client values and their FedAvg mean, eagerly.

`tff_kd.core.stacking` is shared by every KD method's aggregator and server
step; tests/methods/feddf/test_feddf.py checks the TFF aggregator built on it.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.core import stacking

ModelWeights = tff.learning.models.ModelWeights


def _spec(*shape, dtype=tf.float32):
  return tf.TensorSpec(shape, dtype)


def test_stack_accumulates_rows_in_order_and_merges():
  specs = dict(a=_spec(2), b=_spec(dtype=tf.int32))
  values = [dict(a=np.array([i, -i], np.float32), b=np.int32(10 + i))
            for i in range(1, 4)]
  sequential = stacking.empty_stack(specs, 4)
  for i, v in enumerate(values):
    sequential = stacking.stack_accumulate(sequential, v, float(i + 1))
  assert int(sequential.count) == 3
  np.testing.assert_array_equal(sequential.values['a'],
                                [[1, -1], [2, -2], [3, -3], [0, 0]])
  np.testing.assert_array_equal(sequential.values['b'], [11, 12, 13, 0])
  np.testing.assert_array_equal(sequential.weights, [1, 2, 3, 0])
  # Two partial stacks (as TFF's merge sees them) concatenate in order.
  first = stacking.stack_accumulate(stacking.empty_stack(specs, 4), values[0], 1.)
  second = stacking.empty_stack(specs, 4)
  for i, v in enumerate(values[1:], 2):
    second = stacking.stack_accumulate(second, v, float(i))
  merged = stacking.stack_merge(first, second)
  tf.nest.map_structure(np.testing.assert_array_equal, merged, sequential)


def test_slots_hold_the_stack_row_by_row():
  """`Slots` (the TFF aggregator's accumulator) give the `Stack`'s rows,
  weights and count, also when merged."""
  specs = dict(a=_spec(2), b=_spec(dtype=tf.int32))
  values = [dict(a=np.array([i, -i], np.float32), b=np.int32(10 + i))
            for i in range(1, 5)]
  weights = [1.0, 0.0, 3.0, 4.0]  # The 0-weight client takes no row.

  def fill(empty, accumulate, pairs):
    for v, w in pairs:
      empty = accumulate(empty, v, w)
    return empty

  pairs = list(zip(values, weights))
  stack = fill(stacking.empty_stack(specs, 5), stacking.stack_accumulate,
               pairs)
  slots = fill(stacking.empty_slots(specs, 5), stacking.slots_accumulate,
               pairs)
  assert len(slots.values) == 5
  tf.nest.map_structure(np.testing.assert_array_equal,
                        stacking.slots_to_stack(slots, specs), stack)
  tf.nest.map_structure(
      np.testing.assert_array_equal,
      stacking.slots_to_stack(stacking.stack_to_slots(stack), specs), stack)
  for split in range(len(pairs) + 1):
    merged = stacking.slots_merge(
        fill(stacking.empty_slots(specs, 5), stacking.slots_accumulate,
             pairs[:split]),
        fill(stacking.empty_slots(specs, 5), stacking.slots_accumulate,
             pairs[split:]))
    tf.nest.map_structure(np.testing.assert_array_equal,
                          stacking.slots_to_stack(merged, specs), stack)
  full = stacking.empty_slots(_spec(1), 1)
  full = stacking.slots_accumulate(full, np.ones([1], np.float32), 1.0)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match='more clients than the 1 teacher slots'):
    stacking.slots_accumulate(full, np.ones([1], np.float32), 1.0)


def test_stack_overflow_is_a_clear_error():
  stack = stacking.empty_stack(_spec(1), 1)
  stack = stacking.stack_accumulate(stack, np.ones([1], np.float32), 1.0)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match='more clients than the 1 teacher slots'):
    stacking.stack_accumulate(stack, np.ones([1], np.float32), 1.0)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match='more clients than the 1 teacher slots'):
    stacking.stack_merge(stack, stack)
  with pytest.raises(errors.ConfigError, match='>= 1 slot'):
    stacking.empty_stack(_spec(1), 0)


@pytest.mark.parametrize('weights,valid,expected', [
    ([1.0, 3.0, 5.0], [True, True, False], [0.25, 0.75, 0.0]),
    # All valid weights zero: uniform over the valid rows, never 0/0.
    ([0.0, 0.0, 5.0], [True, True, False], [0.5, 0.5, 0.0]),
    # No client of this prototype: all zero, no NaN.
    ([1.0, 2.0, 3.0], [False, False, False], [0.0, 0.0, 0.0]),
])
def test_example_weights(weights, valid, expected):
  alpha = stacking.example_weights(tf.constant(weights), tf.constant(valid))
  np.testing.assert_allclose(alpha, expected, atol=1e-7)


def test_average_update_keeps_statistics_without_clients():
  deltas = ModelWeights([np.array([[1.0], [3.0]], np.float32)],
                        [np.array([[10.0], [20.0]], np.float32)])
  fallback = [np.array([7.0], np.float32)]
  mean = stacking.average_update(deltas, tf.constant([0.25, 0.75]), fallback)
  np.testing.assert_allclose(mean.trainable[0], [2.5])
  np.testing.assert_allclose(mean.non_trainable[0], [17.5])
  none = stacking.average_update(deltas, tf.zeros([2]), fallback)
  np.testing.assert_allclose(none.trainable[0], [0.0])
  np.testing.assert_allclose(none.non_trainable[0], [7.0])


def test_server_update_is_fedavg_and_keeps_everything_without_clients():
  g = ModelWeights([tf.constant([1.0, 1.0])], [tf.constant([5.0])])
  deltas = ModelWeights([tf.constant([[2.0, 0.0], [0.0, 4.0]])],
                        [tf.constant([[10.0], [20.0]])])
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
  state = sgd.initialize((_spec(2),))
  alpha = stacking.example_weights(tf.constant([1.0, 3.0]),
                                   tf.constant([True, True]))
  _, new = stacking.server_update(sgd, state, g, deltas, alpha)
  np.testing.assert_allclose(new.trainable[0], [1.5, 4.0])
  np.testing.assert_allclose(new.non_trainable[0], [17.5])
  adam = tff.learning.optimizers.build_adam(learning_rate=0.1)
  adam_state = adam.initialize((_spec(2),))
  kept_state, kept = stacking.server_update(
      adam, adam_state, g, deltas, tf.zeros([2]))
  np.testing.assert_allclose(kept.trainable[0], [1.0, 1.0])
  np.testing.assert_allclose(kept.non_trainable[0], [5.0])
  for a, b in zip(tf.nest.flatten(kept_state), tf.nest.flatten(adam_state)):
    np.testing.assert_allclose(a, b)
