"""Pure-TF stacking of a round's client values, and their weighted mean.

Every KD method here (FedDF, Lin et al., NeurIPS 2020; FedD3A; FedGen, Zhu
et al., ICML 2021; FedFTG, Zhang et al., CVPR 2022; DaFKD, Wang et al., CVPR
2023) needs each client's model at the server, not only their mean: the
clients are the teachers. Their values are stacked: each client's value is
written into row `count` of a fixed-size [M, ...] `Stack` (M = clients per
round). Rows past `count` stay zero and are masked out.

TFF's aggregation (`tff_kd.federated.stacking`) builds the stack in `Slots`,
M separate rows that each step passes on without copying
(`slots_accumulate` / `slots_merge` are its accumulate and merge functions,
`slots_to_stack` its report), because TFF's C++ runtime keeps every step's
accumulator until the round's aggregate is done: a [M, ...] accumulator
rewritten per client (`stack_accumulate` / `stack_merge`, the reference
formulation) would cost K x M x P values at once. A TFF client that runs
G clients sends their values as the rows of a `GroupRows`; its rows go into
one slot together (`slots_accumulate_rows` / `slots_merge_rows`), and the
report is the same `Stack`. All are plain functions here, so the same maths
runs eagerly in tests.

`example_weights` and `average_update` give the FedAvg mean of the stacked
updates (McMahan et al., AISTATS 2017), from which the methods start their
server step.
"""

from typing import NamedTuple, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.core import distillation

ModelWeights = tff.learning.models.ModelWeights

# Weights at or below this are treated as "no client".
_EPS = 1e-12


class Stack(NamedTuple):
  """This round's client values, one row each.

  Attributes:
    values: A structure whose leaves are [M, ...]: row k is the k-th client
      received (in arrival order); rows >= `count` are zero.
    weights: [M] float32 client weights (number of examples).
    count: int32 number of rows filled.
  """

  values: object
  weights: tf.Tensor
  count: tf.Tensor


def empty_stack(value_specs, num_slots: int) -> Stack:
  """A zero `Stack` with `num_slots` rows for values shaped like the specs."""
  if not isinstance(num_slots, (int, np.integer)) or num_slots < 1:
    raise errors.ConfigError(
        f'the teacher stack needs >= 1 slot, got {num_slots!r}')
  values = tf.nest.map_structure(
      lambda s: tf.zeros([num_slots, *s.shape], s.dtype), value_specs)
  return Stack(values, tf.zeros([num_slots], tf.float32),
               tf.constant(0, tf.int32))


def _num_slots(stack: Stack) -> int:
  return int(stack.weights.shape[0])


def _room_check(take: tf.Tensor, count: tf.Tensor, num_slots: int):
  """An assertion op: a client that takes a slot (`take`) finds one free."""
  return tf.debugging.Assert(
      tf.logical_or(tf.logical_not(take), count < num_slots),
      [f'more clients than the {num_slots} teacher slots this stacking '
       'process was built for (clients_per_round)'])


def stack_accumulate(stack: Stack, value, weight) -> Stack:
  """Writes one client's value and weight into row `stack.count`.

  A client of weight <= 0 is left out: no examples, or excluded for a
  non-finite update (`tff_kd.federated.client_works.screen_client`), so it is
  no teacher.

  Raises `tf.errors.InvalidArgumentError` (at run time) if the stack is full,
  i.e. more clients took part than the process was built for.
  """
  slots = _num_slots(stack)
  weight = tf.cast(weight, tf.float32)
  take = weight > 0
  with tf.control_dependencies([_room_check(take, stack.count, slots)]):
    row = tf.reshape(tf.minimum(stack.count, slots - 1), [1, 1])

  def write(s, v):
    written = tf.tensor_scatter_nd_update(s, row,
                                          tf.cast(v, s.dtype)[tf.newaxis])
    return tf.where(take, written, s)

  values = tf.nest.map_structure(write, stack.values, value)
  weights = write(stack.weights, tf.reshape(weight, []))
  return Stack(values, weights, stack.count + tf.cast(take, stack.count.dtype))


def stack_merge(first: Stack, second: Stack) -> Stack:
  """Concatenates the filled rows of two partial stacks (first, then second).

  Raises `tf.errors.InvalidArgumentError` if together they overflow.
  """
  slots = _num_slots(first)
  check = tf.debugging.assert_less_equal(
      first.count + second.count, slots,
      message=f'more clients than the {slots} teacher slots this stacking '
      'process was built for (clients_per_round)')
  with tf.control_dependencies([check]):
    keep_first = tf.range(slots) < first.count

  def merge(a, b):
    # Rolling `b` by first.count moves its filled rows behind a's; its zero
    # tail wraps around onto rows that `a` keeps.
    shifted = tf.roll(b, first.count, axis=0)
    mask = tf.reshape(keep_first, [slots] + [1] * (a.shape.rank - 1))
    return tf.where(mask, a, shifted)

  return Stack(tf.nest.map_structure(merge, first.values, second.values),
               merge(first.weights, second.weights),
               first.count + second.count)


class Slots(NamedTuple):
  """A `Stack` held as M separate slots: the accumulator of TFF's stacking
  aggregator (`tff_kd.federated.stacking.build_stacking_aggregator`).

  A slot holds one client's value flattened: one vector per dtype of its
  leaves (in `tf.nest.flatten` order, grouped by dtype in order of first
  appearance, `_dtype_groups`), with a leading dimension of 1, or of 0 for
  an empty slot (static shape [None, n]). Slots of `GroupRows` hold one
  call's clients each, a leading dimension of 0 to G.

  Attributes:
    values: A tuple of M slots (ceil(M / G) for `GroupRows`), each a tuple
      of [rows, n_d] tensors: slot k holds the k-th client (or call)
      received; the filled slots come first.
    weights: [M] float32 client weights; 0 past `count`.
    count: int32 number of slots filled.
  """

  values: tuple
  weights: tf.Tensor
  count: tf.Tensor


def _dtype_groups(value_specs) -> list[tuple[tf.DType, list[int]]]:
  """The flattened leaves' indices grouped by dtype (first seen first)."""
  groups: dict[tf.DType, list[int]] = {}
  for i, spec in enumerate(tf.nest.flatten(value_specs)):
    groups.setdefault(tf.as_dtype(spec.dtype), []).append(i)
  return list(groups.items())


def _flat(leaves: Sequence[tf.Tensor], batch_dims: int) -> tuple:
  """One vector per dtype group of `leaves` ([rows, n_d] with a batch
  dimension, else [n_d])."""
  groups = _dtype_groups([tf.TensorSpec(l.shape[batch_dims:], l.dtype)
                          for l in leaves])

  def vec(l):
    if not batch_dims:
      return tf.reshape(l, [-1])
    return tf.reshape(l, tf.concat([tf.shape(l)[:batch_dims], [-1]], 0))

  return tuple(tf.concat([vec(leaves[i]) for i in index], batch_dims)
               for _, index in groups)


def empty_slots(value_specs, num_slots: int,
                clients_per_value: int = 1) -> Slots:
  """`Slots` for `num_slots` clients' values shaped like the specs.

  An empty slot is [0, n_d]: the zero accumulator holds no rows at all.
  With `clients_per_value` G > 1 (`slots_accumulate_rows`), a slot holds
  up to G rows, and there are ceil(num_slots / G) of them.
  """
  stack = empty_stack((), num_slots)  # Validates num_slots.
  specs = tf.nest.flatten(value_specs)
  empty = tuple(
      tf.compat.v1.placeholder_with_default(
          tf.zeros([0, sum(specs[i].shape.num_elements() for i in index)],
                   dtype), [None, None])
      for dtype, index in _dtype_groups(value_specs))
  count = -(-num_slots // clients_per_value)
  return Slots(tuple(empty for _ in range(count)), stack.weights,
               stack.count)


def slots_accumulate(slots: Slots, value, weight) -> Slots:
  """`stack_accumulate` on `Slots`: the value goes into slot `count`.

  The value is flattened once (`Slots`); then every slot's new value is a
  `tf.cond` that passes on either that flat value or the slot's old value,
  so no slot is copied: a step of TFF's aggregation allocates one client
  value, whatever M is, which keeps the runtime's memory linear in the
  clients (`tff_kd.federated.stacking`).

  Raises `tf.errors.InvalidArgumentError` (at run time) if all slots are
  full, as `stack_accumulate`.
  """
  slots_count = len(slots.values)
  weight = tf.cast(weight, tf.float32)
  take = weight > 0
  with tf.control_dependencies([_room_check(take, slots.count,
                                            slots_count)]):
    count = tf.identity(slots.count)
  flat = tuple(v[tf.newaxis] for v in _flat(
      [tf.convert_to_tensor(l) for l in tf.nest.flatten(value)], 0))

  def slot(k: int, old: tuple) -> tuple:
    return tf.cond(tf.logical_and(take, tf.equal(count, k)),
                   lambda: flat,
                   lambda: tuple(tf.identity(o) for o in old))

  values = tuple(slot(k, old) for k, old in enumerate(slots.values))
  row = tf.reshape(tf.minimum(count, slots_count - 1), [1, 1])
  weights = tf.where(
      take, tf.tensor_scatter_nd_update(slots.weights, row, weight[None]),
      slots.weights)
  return Slots(values, weights, count + tf.cast(take, count.dtype))


class GroupRows(NamedTuple):
  """G clients' values as rows: the update of a TFF client that runs G
  clients (`tff_kd.federated.execution.train_rows`).

  Attributes:
    values: A structure whose leaves are [G, ...]: row g is the g-th
      client's value.
    weights: [G] float32 client weights; 0 for a padding key or an
      excluded client (no teacher).
  """

  values: object
  weights: tf.Tensor


def _slots_in_use(slots: Slots) -> tf.Tensor:
  """The number of non-empty slots (they come first)."""
  return tf.add_n([tf.cast(tf.shape(slot[0])[0] > 0, tf.int32)
                   for slot in slots.values])


def slots_accumulate_rows(slots: Slots, rows: GroupRows) -> Slots:
  """`slots_accumulate` for G clients at once: their rows of weight > 0, in
  order, go into the first empty slot as one [r, n_d] block.

  The `Slots` are `empty_slots(..., clients_per_value=G)`'s: M rows of
  weights, ceil(M / G) slots. A group with no row of weight > 0 takes no
  slot. `slots_to_stack` reads the rows in order as for one client per
  slot, so the report is the `Stack` that one client per step gives.

  Raises `tf.errors.InvalidArgumentError` (at run time) if the rows do not
  fit (more clients than M, or more groups than slots).
  """
  num_rows = _num_slots(slots)
  slots_count = len(slots.values)
  weights = tf.cast(rows.weights, tf.float32)
  take = weights > 0
  taken = tf.reduce_sum(tf.cast(take, tf.int32))
  in_use = _slots_in_use(slots)
  checks = [
      tf.debugging.Assert(
          slots.count + taken <= num_rows,
          [f'more clients than the {num_rows} teacher slots this stacking '
           'process was built for (clients_per_round)']),
      tf.debugging.Assert(
          tf.logical_or(taken == 0, in_use < slots_count),
          [f'more client groups than the {slots_count} this stacking '
           'process was built for (clients_per_round / clients_per_call)'])]
  with tf.control_dependencies(checks):
    count = tf.identity(slots.count)
  flat = tuple(tf.boolean_mask(v, take) for v in _flat(
      [tf.convert_to_tensor(l) for l in tf.nest.flatten(rows.values)], 1))

  def slot(k: int, old: tuple) -> tuple:
    return tf.cond(tf.logical_and(taken > 0, tf.equal(in_use, k)),
                   lambda: flat,
                   lambda: tuple(tf.identity(o) for o in old))

  values = tuple(slot(k, old) for k, old in enumerate(slots.values))
  index = tf.minimum(count + tf.range(taken), num_rows - 1)[:, tf.newaxis]
  new_weights = tf.tensor_scatter_nd_update(
      slots.weights, index, tf.boolean_mask(weights, take))
  return Slots(values, new_weights, count + taken)


def slots_merge_rows(first: Slots, second: Slots) -> Slots:
  """`slots_merge` for `slots_accumulate_rows`' slots: every filled row of
  first, then second's, as one block in slot 0 (the others empty).

  Raises `tf.errors.InvalidArgumentError` if together they overflow.
  """
  merged = stack_merge(Stack((), first.weights, first.count),
                       Stack((), second.weights, second.count))
  rows = tuple(tf.concat([a, b], 0) for a, b in
               zip(_filled_rows(first), _filled_rows(second)))
  empty = tuple(r[:0] for r in rows)
  return Slots((rows,) + tuple(empty for _ in first.values[1:]),
               merged.weights, merged.count)


def _filled_rows(slots: Slots) -> tuple:
  """Per dtype group, the filled slots concatenated: [count, n_d]."""
  return tuple(tf.concat(rows, 0) for rows in zip(*slots.values))


def slots_to_stack(slots: Slots, value_specs) -> Stack:
  """The `Stack` of `Slots`: the filled slots in order, then zero rows.

  Args:
    slots: The `Slots`.
    value_specs: `tf.TensorSpec` structure of one client's value.

  Returns:
    The `Stack` (leaves [M, ...] in `value_specs`' structure).
  """
  slots_count = _num_slots(slots)
  specs = tf.nest.flatten(value_specs)
  leaves = [None] * len(specs)
  for rows, (_, index) in zip(_filled_rows(slots),
                              _dtype_groups(value_specs)):
    padded = tf.concat(
        [rows, tf.zeros([slots_count - tf.shape(rows)[0], tf.shape(rows)[1]],
                        rows.dtype)], 0)
    sizes = [specs[i].shape.num_elements() for i in index]
    for i, part in zip(index, tf.split(padded, sizes, axis=1)):
      leaves[i] = tf.reshape(part, [slots_count, *specs[i].shape])
  return Stack(tf.nest.pack_sequence_as(value_specs, leaves), slots.weights,
               slots.count)


def _split_rows(rows: tuple, count: tf.Tensor, slots_count: int) -> tuple:
  """`Slots.values` of [count, n_d] filled rows: row k, or [0, n_d]."""
  return tuple(
      tuple(r[k:k + tf.cast(k < count, tf.int32)] for r in rows)
      for k in range(slots_count))


def stack_to_slots(stack: Stack) -> Slots:
  """The `Slots` of a `Stack`: its first `count` rows, one slot each."""
  rows = _flat(tf.nest.flatten(stack.values), 1)
  return Slots(_split_rows(rows, stack.count, _num_slots(stack)),
               stack.weights, stack.count)


def slots_merge(first: Slots, second: Slots) -> Slots:
  """`stack_merge` on `Slots`: first's filled slots, then second's.

  Raises `tf.errors.InvalidArgumentError` if together they overflow.
  """
  slots_count = len(first.values)
  merged = stack_merge(Stack((), first.weights, first.count),
                       Stack((), second.weights, second.count))
  rows = tuple(tf.concat([a, b], 0) for a, b in
               zip(_filled_rows(first), _filled_rows(second)))
  return Slots(_split_rows(rows, merged.count, slots_count), merged.weights,
               merged.count)


def example_weights(weights: tf.Tensor, valid: tf.Tensor) -> tf.Tensor:
  """Averaging coefficients of the valid rows: n_k / sum n_k.

  Args:
    weights: [M] client weights (example counts).
    valid: [M] bool, rows that take part (e.g. the clients of one model
      architecture).

  Returns:
    [M] coefficients summing to 1 over the valid rows (n_k / sum n_k; uniform
    when all valid weights are 0), or all zeros when no row is valid.
  """
  valid_f = tf.cast(valid, tf.float32)
  any_valid = tf.reduce_any(valid)
  # normalize_weights' uniform fallback would divide 0 by 0 with no valid
  # row; give it an all-ones mask then and zero the result instead.
  mask = tf.where(any_valid, valid_f, tf.ones_like(valid_f))
  alpha = distillation.normalize_weights(
      tf.maximum(tf.cast(weights, tf.float32), 0.0)[:, tf.newaxis],
      _EPS, mask=mask)[:, 0]
  return alpha * tf.cast(any_valid, tf.float32)


def scaled(value, weight: tf.Tensor):
  """Every float leaf of `value` times the scalar `weight`."""
  weight = tf.cast(weight, tf.float32)
  return tf.nest.map_structure(lambda v: tf.cast(v, tf.float32) * weight,
                               value)


def weighted_mean(weighted_sum: ModelWeights, total: tf.Tensor,
                  fallback: ModelWeights) -> ModelWeights:
  """`weighted_sum / total`, or `fallback` when no weight arrived.

  Args:
    weighted_sum: sum_k w_k v_k (`tff_kd.federated.stacking.
      build_weighted_sum_aggregator`'s result).
    total: sum_k w_k (scalar).
    fallback: What to return when `total` is 0 (no client took part).

  Returns:
    The weighted mean, with `fallback`'s structure.
  """
  total = tf.cast(total, tf.float32)
  any_weight = total > 0
  safe = tf.where(any_weight, total, 1.0)
  return tf.nest.map_structure(
      lambda s, f: tf.where(any_weight, s / safe, tf.cast(f, tf.float32)),
      weighted_sum, fallback)


def average_update(deltas: ModelWeights, alpha: tf.Tensor,
                   fallback_non_trainable: Sequence[tf.Tensor]
                   ) -> ModelWeights:
  """sum_k alpha_k delta_k of stacked deltas; zero delta when alpha is 0.

  Args:
    deltas: Stacked client results: trainable leaves [M, ...] are deltas,
      non-trainable leaves [M, ...] the clients' final values.
    alpha: [M] coefficients from `example_weights`.
    fallback_non_trainable: Non-trainable values to keep when no client of
      the group took part (alpha all zero).

  Returns:
    `ModelWeights` of the mean trainable delta and the mean non-trainable
    values (as FedAvg's finalizer in `tff_kd.federated.learning`).
  """
  alpha = tf.convert_to_tensor(alpha, tf.float32)
  any_client = tf.reduce_sum(alpha) > 0

  def mean(stacked):
    stacked = tf.convert_to_tensor(stacked)
    a = tf.reshape(alpha, [-1] + [1] * (stacked.shape.rank - 1))
    return tf.reduce_sum(a * stacked, axis=0)

  trainable = [mean(d) for d in deltas.trainable]
  non_trainable = [
      tf.where(any_client, mean(d), f)
      for d, f in zip(deltas.non_trainable, fallback_non_trainable)
  ]
  return ModelWeights(trainable, non_trainable)


def apply_update(optimizer: tff.learning.optimizers.Optimizer,
                 optimizer_state, global_weights: ModelWeights,
                 mean: ModelWeights):
  """The server optimizer's step on the clients' mean update.

  The mean trainable delta points downhill, so its negation is the
  optimizer's pseudo-gradient (plain SGD with lr 1 is FedAvg; Adam is
  FedAdam); the non-trainable values become the mean's.

  Args:
    optimizer: The server `tff.learning.optimizers.Optimizer`.
    optimizer_state: Its state.
    global_weights: The broadcast global `ModelWeights`.
    mean: The mean update: trainable deltas, non-trainable values.

  Returns:
    `(new optimizer state, new global ModelWeights)`.
  """
  state, trainable = optimizer.next(
      optimizer_state, tuple(global_weights.trainable),
      tuple(-u for u in mean.trainable))
  return state, ModelWeights(list(trainable), list(mean.non_trainable))


def server_update(optimizer: tff.learning.optimizers.Optimizer,
                  optimizer_state, global_weights: ModelWeights,
                  deltas: ModelWeights, alpha: tf.Tensor):
  """FedAvg's server step on stacked updates.

  The alpha-weighted mean delta (`average_update`) is applied by the
  server optimizer (`apply_update`). When no row
  has weight (no client, or all excluded), the global weights and the
  optimizer state are kept.

  Args:
    optimizer: The server `tff.learning.optimizers.Optimizer`.
    optimizer_state: Its state.
    global_weights: The broadcast global `ModelWeights`.
    deltas: Stacked client results, as in `average_update`.
    alpha: [M] coefficients from `example_weights`.

  Returns:
    `(new optimizer state, new global ModelWeights)`.
  """
  state, new = apply_update(
      optimizer, optimizer_state, global_weights,
      average_update(deltas, alpha, global_weights.non_trainable))
  any_client = tf.reduce_sum(tf.convert_to_tensor(alpha, tf.float32)) > 0

  def keep(new, old):
    return tf.where(any_client, new, old)

  state = tf.nest.map_structure(keep, state, optimizer_state)
  trainable = [keep(t, g)
               for t, g in zip(new.trainable, global_weights.trainable)]
  return state, ModelWeights(trainable, new.non_trainable)
