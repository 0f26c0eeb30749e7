"""Graph loops that trace without AutoGraph.

AutoGraph rewrites a `tf.function`'s Python source the first time it is
traced, and on this kind of machine that is the largest single part of a
process build: `train_locally` took 0.29 s, FedGen's regularised local
round 0.34 s and the evaluation loop 0.18 s (once per process, measured by
timing AutoGraph's conversions during a FedGen start-up). Yet their only
use of AutoGraph is one loop. `fold_batches` and `fold_range` build the
loops AutoGraph builds for `for batch in iter(dataset)` and
`for i in tf.range(n)` (a `tf.while_loop` over the iterator's optional
element, resp. over a counter), so the functions that use them are traced
with `autograph=False` into the same graph, and compute the same numbers.

Their `step` must trace as plain Python: no Python `if`, `for` or `while`
on tensors (loops over Python lists, like the model's variables, are fine;
a condition is a `tf.cond`). The helpers are marked unconverted, so a
`step` traces as written even when their caller is converted. Every KD
method's loops are built this way, and a process build converts no Python
function (BUILD_NOTES.md, "Start-up of the KD methods").
`map_batches` is `fold_range` over the batches of a pool: a model's (or
several heads') outputs on N examples, a batch at a time.
"""

from typing import Any, Callable, Optional, TypeVar, Union

import tensorflow as tf

State = TypeVar('State')


@tf.autograph.experimental.do_not_convert
def fold_batches(dataset: tf.data.Dataset,
                 step: Callable[[State, object], State],
                 state: State) -> State:
  """`for batch in iter(dataset): state = step(state, batch)`, as a graph.

  Each iteration takes the iterator's next element as an optional and runs
  `step` under a `tf.cond` on whether it has a value. This iterator form
  costs ~1 ms per call where `dataset.reduce` (what AutoGraph builds for
  `for batch in dataset`) re-instantiates its body, ~50 ms per client
  round on this workload.

  Args:
    dataset: The batches (in a `tf.function`).
    step: (state, batch) -> new state, with the same structure and dtypes.
    state: The initial state: a nest of tensors.

  Returns:
    The state after the last batch (`state` for an empty dataset).
  """
  iterator = iter(dataset)

  def body(has_next, state):
    del has_next
    element = iterator.get_next_as_optional()
    has_next = element.has_value()
    state = tf.cond(has_next, lambda: step(state, element.get_value()),
                    lambda: state)
    return has_next, state

  _, state = tf.while_loop(lambda has_next, state: has_next, body,
                           (tf.constant(True), state))
  return state


@tf.autograph.experimental.do_not_convert
def fold_range(n: int, step: Callable[[State, tf.Tensor], State],
               state: State) -> State:
  """`for i in tf.range(n): state = step(state, i)`, as a graph.

  Args:
    n: Number of iterations (a Python int or an int32 scalar tensor).
    step: (state, i) -> new state, with the same structure and dtypes; `i`
      is an int32 scalar.
    state: The initial state: a nest of tensors.

  Returns:
    The state after the last iteration.
  """
  def body(i, state):
    return i + 1, step(state, i)

  _, state = tf.while_loop(lambda i, state: i < n, body,
                           (tf.constant(0), state),
                           maximum_iterations=n)
  return state


@tf.autograph.experimental.do_not_convert
def map_batches(fn: Callable[[Any], Union[tf.Tensor, tuple[tf.Tensor, ...]]],
                inputs: Any, batch_size: Union[int, tf.Tensor],
                num_outputs: Optional[int] = None
                ) -> Union[tf.Tensor, tuple[tf.Tensor, ...]]:
  """`fn` on consecutive batches of `inputs`, its outputs concatenated.

  Batch i is `inputs[i * batch_size:(i + 1) * batch_size]`, every tensor of
  the nest sliced alike along axis 0; None entries stay None. Each output
  of `fn` is cast to float32 and the batches' outputs are concatenated
  along axis 0 (a `fold_range` over the batches writing `tf.TensorArray`s).

  Args:
    fn: batch (the structure of `inputs`) -> a tensor, or a tuple of
      `num_outputs` tensors.
    inputs: A tensor, or a nest of tensors (and None) that share their
      first dimension N >= 1 (`TensorArray.concat` of no batches fails).
    batch_size: Examples per call of `fn` (a Python int or an int32 scalar).
    num_outputs: None when `fn` returns one tensor, else the length of the
      tuple it returns (the loop's outputs must exist before `fn` is traced).

  Returns:
    The concatenated output [N, ...] (float32), or a tuple of them.
  """
  flat = [None if t is None else tf.convert_to_tensor(t)
          for t in tf.nest.flatten(inputs)]
  n = tf.shape(next(t for t in flat if t is not None))[0]
  num_batches = (n + batch_size - 1) // batch_size

  def step(outputs, i):
    batch = tf.nest.pack_sequence_as(inputs, [
        None if t is None else t[i * batch_size:(i + 1) * batch_size]
        for t in flat])
    values = fn(batch)
    if num_outputs is None:
      values = (values,)
    return tuple(out.write(i, tf.cast(value, tf.float32))
                 for out, value in zip(outputs, values, strict=True))

  outputs = tuple(
      tf.TensorArray(tf.float32, size=num_batches, infer_shape=False)
      for _ in range(1 if num_outputs is None else num_outputs))
  concatenated = tuple(out.concat()
                       for out in fold_range(num_batches, step, outputs))
  return concatenated[0] if num_outputs is None else concatenated
