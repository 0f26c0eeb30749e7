"""The stacking aggregator gives the dense one's stack, value for value.

`tff_kd.federated.stacking.build_stacking_aggregator` holds the slots as
separate values (so TFF's C++ runtime does not keep K copies of a [M, ...]
accumulator, studies/speed/results/stack_memory.md); its result must be the
`Stack` of `build_dense_stacking_aggregator`, the one-accumulator
formulation it replaced: the same rows in client order, zero padding,
weights and count, under the local runtime; split over two workers (TFF's
mergeable context, which merges partial accumulators), the same rows and
weights up to the order of the workers' blocks.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import stacking as stacking_tf
from tff_kd.federated import stacking
from tff_kd.runtime import workers

_VALUE_TYPE = tff.types.to_type(collections.OrderedDict(
    a=tff.TensorType(np.float32, [2, 3]),
    b=(tff.TensorType(np.int32, []), tff.TensorType(np.float32, [4]))))


def _values(count: int) -> list[collections.OrderedDict]:
  rng = np.random.default_rng(count)
  return [collections.OrderedDict(
      a=rng.standard_normal([2, 3]).astype(np.float32),
      b=(np.int32(10 + i), rng.standard_normal(4).astype(np.float32)))
          for i in range(count)]


def _expected(values, weights, num_slots: int):
  """The stack by hand: taken clients (weight > 0) in order, zero rows."""
  taken = [(v, w) for v, w in zip(values, weights) if w > 0]
  rows = [v for v, _ in taken] + [
      tf.nest.map_structure(np.zeros_like, values[0])] * (
          num_slots - len(taken))
  return stacking_tf.Stack(
      tf.nest.map_structure(lambda *r: np.stack(r), *rows),
      np.array([w for _, w in taken] + [0.0] * (num_slots - len(taken)),
               np.float32),
      np.int32(len(taken)))


def _assert_same(actual, expected) -> None:
  tf.nest.map_structure(np.testing.assert_array_equal, actual, expected)


def _next(process, values, weights):
  return process.next(process.initialize(), values, weights)


# (slots, client weights): padding, a client of weight 0 (no slot), every
# slot full, no client taken, one slot.
_CASES = [(4, [1.0, 0.0, 3.0]), (3, [2.0, 1.0, 5.0]), (2, [0.0, 0.0]),
          (1, [4.0])]


@pytest.mark.parametrize('num_slots,weights', _CASES)
def test_slots_give_the_dense_stack(num_slots, weights):
  values = _values(len(weights))
  slots = stacking.build_stacking_aggregator(_VALUE_TYPE, num_slots)
  dense = stacking.build_dense_stacking_aggregator(_VALUE_TYPE, num_slots)
  assert slots.next.type_signature == dense.next.type_signature
  out = _next(slots, values, weights)
  reference = _next(dense, values, weights)
  _assert_same(out.result, reference.result)
  _assert_same(out.result, _expected(values, weights, num_slots))
  assert out.measurements == reference.measurements == sum(
      w > 0 for w in weights)


def test_more_clients_than_slots_is_a_clear_error():
  slots = stacking.build_stacking_aggregator(_VALUE_TYPE, 2)
  with pytest.raises(Exception, match='more clients than the 2 teacher'):
    _next(slots, _values(3), [1.0, 2.0, 3.0])
  # Clients of weight 0 take no slot, so they never overflow it.
  out = _next(slots, _values(3), [1.0, 0.0, 3.0])
  assert int(out.result.count) == 2


@pytest.fixture
def two_workers():
  started = workers.start_local_workers(2)
  yield [address for address, _ in started]
  workers.stop_workers(started)


def _by_client(stack) -> tuple:
  """The stack's filled rows sorted by client (`b[0]` is 10 + its index),
  each with its weight, and its padding rows."""
  count = int(stack.count)
  order = np.argsort(np.asarray(stack.values['b'][0])[:count], kind='stable')
  rows = tf.nest.map_structure(lambda v: np.asarray(v)[:count][order],
                               stack.values)
  padding = tf.nest.map_structure(lambda v: np.asarray(v)[count:],
                                  stack.values)
  weights = np.asarray(stack.weights)
  return rows, weights[:count][order], padding, weights[count:]


def test_two_workers_merge_to_the_same_stack(two_workers):
  """Each worker stacks its share of the clients, and TFF merges the
  partial accumulators (`tff_kd.core.stacking.slots_merge`).

  TFF's mergeable context merges them in the order the workers finish
  (`asyncio.wait(..., FIRST_COMPLETED)` in its
  `_run_in_async_context_pool`), so the filled rows come as the workers'
  blocks in either order: the test compares them sorted by client. No
  method reads the row order (the teachers' ensemble and mean are sums;
  the client store scatters rows by client index).
  """
  weights = [1.0, 0.0, 3.0, 2.0, 5.0]
  values = _values(len(weights))
  slots = stacking.build_stacking_aggregator(_VALUE_TYPE, 6)
  with tff.framework.get_context_stack().install(
      workers.remote_context(two_workers, timeout_s=30)):
    out = _next(slots, values, weights)
  expected = _expected(values, weights, 6)
  assert int(out.result.count) == int(expected.count) == 4
  for actual_part, expected_part in zip(_by_client(out.result),
                                        _by_client(expected)):
    _assert_same(actual_part, expected_part)


def _groups(values, weights, group: int):
  """The clients as `GroupRows` of `group` each, the last one padded with
  zero rows of weight 0 (what `execution.train_rows` sends)."""
  padded = -len(values) % group
  values = values + [tf.nest.map_structure(np.zeros_like, values[0])] * padded
  weights = list(weights) + [0.0] * padded
  return [stacking_tf.GroupRows(
      tf.nest.map_structure(lambda *r: np.stack(r), *values[i:i + group]),
      np.array(weights[i:i + group], np.float32))
          for i in range(0, len(values), group)]


def _group_process(num_slots: int, group: int):
  row_type = tff.types.to_type(collections.OrderedDict(
      a=tff.TensorType(np.float32, [group, 2, 3]),
      b=(tff.TensorType(np.int32, [group]),
         tff.TensorType(np.float32, [group, 4]))))
  group_type = tff.types.StructWithPythonType(
      [('values', row_type), ('weights', tff.TensorType(np.float32, [group]))],
      stacking_tf.GroupRows)
  return stacking.build_stacking_aggregator(group_type, num_slots, group)


# (slots, group, client weights): a padded last group, a zero-weight client
# inside a group, a group with no client taken, every slot full, G = 1.
_GROUP_CASES = [(5, 2, [1.0, 0.0, 3.0, 2.0, 5.0]),
                (6, 3, [0.0, 0.0, 0.0, 2.0, 1.0]),
                (4, 2, [1.0, 2.0, 3.0, 4.0]),
                (3, 1, [2.0, 0.0, 1.0])]


@pytest.mark.parametrize('num_slots,group,weights', _GROUP_CASES)
def test_groups_of_rows_give_the_stack_of_their_clients(num_slots, group,
                                                         weights):
  """G clients' rows per TFF client: the stack that one client per TFF
  client gives, so a method's server step is the same."""
  values = _values(len(weights))
  out = _next(_group_process(num_slots, group),
              _groups(values, weights, group), [1.0] * -(-len(weights) //
                                                         group))
  _assert_same(out.result, _expected(values, weights, num_slots))
  assert out.measurements == sum(w > 0 for w in weights)


def test_groups_of_more_clients_than_slots_is_a_clear_error():
  process = _group_process(3, 2)
  with pytest.raises(Exception, match='more clients than the 3 teacher'):
    _next(process, _groups(_values(4), [1.0] * 4, 2), [1.0, 1.0])


def test_two_workers_merge_groups_to_the_same_stack(two_workers):
  """Grouped rows split over two workers (`slots_merge_rows`)."""
  weights = [1.0, 0.0, 3.0, 2.0, 5.0, 4.0, 0.0, 6.0]
  values = _values(len(weights))
  with tff.framework.get_context_stack().install(
      workers.remote_context(two_workers, timeout_s=30)):
    out = _next(_group_process(8, 2), _groups(values, weights, 2),
                [1.0] * 4)
  expected = _expected(values, weights, 8)
  assert int(out.result.count) == int(expected.count) == 6
  for actual_part, expected_part in zip(_by_client(out.result),
                                        _by_client(expected)):
    _assert_same(actual_part, expected_part)
