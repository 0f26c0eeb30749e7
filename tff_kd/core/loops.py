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
on tensors (loops over Python lists, like the model's variables, are fine).
"""

from typing import Callable, TypeVar

import tensorflow as tf

State = TypeVar('State')


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
