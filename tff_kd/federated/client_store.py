"""A server-held per-client store: private client state for stateless clients.

TFF's simulated clients keep nothing between rounds, but some methods need
per-client state that persists: DaFKD's discriminators (Wang et al., CVPR
2023, Algorithm 1 line 18) and FedD3A's heterogeneous local models (Su, Li,
Xue, AAAI 2023, Sec. 3 "Application to Heterogeneous Models": "the clients
retain their personalized models"). A `ClientStore` keeps that state at the
server as a structure of [R, ...] tensors, one row per client (or per
client of one architecture), inside the client work's state, so it is
checkpointed and resumed with the rest of the process state.

One round, inside the client work's federated computation:

1. the store is broadcast; each client reads its own row with `read`
   (index from its data key, checked to be in [0, R));
2. the client returns `entry(new_row, index, present)`;
3. `update` (a `tff.federated_aggregate`) scatters the present rows into a
   zero [R, ...] accumulator by index, with a per-row count, and replaces
   the rows that came back; rows of clients not sampled (or entries with
   `present` 0) are unchanged. Sampling is without replacement, so counts
   are 0 or 1 (several entries for one row would be averaged).

Cost: the simulation broadcasts all R rows to every client and every
client's accumulator has R rows. A real client keeps its own row on its
device, so methods count only the client's own row in their traffic.

`build_stateful_client_work` is the client work around one or several
stores that both methods use: its state is (round number, stores), its
round runs a method's client function and scatters the rows back.
"""

import collections
from typing import Any, Callable, NamedTuple, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.federated import client_works

from tff_kd.federated import schedules

from tff_kd.federated import tff_types

RowFn = Callable[[], Sequence[tf.Tensor]]


class ClientStore:
  """R rows of per-client state, each a tuple of tensors.

  Attributes:
    num_rows: R.
    row_specs: Tuple of `tf.TensorSpec`, one row's leaves.
    row_type: TFF type of one row.
    row_bytes: Bytes of one row.
    initial: No-arg TF computation: every row set to `row_fn()`'s values.
    store_type: TFF type of the store (tuple of [R, ...] tensors).
    entry_type: TFF type of what a client returns (`entry`).
  """

  def __init__(self, row_fn: RowFn, num_rows: int, *, what: str = 'client'):
    """Builds the store's computations.

    Args:
      row_fn: No-arg callable returning one row's initial values (tensors or
        variables, e.g. a freshly built model's); called once, inside the
        initial TF computation, so it may build Keras models.
      num_rows: R >= 1.
      what: Names the rows in the out-of-range error message.

    Raises:
      ValueError: `num_rows` < 1.
    """
    if not isinstance(num_rows, (int, np.integer)) or num_rows < 1:
      raise ValueError(f'a client store needs >= 1 row, got {num_rows!r}')
    self.num_rows = int(num_rows)
    self._what = what
    rows = self.num_rows

    @tff.tensorflow.computation
    def initial():
      return tuple(
          tf.tile(tf.convert_to_tensor(v)[tf.newaxis],
                  [rows] + [1] * v.shape.rank) for v in row_fn())

    self.initial = initial
    self.store_type = initial.type_signature.result
    # One row's leaves, read off the store's type (row_fn is built once).
    self.row_specs = tuple(tf.TensorSpec(t.shape[1:], t.dtype)
                           for t in self.store_type)
    self.row_type = tff_types.spec_to_type(self.row_specs)
    self.row_bytes = float(tff_types.payload_bytes(self.row_type))
    specs = self.row_specs
    self.entry_type = tff.types.StructWithPythonType(
        [self.row_type, tff.TensorType(np.int32),
         tff.TensorType(np.float32)], tuple)

    @tff.tensorflow.computation
    def zeros():
      return (tuple(tf.zeros([rows, *s.shape], s.dtype) for s in specs),
              tf.zeros([rows], tf.float32))

    acc_type = zeros.type_signature.result

    @tff.tensorflow.computation(acc_type, self.entry_type)
    def accumulate(acc, entry):
      sums, counts = acc
      row, index, present = entry
      index = tf.reshape(index, [1, 1])
      return (tuple(tf.tensor_scatter_nd_add(
          a, index, (tf.cast(present, a.dtype) * r)[tf.newaxis])
                    for a, r in zip(sums, row)),
              tf.tensor_scatter_nd_add(counts, index,
                                       tf.reshape(present, [1])))

    @tff.tensorflow.computation(acc_type, acc_type)
    def merge(a, b):
      return tf.nest.map_structure(tf.add, a, b)

    @tff.tensorflow.computation(acc_type)
    def report(acc):
      return acc

    @tff.tensorflow.computation(self.store_type, acc_type)
    def apply_rows(store, acc):
      sums, counts = acc

      def replace(old, new):
        c = tf.reshape(counts, [-1] + [1] * (old.shape.rank - 1))
        return tf.where(c > 0, new / tf.maximum(c, 1.0), old)

      return tuple(replace(o, n) for o, n in zip(store, sums))

    self._zeros = zeros
    self._accumulate = accumulate
    self._merge = merge
    self._report = report
    self._apply_rows = apply_rows

  def read(self, store: Sequence[tf.Tensor],
           index: tf.Tensor) -> tuple[tf.Tensor, ...]:
    """Row `index` of a store, in a client's TF computation.

    Asserts 0 <= index < R (`tf.errors.InvalidArgumentError` at run time).

    Args:
      store: The broadcast store (tuple of [R, ...] tensors).
      index: int32 row index.

    Returns:
      The row's tensors.
    """
    index = tf.cast(index, tf.int32)
    checks = [
        tf.debugging.assert_less(
            index, self.num_rows,
            message=f'{self._what} id out of range for the '
            f'{self.num_rows} rows this per-client store keeps '
            '(num_clients)'),
        tf.debugging.assert_non_negative(
            index, message=f'negative {self._what} id'),
    ]
    with tf.control_dependencies(checks):
      return tuple(tf.gather(s, index) for s in store)

  @staticmethod
  def entry(row: Sequence[tf.Tensor], index: tf.Tensor,
            present: tf.Tensor | float = 1.0) -> tuple:
    """What a client returns for `update`: (row, index, present 0/1)."""
    return (tuple(row), tf.cast(index, tf.int32),
            tf.cast(present, tf.float32))

  def update(self, store, entries):
    """The new store@SERVER, inside a federated computation.

    Args:
      store: The store, placed at the server.
      entries: `entry` values placed at the clients.

    Returns:
      The store with the present rows replaced, at the server.
    """
    scattered = tff.federated_aggregate(entries, self._zeros(),
                                        self._accumulate, self._merge,
                                        self._report)
    return tff.federated_map(self._apply_rows, (store, scattered))



class ClientOutput(NamedTuple):
  """What a stateful client function returns (`build_stateful_client_work`).

  Attributes:
    result: The client's `tff.learning.templates.ClientResult` (screened).
    stats: Its `client_works.client_stats` (screened).
    entries: `ClientStore.entry` for the store, or a tuple of them, one per
      store, as the builder's `stores`.
    means: Measurements averaged over the clients (weighted by
      `means_weight`) and reported beside the standard ones; empty: none.
    means_weight: The client's weight in `means` (0 for an excluded one).
  """

  result: tff.learning.templates.ClientResult
  stats: collections.OrderedDict
  entries: Any
  means: collections.OrderedDict = collections.OrderedDict()
  means_weight: Union[tf.Tensor, float] = 1.0


ClientFn = Callable[..., ClientOutput]


def build_stateful_client_work(
    client_fn: ClientFn,
    stores: Union[ClientStore, Sequence[ClientStore]],
    weights_type: tff.Type,
    data_type: tff.Type,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
) -> tff.templates.MeasuredProcess:
  """Client work whose clients keep rows in server-held `ClientStore`s.

  State: `(round_num, stores)` at the server; `stores` is the store's value
  (a tuple of [R, ...] tensors) for one `ClientStore`, or a tuple of such
  values for a sequence of them. One round: the learning rate
  `lr * decay**round_num` and the stores are broadcast, every client runs
  `client_fn(weights, data, lr, round_num, stores)` in its TF computation,
  the returned entries are scattered into the stores (`ClientStore.update`)
  and the round number is incremented. Measurements:
  `client_works.client_measurements` and the clients' weighted `means`.

  Args:
    client_fn: `(weights, data, lr, round_num, stores) -> ClientOutput`,
      traced inside a `tff.tensorflow.computation`.
    stores: A `ClientStore`, or a sequence of them.
    weights_type: Unplaced type of the broadcast model.
    data_type: Unplaced type of a client's data
      (`tff_types.client_data_type`).
    learning_rate: Client learning rate at round 0.
    learning_rate_decay: Its multiplier per round.

  Returns:
    A `tff.templates.MeasuredProcess` with the client-work signature.
  """
  single = isinstance(stores, ClientStore)
  store_list = [stores] if single else list(stores)
  stores_type = (stores.store_type if single else
                 tff.types.StructWithPythonType(
                     [s.store_type for s in store_list], tuple))
  mean_names = []

  @tff.tensorflow.computation(weights_type, data_type, np.float32, np.int32,
                              stores_type)
  def client_update(weights, data, lr, round_num, tables):
    out = client_fn(weights, data, lr, round_num, tables)
    if not out.means:
      return out.result, out.stats, out.entries
    mean_names.extend(out.means)
    return (out.result, out.stats, out.entries, out.means,
            tf.cast(out.means_weight, tf.float32))

  round_learning_rate, increment = schedules.build_round_schedule(
      learning_rate, learning_rate_decay)

  @tff.federated_computation
  def init_fn():
    initial = [tff.federated_eval(s.initial, tff.SERVER) for s in store_list]
    return tff.federated_zip((
        tff.federated_value(np.int32(0), tff.SERVER),
        initial[0] if single else tff.federated_zip(tuple(initial))))

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, weights, data):
    round_num, tables = state[0], state[1]
    lr = tff.federated_map(round_learning_rate, round_num)
    outputs = tff.federated_map(
        client_update, (weights, data, tff.federated_broadcast(lr),
                        tff.federated_broadcast(round_num),
                        tff.federated_broadcast(tables)))
    if mean_names:
      client_results, stats, entries, means, kept = outputs
    else:
      client_results, stats, entries = outputs
    if single:
      new_tables = stores.update(tables, entries)
    else:
      new_tables = tff.federated_zip(tuple(
          store.update(tables[a], entries[a])
          for a, store in enumerate(store_list)))
    measurements = client_works.client_measurements(stats, lr)
    if mean_names:
      means = tff.federated_mean(means, weight=kept)
      for name in mean_names:
        measurements[name] = means[name]
    return tff.templates.MeasuredProcessOutput(
        state=tff.federated_zip((tff.federated_map(increment, round_num),
                                 new_tables)),
        result=client_results,
        measurements=tff.federated_zip(measurements))

  return tff.templates.MeasuredProcess(init_fn, next_fn)
