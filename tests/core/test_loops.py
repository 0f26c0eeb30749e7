"""The AutoGraph-free loops give what the Python loop would, in a graph."""

import numpy as np
import tensorflow as tf

from tff_kd.core import loops


def _batches(n):
  return tf.data.Dataset.from_tensor_slices(
      np.arange(n, dtype=np.float32)).batch(3)


def test_fold_batches_matches_the_python_loop_and_runs_side_effects():
  variable = tf.Variable(0.0)

  @tf.function(autograph=False)
  def total(dataset):
    def step(state, batch):
      count, sums = state
      variable.assign_add(tf.reduce_max(batch))  # Ordered, every step.
      return count + 1, sums + tf.reduce_sum(batch)
    return loops.fold_batches(dataset, step, (tf.constant(0), tf.constant(0.)))

  count, sums = total(_batches(10))
  assert int(count) == 4 and float(sums) == 45.0
  assert float(variable) == 2 + 5 + 8 + 9
  count, sums = total(_batches(10).take(0))  # Empty: the initial state.
  assert int(count) == 0 and float(sums) == 0.0
  assert total.experimental_get_tracing_count() == 1


def test_fold_range_passes_each_index_once():
  @tf.function(autograph=False)
  def squares(n):
    return loops.fold_range(
        n, lambda acc, i: acc + tf.cast(i * i, tf.float32), tf.constant(0.))

  assert float(squares(tf.constant(5))) == 0 + 1 + 4 + 9 + 16
  assert float(squares(tf.constant(0))) == 0.0
  assert float(loops.fold_range(3, lambda acc, i: acc + 1, tf.constant(0))) == 3
