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


def test_map_batches_concatenates_each_output_over_uneven_batches():
  x = tf.reshape(tf.range(14, dtype=tf.float64), [7, 2])
  calls = []

  def double(batch):
    calls.append(batch.shape)
    return 2 * batch

  out = loops.map_batches(double, x, 3)  # Eager: batches of 3, 3, 1.
  assert out.dtype == tf.float32
  np.testing.assert_array_equal(out, 2 * x.numpy())
  assert [s[0] for s in calls] == [3, 3, 1]

  @tf.function(autograph=False)
  def both(x, labels, batch_size):
    def heads(batch):
      images, y = batch
      return tf.reduce_sum(images, axis=1), tf.cast(y, tf.int64) * 10
    return loops.map_batches(heads, (x, labels), batch_size, num_outputs=2)

  sums, scaled = both(x, tf.range(7), tf.constant(2))
  np.testing.assert_array_equal(sums, x.numpy().sum(axis=1))
  np.testing.assert_array_equal(scaled, np.arange(7) * 10.0)
  assert sums.dtype == scaled.dtype == tf.float32


def test_map_batches_passes_none_entries_as_none():
  seen = []

  def first(batch):
    images, labels = batch
    seen.append(labels)
    return images[:, :1]

  x = tf.ones([5, 3])
  np.testing.assert_array_equal(loops.map_batches(first, (x, None), 2),
                                np.ones([5, 1]))
  assert seen and all(labels is None for labels in seen)
