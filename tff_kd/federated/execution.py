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


ONE_BY_ONE = ClientExecution()


class LocalSteps(NamedTuple):
  """What a fused call needs of the per-client step: local (proximal)
  training with this optimiser, and each client's payload.

  Attributes:
    optimizer: The client optimiser.
    proximal_strength: FedProx mu (0: FedAvg's local training).
    client_bytes: One client's (bytes down, bytes up).
  """

  optimizer: tff.learning.optimizers.Optimizer
  proximal_strength: float
  client_bytes: tuple[float, float]


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
  group = execution.clients_per_call
  if group > 1 and dataset_fn is None:
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
  stats_like = collections.OrderedDict(
      (name, tf.constant(0.0)) for name in tff_types.CLIENT_STATS)

  def step(state, i):
    weighted_sum, weight_sum, stats_sum = state
    result, stats = one_client(keys[i])
    weight = tf.cast(result.update_weight, tf.float32)
    weighted_sum = tf.nest.map_structure(lambda s, u: s + weight * u,
                                         weighted_sum, result.update)
    stats_sum = collections.OrderedDict(
        (k, stats_sum[k] + tf.cast(stats[k], tf.float32)) for k in stats_sum)
    return weighted_sum, weight_sum + weight, stats_sum

  zeros = tf.nest.map_structure(tf.zeros_like, weights_like)
  weighted_sum, weight_sum, stats_sum = loops.fold_range(
      count, step, (zeros, tf.constant(0.0), stats_like))
  update = tf.nest.map_structure(lambda s: tf.math.divide_no_nan(s, weight_sum),
                                 weighted_sum)
  stats_sum['num_clients'] = tf.cast(count, tf.float32)
  return (tff.learning.templates.ClientResult(update=update,
                                              update_weight=weight_sum),
          stats_sum)


def fused_clients(
    model: tf.keras.Model, optimizer: tff.learning.optimizers.Optimizer,
    initial_weights: tff.learning.models.ModelWeights, keys: tf.Tensor,
    datasets: client_data.KeyedDatasets, learning_rate: tf.Tensor, *,
    proximal_strength: float, client_bytes: tuple[float, float]
) -> tuple[tff.learning.templates.ClientResult, collections.OrderedDict]:
  """G keyed clients trained as one computation, merged as `merge_clients`.

  Reads the G clients' arrays, draws their lockstep schedule
  (`fused.fused_schedule`) and trains them (`fused.train_fused`); each
  client is screened as `client_works.screen_client` screens one
  (`fused.merge_fused`), and the result is what `merge_clients` makes of
  G separate clients: their example-weighted mean update, their summed
  weight, their summed stats and `num_clients`.

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
  result = fused.train_fused(
      fused.StackedModel(model), optimizer, initial_weights, x, y, schedule,
      learning_rate, proximal_strength=proximal_strength)
  present = tf.strings.length(keys) > 0
  keep, per_client = fused.merge_fused(result, present)
  weights = per_client['num_examples']
  total = tf.reduce_sum(weights)

  def mean(t):
    kept = fused.select(keep, t, tf.zeros_like(t))
    return tf.math.divide_no_nan(tf.tensordot(weights, kept, 1), total)

  count = tf.reduce_sum(tf.cast(present, tf.float32))
  sums = {name: tf.reduce_sum(value) for name, value in per_client.items()}
  sums['bytes_down'], sums['bytes_up'] = (count * b for b in client_bytes)
  stats = collections.OrderedDict((name, sums[name]) for name in tff_types.CLIENT_STATS)
  stats['num_clients'] = count
  return (tff.learning.templates.ClientResult(
      update=tf.nest.map_structure(mean, result.weights_delta),
      update_weight=total), stats)
