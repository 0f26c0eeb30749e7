"""How a TFF client call runs its clients: one value, applied around a step.

A client work is written for one client (`one_client`: the broadcast
weights, one dataset and the round's learning rate in; its screened
`ClientResult` and statistics out). `ClientExecution` says how each TFF
client call runs the clients it is given, and `client_update` wraps the
per-client step accordingly, so no method builder threads the choice:

* one client per call (`ONE_BY_ONE`, TFF's usual form);
* G clients in turn, inside one TensorFlow call (`merge_clients`): the
  runtime's per-client costs (a call, a broadcast copy, an aggregation
  step) are paid once per G clients, and the round's weighted mean is the
  same up to float round-off;
* G clients in lockstep, as one batched computation over their stacked
  weights (`fused_clients`, `tff_kd.core.fused`): each client computes what
  it would from the same batches, but draws its batch order from its key,
  so a fused run is another draw of the same algorithm.

Grouped and fused clients are a simulation setting: the aggregator sees
group sums, so per-client aggregation (secure sums, DP, stacking) cannot
use them.
"""

import collections
from typing import Callable, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.core import fused
from tff_kd.core import local_training
from tff_kd.core import loops
from tff_kd.core import stacking as stacking_tf
from tff_kd.federated import client_data
from tff_kd.federated import tff_types

EXECUTIONS = ('sequential', 'fused')


class ClientExecution(NamedTuple):
  """How each TFF client call runs its clients (`runtime.clients_per_call`,
  `runtime.client_execution`).

  Attributes:
    clients_per_call: G, the clients each TFF client call runs (1: one).
    mode: 'sequential' (in turn) | 'fused' (in lockstep, one batched
      computation).
  """

  clients_per_call: int = 1
  mode: str = 'sequential'

  @property
  def fused(self) -> bool:
    return self.mode == 'fused'

  @property
  def grouped(self) -> bool:
    """Whether a call takes a [G] vector of keys (and a method that stacks
    its clients sends up a `GroupRows`): G > 1, or fused."""
    return self.clients_per_call > 1 or self.fused


ONE_BY_ONE = ClientExecution()


class LocalSteps(NamedTuple):
  """What a fused call needs of the per-client step: local (proximal)
  training with this optimiser, a method's own term, and each client's
  payload.

  Attributes:
    optimizer: The client optimiser.
    proximal_strength: FedProx mu (0: FedAvg's local training).
    client_bytes: One client's (bytes down, bytes up).
    term: `term(batches, keys)` -> the `fused.Term` of the call's clients
      (built inside the call, from the `FusedBatches` they will train on
      and their [G] keys), for a method whose clients add a term of their
      own to the loss (FedGen's regulariser); None: none.
  """

  optimizer: tff.learning.optimizers.Optimizer
  proximal_strength: float
  client_bytes: tuple[float, float]
  term: Optional[Callable[['FusedBatches', tf.Tensor], fused.Term]] = None


OneClient = Callable[..., tuple[tff.learning.templates.ClientResult,
                                collections.OrderedDict]]


def client_update(execution: ClientExecution, model_fn: tff_types.ModelFn,
                  element_spec: collections.OrderedDict,
                  dataset_fn: Optional[tff_types.DatasetFn],
                  one_client: OneClient,
                  local_steps: Optional[LocalSteps] = None) -> tff.Computation:
  """The per-client step, as a TF computation for `execution`'s calls.

  Args:
    execution: How each call runs its clients.
    model_fn: Builds the Keras classifier.
    element_spec: Batch structure of the client datasets.
    dataset_fn: The keyed path's key -> dataset function, or None (clients
      receive datasets: one per call).
    one_client: `(model, initial_weights, dataset, lr) -> (ClientResult,
      stats)` of one screened client.
    local_steps: For fused calls: the local training `one_client` runs.

  Returns:
    `(weights, data, lr) -> (ClientResult, stats)`, whose data is a
    dataset, a key, or a [G] vector of keys.

  Raises:
    ValueError: grouped clients without `dataset_fn`, or fused ones without
      `client_data.KeyedDatasets` or a `local_steps`.
    ConfigError: fused clients with a model they cannot run (one line
      naming the layer).
  """
  check_execution(execution, model_fn, dataset_fn, local_steps)
  group = execution.clients_per_call
  weights_type = tff_types.weights_type_of(model_fn)
  data_type = tff_types.client_data_type(element_spec, dataset_fn,
                                         clients_per_call=group)

  if execution.fused:

    @tff.tensorflow.computation(weights_type, data_type, np.float32)
    def fused_update(initial_weights, keys, lr):
      return fused_clients(
          model_fn(), local_steps.optimizer, initial_weights,
          tf.reshape(keys, [group]), dataset_fn, lr,
          proximal_strength=local_steps.proximal_strength,
          client_bytes=local_steps.client_bytes)

    return fused_update
  if group > 1:

    @tff.tensorflow.computation(weights_type, data_type, np.float32)
    def grouped_update(initial_weights, keys, lr):
      model = model_fn()
      return merge_clients(
          lambda key: one_client(model, initial_weights, dataset_fn(key), lr),
          keys, initial_weights)

    return grouped_update

  @tff.tensorflow.computation(weights_type, data_type, np.float32)
  def single_update(initial_weights, data, lr):
    dataset = data if dataset_fn is None else dataset_fn(data)
    return one_client(model_fn(), initial_weights, dataset, lr)

  return single_update


def check_execution(execution: ClientExecution, model_fn: tff_types.ModelFn,
                    dataset_fn: Optional[tff_types.DatasetFn],
                    local_steps: Optional[LocalSteps]) -> None:
  """Whether `execution` can run these clients (before any compute).

  Raises:
    ValueError: grouped clients without `dataset_fn`, or fused ones without
      `client_data.KeyedDatasets` or a `local_steps`.
    ConfigError: fused clients with a model they cannot run (one line
      naming the layer).
  """
  if execution.clients_per_call > 1 and dataset_fn is None:
    raise ValueError('clients_per_call > 1 needs keyed client data '
                     '(dataset_fn)')
  if execution.fused:
    if not isinstance(dataset_fn, client_data.KeyedDatasets):
      raise ValueError('fused clients need keyed file client data '
                       '(FileClientData.dataset_fn)')
    if local_steps is None:
      raise ValueError('fused clients need the local training they run')
    reason = fused.unsupported(local_training.structure_of(model_fn))
    if reason:
      raise errors.ConfigError(
          f"runtime.client_execution='fused': {reason}; use 'sequential'")


def merge_clients(
    one_client: Callable[[tf.Tensor], tuple[
        tff.learning.templates.ClientResult, collections.OrderedDict]],
    keys: tf.Tensor, weights_like: tff.learning.models.ModelWeights
) -> tuple[tff.learning.templates.ClientResult, collections.OrderedDict]:
  """Several clients' work as one client's (`clients_per_call`).

  Runs `one_client(key)` for each non-empty key of `keys`, in order (a
  graph loop), and merges the results into what a weighted mean sees of
  them: the update is the update-weight-weighted mean of their updates
  (zeros when every weight is 0), its weight their summed weights, so that
  the aggregator's weighted mean over groups equals the one over clients;
  the stats are summed, plus `num_clients`, the number of keys run, which
  `client_works.client_measurements` reports instead of the number of TFF clients.

  Args:
    one_client: key -> (`ClientResult`, `client_works.client_stats`) of one (screened)
      client, traceable in a graph loop.
    keys: [G] string keys, the real ones first: '' pads a short last group
      (`tff_types.group_keys`), and the loop runs the first (number of non-empty
      keys) of them.
    weights_like: A `ModelWeights` of the update's structure.

  Returns:
    (`ClientResult`, stats).
  """
  count = tf.reduce_sum(tf.cast(tf.strings.length(keys) > 0, tf.int32))

  def step(state, i):
    weighted_sum, weight_sum, stats_sum = state
    result, stats = one_client(keys[i])
    weight = tf.cast(result.update_weight, tf.float32)
    weighted_sum = tf.nest.map_structure(lambda s, u: s + weight * u,
                                         weighted_sum, result.update)
    return weighted_sum, weight_sum + weight, _add_stats(stats_sum, stats)

  zeros = tf.nest.map_structure(tf.zeros_like, weights_like)
  weighted_sum, weight_sum, stats_sum = loops.fold_range(
      count, step, (zeros, tf.constant(0.0), _no_stats()))
  update = tf.nest.map_structure(lambda s: tf.math.divide_no_nan(s, weight_sum),
                                 weighted_sum)
  stats_sum['num_clients'] = tf.cast(count, tf.float32)
  return (tff.learning.templates.ClientResult(update=update,
                                              update_weight=weight_sum),
          stats_sum)


def _no_stats() -> collections.OrderedDict:
  """Zero `tff_types.CLIENT_STATS`, to sum clients' stats into."""
  return collections.OrderedDict(
      (name, tf.constant(0.0)) for name in tff_types.CLIENT_STATS)


def _add_stats(stats_sum: collections.OrderedDict,
               stats: collections.OrderedDict) -> collections.OrderedDict:
  """`stats_sum` plus one client's stats."""
  return collections.OrderedDict(
      (k, stats_sum[k] + tf.cast(stats[k], tf.float32)) for k in stats_sum)


class FusedBatches(NamedTuple):
  """What fused clients trained on: the examples and their schedule (for a
  method that reads the same batches again, e.g. FedD3A's projection).

  Attributes:
    x: The G clients' examples, concatenated, plus one zero padding row.
    y: Their int32 labels, likewise.
    schedule: `fused.fused_schedule`'s `Schedule`: client g's batch at step
      s is `x[schedule.indices[s, g]]` where `schedule.mask[s, g]` is 1.
  """

  x: tf.Tensor
  y: tf.Tensor
  schedule: fused.Schedule


class Rows(NamedTuple):
  """G keyed clients' results, one row each (`train_rows`): what a method
  that stacks its clients (the KD methods' teachers) sends up for them.

  Attributes:
    values: The clients' screened updates, leaves [G, ...]; zero for a
      padding key or an excluded client.
    weights: [G] float32 update weights (their examples); 0 for a padding
      key or an excluded client.
    stats: The G clients' statistics summed (`tff_types.CLIENT_STATS`),
      plus `num_clients`, the number of keys run.
    batches: Fused only: the `FusedBatches` trained on; None in turn.
  """

  values: object
  weights: tf.Tensor
  stats: collections.OrderedDict
  batches: Optional[FusedBatches] = None

  def client_result(self, values=None) -> tuple[
      tff.learning.templates.ClientResult, collections.OrderedDict]:
    """The call's (`ClientResult`, stats) for a stacking aggregator: a
    `GroupRows` of `values` (default: these rows' own; a method's rows
    built from them) with these weights, weighted by their sum."""
    values = self.values if values is None else values
    return tff.learning.templates.ClientResult(
        update=stacking_tf.GroupRows(values, self.weights),
        update_weight=tf.reduce_sum(self.weights)), self.stats


def train_rows(execution: ClientExecution, model: tf.keras.Model,
               initial_weights: tff.learning.models.ModelWeights,
               keys: tf.Tensor, datasets: tff_types.DatasetFn,
               learning_rate: tf.Tensor, *,
               client_of_key: Callable[[tf.Tensor], tuple[
                   tff.learning.templates.ClientResult,
                   collections.OrderedDict]],
               local_steps: LocalSteps, row_specs=None) -> Rows:
  """G keyed clients' local training as G rows, in turn or in lockstep.

  Sequential: `client_of_key` for each non-empty key, in order (a graph
  loop), its update one row. Fused: the G clients trained as one
  computation (`fused.train_fused`), each screened as one client is
  (`fused.merge_fused`); a row is the client's `weights_delta`. Either
  way a padding key ('') gives a zero row of weight 0.

  Args:
    execution: How the call runs its clients.
    model: The Keras classifier (fused: its structure).
    initial_weights: The broadcast weights.
    keys: [G] string keys, the real ones first, '' for padding.
    datasets: The keyed client data (a `client_data.KeyedDatasets` when
      fused).
    learning_rate: This round's client learning rate.
    client_of_key: key -> (`ClientResult`, stats) of one screened client
      (sequential), e.g. `client_works.local_client`'s on the key's data.
    local_steps: The local training a client runs (fused).
    row_specs: `tf.TensorSpec`s of `client_of_key`'s update, where it is
      more than the `weights_delta`; None: the weights'.

  Returns:
    The `Rows`.
  """
  num_clients = int(keys.shape[0])
  if execution.fused:
    return _fused_rows(model, local_steps, initial_weights, keys, datasets,
                       learning_rate)
  count = tf.reduce_sum(tf.cast(tf.strings.length(keys) > 0, tf.int32))
  specs = row_specs or tf.nest.map_structure(
      lambda t: tf.TensorSpec(t.shape, t.dtype), initial_weights)

  def step(state, i):
    rows, weights, stats_sum = state
    result, stats = client_of_key(keys[i])
    rows = tf.nest.map_structure(lambda a, t: a.write(i, t), rows,
                                 result.update)
    return rows, weights.write(i, tf.cast(result.update_weight, tf.float32)), (
        _add_stats(stats_sum, stats))

  arrays = tf.nest.map_structure(
      lambda s: tf.TensorArray(s.dtype, 0, dynamic_size=True,
                               element_shape=s.shape), specs)
  rows, weights, stats = loops.fold_range(count, step, (
      arrays, tf.TensorArray(tf.float32, 0, dynamic_size=True,
                             element_shape=[]), _no_stats()))

  def padded(array, spec):
    done = array.stack()
    rest = tf.zeros(tf.concat([[num_clients - count], spec.shape], 0),
                    spec.dtype)
    return tf.ensure_shape(tf.concat([done, rest], 0),
                           [num_clients, *spec.shape])

  stats['num_clients'] = tf.cast(count, tf.float32)
  return Rows(tf.nest.map_structure(padded, rows, specs),
              padded(weights, tf.TensorSpec([], tf.float32)), stats)


def _fused_rows(model: tf.keras.Model, local_steps: LocalSteps,
                initial_weights: tff.learning.models.ModelWeights,
                keys: tf.Tensor, datasets: client_data.KeyedDatasets,
                learning_rate: tf.Tensor) -> Rows:
  """`train_rows`' fused path: reads the G clients' arrays, draws their
  lockstep schedule (`fused.fused_schedule`), trains them
  (`fused.train_fused`, with `local_steps.term` where there is one) and
  screens each (`fused.merge_fused`)."""
  num_clients = int(keys.shape[0])
  image_shape = list(datasets.data.image_shape)

  def read(arrays, i):
    xs, ys, sizes, seeds = arrays
    x, y, seed = datasets.arrays(keys[i])
    return (xs.write(i, x), ys.write(i, y), sizes.write(i, tf.shape(y)[0]),
            seeds.write(i, seed))

  xs, ys, sizes, seeds = loops.fold_range(num_clients, read, (
      tf.TensorArray(tf.float32, num_clients, infer_shape=False,
                     element_shape=[None] + image_shape),
      tf.TensorArray(tf.int32, num_clients, infer_shape=False,
                     element_shape=[None]),
      tf.TensorArray(tf.int32, num_clients),
      tf.TensorArray(tf.int64, num_clients)))
  local = datasets.local
  sizes = sizes.stack()
  sizes.set_shape([num_clients])
  schedule = fused.fused_schedule(
      sizes, seeds.stack(), unit=local.unit, amount=local.amount,
      batch_size=local.batch_size)
  x = tf.concat([xs.concat(), tf.zeros([1] + image_shape)], 0)
  y = tf.concat([ys.concat(), tf.zeros([1], tf.int32)], 0)
  batches = FusedBatches(x, y, schedule)
  term = local_steps.term and local_steps.term(batches, keys)
  stacked = fused.StackedModel(model)

  # One function call, so that the worker can optimise the training for
  # its devices (`runtime.grappler='worker'`); TFF's own compilation
  # inlines it. The term's loads come before the call.
  @tf.function(autograph=False)
  def train(initial_weights, x, y, schedule, learning_rate):
    return fused.train_fused(
        stacked, local_steps.optimizer, initial_weights, x, y, schedule,
        learning_rate, proximal_strength=local_steps.proximal_strength,
        term=term)

  with tf.control_dependencies(list(term.after) if term else []):
    result = train(initial_weights, x, y, schedule, learning_rate)
  present = tf.strings.length(keys) > 0
  keep, per_client = fused.merge_fused(result, present)
  count = tf.reduce_sum(tf.cast(present, tf.float32))
  sums = {name: tf.reduce_sum(value) for name, value in per_client.items()}
  sums['bytes_down'], sums['bytes_up'] = (count * b
                                          for b in local_steps.client_bytes)
  stats = collections.OrderedDict((name, sums[name])
                                  for name in tff_types.CLIENT_STATS)
  stats['num_clients'] = count
  return Rows(
      tf.nest.map_structure(
          lambda t: fused.select(keep, t, tf.zeros_like(t)),
          result.weights_delta),
      per_client['num_examples'], stats, batches)


def fused_clients(
    model: tf.keras.Model, optimizer: tff.learning.optimizers.Optimizer,
    initial_weights: tff.learning.models.ModelWeights, keys: tf.Tensor,
    datasets: client_data.KeyedDatasets, learning_rate: tf.Tensor, *,
    proximal_strength: float, client_bytes: tuple[float, float]
) -> tuple[tff.learning.templates.ClientResult, collections.OrderedDict]:
  """G keyed clients trained as one computation, merged as `merge_clients`.

  The clients' fused rows (`train_rows`) merged into what `merge_clients`
  makes of G separate clients: their example-weighted mean update, their
  summed weight, their summed stats and `num_clients`.

  Args:
    model: The Keras classifier (its structure only).
    optimizer: The client optimizer.
    initial_weights: The broadcast weights.
    keys: [G] string keys, '' for padding.
    datasets: The keyed client data.
    learning_rate: This round's client learning rate.
    proximal_strength: FedProx mu.
    client_bytes: One client's (bytes down, bytes up).

  Returns:
    (`ClientResult`, stats).
  """
  rows = _fused_rows(model, LocalSteps(optimizer, proximal_strength,
                                       client_bytes),
                     initial_weights, keys, datasets, learning_rate)
  total = tf.reduce_sum(rows.weights)

  def mean(kept):
    return tf.math.divide_no_nan(tf.tensordot(rows.weights, kept, 1), total)

  return (tff.learning.templates.ClientResult(
      update=tf.nest.map_structure(mean, rows.values),
      update_weight=total), rows.stats)
