"""Client works: what each client computes in a round, as TFF processes.

The `tff.learning.templates.ClientWorkProcess` stage of a learning process:
local (proximal) training (`build_client_work`), its per-round schedule
state (`build_scheduled_client_work`), the screening of non-finite client
results (`screen_client`), the per-client statistics every method reports
(`client_stats`, `client_measurements`), and the two ways one TFF client can
run several clients (`merge_clients` in turn, `fused_clients` in lockstep).
"""

import collections
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.core import fused
from tff_kd.core import local_training
from tff_kd.core import loops
from tff_kd.federated import client_data
from tff_kd.federated import schedules
from tff_kd.federated import tff_types


def build_client_work(
    model_fn: tff_types.ModelFn,
    element_spec: collections.OrderedDict,
    client_optimizer: tff.learning.optimizers.Optimizer,
    *,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
    proximal_strength: float = 0.0,
    dataset_fn: Optional[tff_types.DatasetFn] = None,
    clients_per_call: int = 1,
    fuse_clients: bool = False,
) -> tff.templates.MeasuredProcess:
  """Local (proximal) training as a client-work process.

  See `build_scheduled_client_work` for the state (the round number, which
  drives the learning-rate schedule) and the measurements.

  With `clients_per_call` G > 1 (keys only), each TFF client receives G
  keys and trains those clients in turn, from the same broadcast weights,
  inside one TensorFlow call (`merge_clients`): the round's weighted mean
  is the same up to float round-off, and the runtime's per-client costs
  (a call, a broadcast copy, an aggregation step) are paid once per G
  clients. A simulation setting: the aggregator then sees group sums, so
  per-client aggregation (secure sums, DP, stacking) cannot use it.

  With `fuse_clients` too, those G clients train in lockstep as one batched
  computation (`fused_clients`, `tff_kd.core.fused`) instead of in turn:
  each client's result is what it would compute from the same batches, but
  its batch order is the fused schedule's, not `dataset_fn`'s.

  Args:
    model_fn: No-arg callable building the Keras classifier (logits).
    element_spec: Batch structure of the client datasets.
    client_optimizer: A `tff.learning.optimizers` optimizer.
    learning_rate: Client learning rate at round 0.
    learning_rate_decay: Multiplicative decay per round.
    proximal_strength: FedProx mu (0 for FedAvg).
    dataset_fn: See `tff_types.client_data_type`.
    clients_per_call: Clients per TFF client (>= 1; > 1 needs
      `dataset_fn`).
    fuse_clients: Train each call's clients as one computation; needs a
      `client_data.KeyedDatasets` `dataset_fn` and a model that
      `fused.unsupported` accepts.

  Returns:
    A `tff.learning.templates.ClientWorkProcess`, or with `dataset_fn` a
    `tff.templates.MeasuredProcess` of the same signature taking keys (or
    [G] vectors of keys).

  Raises:
    ValueError: `clients_per_call` > 1 without `dataset_fn`, or
      `fuse_clients` without `KeyedDatasets`.
    ConfigError: `fuse_clients` with a model it cannot run (one line
      naming the layer).
  """
  if clients_per_call > 1 and dataset_fn is None:
    raise ValueError('clients_per_call > 1 needs keyed client data '
                     '(dataset_fn)')
  if fuse_clients:
    if not isinstance(dataset_fn, client_data.KeyedDatasets):
      raise ValueError('fuse_clients needs keyed file client data '
                       '(FileClientData.dataset_fn)')
    reason = fused.unsupported(local_training.structure_of(model_fn))
    if reason:
      raise errors.ConfigError(f'runtime.fuse_clients: {reason}; use False')
  weights_type = tff_types.weights_type_of(model_fn)
  data_type = tff_types.client_data_type(element_spec, dataset_fn,
                               clients_per_call=clients_per_call)
  # Per client: the broadcast weights down; the update plus its weight up.
  bytes_down = float(tff_types.payload_bytes(weights_type))
  bytes_up = bytes_down + np.dtype(np.float32).itemsize

  def one_client(model, initial_weights, dataset, lr):
    result = local_training.train_locally(
        model, client_optimizer, initial_weights, dataset, lr,
        proximal_strength=proximal_strength)
    client_result = tff.learning.templates.ClientResult(
        update=result.weights_delta, update_weight=result.num_examples)
    return screen_client(client_result,
                         client_stats(result, bytes_down, bytes_up))[:2]

  if fuse_clients:

    @tff.tensorflow.computation(weights_type, data_type, np.float32)
    def client_update(initial_weights, keys, lr):
      return fused_clients(
          model_fn(), client_optimizer, initial_weights,
          tf.reshape(keys, [clients_per_call]), dataset_fn, lr,
          proximal_strength=proximal_strength,
          client_bytes=(bytes_down, bytes_up))
  elif clients_per_call > 1:

    @tff.tensorflow.computation(weights_type, data_type, np.float32)
    def client_update(initial_weights, keys, lr):
      model = model_fn()
      return merge_clients(
          lambda key: one_client(model, initial_weights, dataset_fn(key), lr),
          keys, initial_weights)
  else:

    @tff.tensorflow.computation(weights_type, data_type, np.float32)
    def client_update(initial_weights, data, lr):
      dataset = data if dataset_fn is None else dataset_fn(data)
      return one_client(model_fn(), initial_weights, dataset, lr)

  return build_scheduled_client_work(
      client_update, learning_rate=learning_rate,
      learning_rate_decay=learning_rate_decay,
      sequence_data=dataset_fn is None)


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
  `client_measurements` reports instead of the number of TFF clients.

  Args:
    one_client: key -> (`ClientResult`, `client_stats`) of one (screened)
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
      (name, tf.constant(0.0)) for name in CLIENT_STATS)

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
  client is screened as `screen_client` screens one
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
  stats = collections.OrderedDict((name, sums[name]) for name in CLIENT_STATS)
  stats['num_clients'] = count
  return (tff.learning.templates.ClientResult(
      update=tf.nest.map_structure(mean, result.weights_delta),
      update_weight=total), stats)


CLIENT_STATS = ('loss_sum', 'num_examples', 'num_steps', 'bytes_down',
                'bytes_up', 'excluded')


def client_stats(result: local_training.LocalResult, bytes_down: tf.Tensor,
                 bytes_up: tf.Tensor) -> collections.OrderedDict:
  """The per-client statistics `build_scheduled_client_work` sums up."""
  return collections.OrderedDict(zip(CLIENT_STATS, (
      result.loss_sum, result.num_examples,
      tf.cast(result.num_steps, tf.float32), tf.cast(bytes_down, tf.float32),
      tf.cast(bytes_up, tf.float32), tf.constant(0.0))))


def all_finite(structure) -> tf.Tensor:
  """Whether every floating-point tensor in `structure` is finite."""
  checks = [tf.reduce_all(tf.math.is_finite(t))
            for t in tf.nest.flatten(structure) if t.dtype.is_floating]
  return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def screen_client(
    client_result: tff.learning.templates.ClientResult,
    stats: collections.OrderedDict,
) -> tuple[tff.learning.templates.ClientResult, collections.OrderedDict,
           tf.Tensor]:
  """Excludes a client whose update or training loss is not finite.

  Such a client (a diverged local run, corrupt local data) would make the
  round's aggregate NaN. Its update is replaced by zeros and its weight by
  0: weighted means ignore it, and the stacking aggregator
  (`tff_kd.core.stacking.slots_accumulate`) leaves it out of the teachers. Its
  loss, example and step counts are zeroed and `excluded` is 1, so the
  round reports `num_excluded`. Call it on the client, inside the client's
  TF computation.

  Args:
    client_result: The client's `ClientResult`.
    stats: Its `client_stats`.

  Returns:
    (screened result, screened stats, keep): `keep` is the scalar bool a
    client work also applies to its other outputs (e.g. a per-client store
    entry's `present`).
  """
  keep = tf.logical_and(all_finite(client_result.update),
                        tf.math.is_finite(stats['loss_sum']))

  def gate(t):
    return tf.where(keep, t, tf.zeros_like(t)) if t.dtype.is_floating else t

  screened = tff.learning.templates.ClientResult(
      update=tf.nest.map_structure(gate, client_result.update),
      update_weight=gate(tf.cast(client_result.update_weight, tf.float32)))
  stats = collections.OrderedDict(stats)
  for key in ('loss_sum', 'num_examples', 'num_steps'):
    stats[key] = gate(stats[key])
  stats['excluded'] = 1.0 - tf.cast(keep, tf.float32)
  return screened, stats, keep


def client_measurements(stats, lr) -> collections.OrderedDict:
  """The standard client-work measurements (at the server), unzipped.

  Call inside a federated computation with the clients' `client_stats`
  and the round's learning rate at the server: the summed stats, the
  learning rate and the number of clients.
  """
  totals = tff.federated_sum(stats)
  names = [name for name, _ in
           tff.structure.iter_elements(stats.type_signature.member)]
  # Grouped clients (`merge_clients`) count their own clients.
  num_clients = (totals.num_clients if 'num_clients' in names else
                 tff.federated_sum(tff.federated_value(1.0, tff.CLIENTS)))
  return collections.OrderedDict(
      bytes_down=totals.bytes_down,
      bytes_up=totals.bytes_up,
      train_loss_sum=totals.loss_sum,
      num_examples=totals.num_examples,
      num_steps=totals.num_steps,
      learning_rate=lr,
      num_clients=num_clients,
      num_excluded=totals.excluded)


def build_scheduled_client_work(
    client_update: tff.Computation,
    *,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
    sequence_data: bool = False,
) -> tff.templates.MeasuredProcess:
  """Wraps a per-client TF computation into a client-work process.

  The state is the round number, placed at the server: it sets the round's
  client learning rate `learning_rate * learning_rate_decay**round` and is
  checkpointed with the rest of the state, so a resumed run continues the
  schedule.

  Args:
    client_update: TF computation `(weights, data, lr) -> (ClientResult,
      stats)`, with `stats` as made by `client_stats`; or, taking a fourth
      int32 argument, `(weights, data, lr, round_num)`: it then receives
      the round number from the server state (e.g. for `tff_types.client_input`).
    learning_rate: Client learning rate at round 0.
    learning_rate_decay: Multiplicative decay per round.
    sequence_data: Whether clients receive sequences (then the result is a
      `tff.learning.templates.ClientWorkProcess`) or keys (a plain
      `tff.templates.MeasuredProcess`: TFF's ClientWorkProcess only admits
      sequence data, see tff_kd.federated.composer).

  Returns:
    The client-work process; its measurements are the summed stats plus the
    learning rate and the number of clients.
  """
  weights_type, data_type = client_update.type_signature.parameter[:2]
  with_round = len(client_update.type_signature.parameter) == 4
  round_learning_rate, increment = schedules.build_round_schedule(learning_rate,
                                                        learning_rate_decay)

  @tff.federated_computation
  def init_fn():
    return tff.federated_value(np.int32(0), tff.SERVER)

  @tff.federated_computation(
      tff.FederatedType(np.int32, tff.SERVER),
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(round_num, weights, data):
    lr = tff.federated_map(round_learning_rate, round_num)
    args = (weights, data, tff.federated_broadcast(lr))
    if with_round:
      args += (tff.federated_broadcast(round_num),)
    client_results, stats = tff.federated_map(client_update, args)
    measurements = tff.federated_zip(client_measurements(stats, lr))
    return tff.templates.MeasuredProcessOutput(
        state=tff.federated_map(increment, round_num),
        result=client_results,
        measurements=measurements)

  if sequence_data:
    return tff.learning.templates.ClientWorkProcess(init_fn, next_fn)
  return tff.templates.MeasuredProcess(init_fn, next_fn)
