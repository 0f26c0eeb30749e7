"""TFF building blocks for Keras classifiers: client work, finalizer, composer.

One round of the composed process (`build_keras_learning_process`):

1. distributor: broadcast the server `ModelWeights` to the sampled clients;
2. client work (`build_client_work`): each client runs
   `tff_kd.core.local_training.train_locally` with this round's learning rate
   `lr * decay**round`, and returns the trainable delta and its final
   BatchNorm statistics, weighted by its number of examples;
3. aggregator: example-weighted mean of those updates;
4. finalizer (`build_weights_finalizer`): a `tff.learning.optimizers` server
   optimiser applies the mean delta (server lr 1 and plain SGD is FedAvg);
   the non-trainable statistics are replaced by their client mean.

Every stage is a real TFF computation and no stage chooses an execution
context, so the same process runs under the local C++ context, a test context
or a remote/multi-worker one. Measurements are grouped by stage
(`client_work/...`, `finalizer/...`) and include the bytes each round moves
down to and up from the clients.
"""

import collections
from typing import Callable, NamedTuple, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.core import fused
from tff_kd.core import local_training
from tff_kd.core import loops
from tff_kd.core import stacking as stacking_tf
from tff_kd.federated import client_data
from tff_kd.federated import composer

ModelFn = Callable[[], tf.keras.Model]
DatasetFn = Callable[[tf.Tensor], tf.data.Dataset]


def client_data_type(element_spec: collections.OrderedDict,
                     dataset_fn: Optional[DatasetFn] = None, *,
                     with_id: bool = False,
                     clients_per_call: int = 1) -> tff.Type:
  """What each client receives as its data.

  Without `dataset_fn`, a `tff.SequenceType` of batches: the standard TFF
  form (datasets made elsewhere, e.g. by a `tff.program` data source). With
  `with_id` too, `OrderedDict(client_id=int32, data=<sequence>)`: methods
  with per-client state (DaFKD's discriminators, heterogeneous models) need
  to know which client a dataset belongs to, and every client needs a seed
  of its own (`ClientInput.key`).

  With `dataset_fn`, a string key `"<client_id>|<seed>|<round>"` from which
  the client builds its own dataset inside its TensorFlow computation
  (`FileClientData.dataset_fn`): the fast path. It skips the serialisation
  of a dataset graph between two computations for every client, which costs
  the TFF runtime about 0.4 s per round on the FedGen workload
  (benchmarks/fedgen_workload.py).

  With `dataset_fn` and `clients_per_call` G > 1, a [G] vector of such keys:
  one TFF client then runs G clients in turn (`group_keys`,
  `build_client_work`), '' padding the last group.
  """
  if dataset_fn is not None:
    return tff.TensorType(np.str_, [clients_per_call] if clients_per_call > 1
                          else [])
  sequence = tff.SequenceType(spec_to_type(element_spec))
  if with_id:
    return tff.types.StructWithPythonType(
        [('client_id', tff.TensorType(np.int32)), ('data', sequence)],
        collections.OrderedDict)
  return sequence


class ClientInput(NamedTuple):
  """One client's data, whichever form it arrived in.

  Attributes:
    dataset: Its batches.
    client_id: int32 id (-1 for plain sequences, which carry none).
    key: `"<client_id>|<seed>|<round>"`: the data key itself on the keyed
      path, the same string rebuilt from (id, the process seed, the round
      from the server state) on the dataset path, so both paths derive the
      same per-client seeds (e.g. `tf.strings.to_hash_bucket_fast(key, ..)`).
  """

  dataset: tf.data.Dataset
  client_id: tf.Tensor
  key: tf.Tensor


def group_keys(keys: Sequence[str], clients_per_call: int
               ) -> list[Union[str, np.ndarray]]:
  """A round's client keys as a process with `clients_per_call` G takes them.

  G = 1: the keys themselves. G > 1: consecutive groups of G keys, each a
  [G] string array, the last one padded with '' (`merge_clients` skips
  them).
  """
  if clients_per_call <= 1:
    return list(keys)
  keys = list(keys)
  return [np.array(keys[i:i + clients_per_call] +
                   [''] * max(0, i + clients_per_call - len(keys)),
                   dtype=object)
          for i in range(0, len(keys), clients_per_call)]


def client_id_of_key(key: tf.Tensor) -> tf.Tensor:
  """The int32 client id, the first field of a `"<id>|<seed>|<round>"` key."""
  return tf.strings.to_number(tf.strings.split(key, '|')[0], tf.int32)


def client_input(data, dataset_fn: Optional[DatasetFn], *, seed: int = 0,
                 round_num: Optional[tf.Tensor] = None) -> ClientInput:
  """Unpacks a client's data (see `client_data_type`) inside its TF code.

  Args:
    data: The client's key, sequence, or (client_id, sequence).
    dataset_fn: The key -> dataset function of the keyed path, or None.
    seed: The process's seed (the keys' second field).
    round_num: This round's number, from the server state; None (0 in the
      rebuilt key) for clients that draw no per-round randomness.

  Returns:
    A `ClientInput`.
  """
  if dataset_fn is not None:
    return ClientInput(dataset_fn(data), client_id_of_key(data), data)
  if isinstance(data, tf.data.Dataset):
    client_id = tf.constant(-1, tf.int32)
    dataset = data
  else:
    client_id = tf.cast(data['client_id'], tf.int32)
    dataset = data['data']
  if round_num is None:
    round_num = tf.constant(0, tf.int32)
  key = tf.strings.join([tf.strings.as_string(client_id), str(int(seed)),
                         tf.strings.as_string(round_num)], separator='|')
  return ClientInput(dataset, client_id, key)


def _unplaced_weights_type(model_fn: ModelFn) -> tff.Type:
  return spec_to_type(local_training.model_weights(
      local_training.structure_of(model_fn)))


def spec_to_type(structure) -> tff.Type:
  """TFF type of a structure of `tf.TensorSpec`s, tensors or variables."""
  return tff.to_type(tf.nest.map_structure(
      lambda v: tff.TensorType(v.dtype.as_numpy_dtype, v.shape.as_list()),
      structure))


def trainable_specs(weights: tff.learning.models.ModelWeights) -> tuple:
  """`tf.TensorSpec`s of a `ModelWeights`' trainable variables (e.g. to
  initialise a server optimiser's state)."""
  return tuple(tf.TensorSpec(v.shape, v.dtype) for v in weights.trainable)


def payload_bytes(type_spec: tff.Type) -> int:
  """Bytes of all tensors in an unplaced TFF type (fully defined shapes)."""
  total = 0
  leaves = (tff.structure.flatten(type_spec)
            if isinstance(type_spec, tff.StructType) else [type_spec])
  for leaf in leaves:
    total += int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
  return total


def build_initial_weights_fn(model_fn: ModelFn) -> tff.Computation:
  """A no-arg TFF computation: a freshly initialised model's weights."""

  @tff.tensorflow.computation
  def initial_weights():
    return local_training.model_weights(model_fn())

  return initial_weights


def build_client_work(
    model_fn: ModelFn,
    element_spec: collections.OrderedDict,
    client_optimizer: tff.learning.optimizers.Optimizer,
    *,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
    proximal_strength: float = 0.0,
    dataset_fn: Optional[DatasetFn] = None,
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
    dataset_fn: See `client_data_type`.
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
  weights_type = _unplaced_weights_type(model_fn)
  data_type = client_data_type(element_spec, dataset_fn,
                               clients_per_call=clients_per_call)
  # Per client: the broadcast weights down; the update plus its weight up.
  bytes_down = float(payload_bytes(weights_type))
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
      (`group_keys`), and the loop runs the first (number of non-empty
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


# The per-client statistics, in `client_stats`' order (float32 scalars).
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


def check_schedule(learning_rate: float, learning_rate_decay: float) -> None:
  """The one check of a client learning-rate schedule `lr * decay**round`.

  Every builder calls it before building anything; configs are checked by
  `client_optimizer`'s settings with the same bounds.

  Raises:
    ConfigError: unless lr is finite and > 0 and the decay is in (0, 1].
  """
  if not (_is_finite_number(learning_rate) and learning_rate > 0):
    raise errors.ConfigError(
        f'client learning rate must be > 0 and finite, got {learning_rate!r}')
  if not (_is_finite_number(learning_rate_decay) and
          0 < learning_rate_decay <= 1):
    raise errors.ConfigError('client learning-rate decay must be in (0, 1], '
                             f'got {learning_rate_decay!r}')


def _is_finite_number(value) -> bool:
  return (isinstance(value, (int, float, np.integer, np.floating)) and
          not isinstance(value, bool) and np.isfinite(value))


def build_round_schedule(learning_rate: float, learning_rate_decay: float
                         ) -> tuple[tff.Computation, tff.Computation]:
  """TF computations (round -> `lr * decay**round`, round -> round + 1)."""

  @tff.tensorflow.computation(np.int32)
  def round_learning_rate(round_num):
    return tf.constant(learning_rate, tf.float32) * tf.pow(
        tf.constant(learning_rate_decay, tf.float32),
        tf.cast(round_num, tf.float32))

  @tff.tensorflow.computation(np.int32)
  def increment(round_num):
    return round_num + 1

  return round_learning_rate, increment


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
      the round number from the server state (e.g. for `client_input`).
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
  round_learning_rate, increment = build_round_schedule(learning_rate,
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


def build_weights_finalizer(
    weights_type: tff.Type,
    server_optimizer: tff.learning.optimizers.Optimizer,
) -> tff.learning.templates.FinalizerProcess:
  """Applies the mean trainable delta with a server optimiser.

  Non-trainable weights (BatchNorm moving statistics) are set to the clients'
  example-weighted mean: TFF's stock finalizer would leave them at their
  initial values, which breaks inference-mode evaluation.

  Args:
    weights_type: Unplaced `ModelWeights` type.
    server_optimizer: A `tff.learning.optimizers` optimizer (SGD lr 1 is
      FedAvg; Adam gives FedAdam).

  Returns:
    A `tff.learning.templates.FinalizerProcess`.
  """
  specs = tuple(tensor_specs(weights_type.trainable))

  @tff.tensorflow.computation
  def init_tf():
    return server_optimizer.initialize(specs)

  opt_state_type = init_tf.type_signature.result

  @tff.tensorflow.computation(opt_state_type, weights_type, weights_type)
  def apply_tf(opt_state, weights, update):
    return stacking_tf.apply_update(server_optimizer, opt_state, weights,
                                    update)

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(init_tf, tff.SERVER)

  @tff.federated_computation(
      tff.FederatedType(opt_state_type, tff.SERVER),
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(weights_type, tff.SERVER))
  def next_fn(opt_state, weights, update):
    new_state, new_weights = tff.federated_map(
        apply_tf, (opt_state, weights, update))
    return tff.templates.MeasuredProcessOutput(
        state=new_state, result=new_weights,
        measurements=tff.federated_value((), tff.SERVER))

  return tff.learning.templates.FinalizerProcess(init_fn, next_fn)


def tensor_specs(type_spec: tff.Type):
  """`tf.TensorSpec` structure (with Python containers) of a TFF type."""
  return tf.nest.map_structure(
      lambda t: tf.TensorSpec(t.shape, t.dtype),
      tff.types.type_to_tf_tensor_specs(type_spec))


def prototype_of_id(client_id: tf.Tensor, num_prototypes: int) -> tf.Tensor:
  """A client's prototype: its id modulo P."""
  return tf.cast(tf.math.floormod(tf.cast(client_id, tf.int64),
                                  num_prototypes), tf.int32)


class ServerComputation(NamedTuple):
  """A server-stage TF computation together with the Python function it traces.

  Attributes:
    computation: The `tff.tensorflow.computation` the TFF runtime runs.
    python_fn: The Python function it was traced from. The driver-side server
      mode (`tff_kd.runtime.server_stage`) traces the same function again in
      the driver's own TensorFlow, where device placement applies.
  """
  computation: tff.Computation
  python_fn: Callable[..., object]


def server_computation(*parameter_types) -> Callable[..., ServerComputation]:
  """Decorator: `tff.tensorflow.computation` that keeps its Python function.

  Args:
    *parameter_types: The computation's parameter types, as for
      `tff.tensorflow.computation`.

  Returns:
    A decorator returning a `ServerComputation`.
  """

  def wrap(fn):
    return ServerComputation(
        tff.tensorflow.computation(*parameter_types)(fn), fn)

  return wrap


class ServerFinalizer(tff.templates.MeasuredProcess):
  """A finalizer whose server step is one TF computation, kept with it.

  Built by `build_server_finalizer`; `server_step` lets
  `tff_kd.runtime.server_stage.DriverServerProcess` run the same step
  outside the TFF runtime.
  """

  def __init__(self, initialize_fn: tff.Computation, next_fn: tff.Computation,
               server_step: ServerComputation):
    super().__init__(initialize_fn, next_fn)
    self._server_step = server_step

  @property
  def server_step(self) -> ServerComputation:
    """The step's TFF computation and the Python function it traces."""
    return self._server_step


def build_server_finalizer(
    init_tf: tff.Computation,
    finalize: ServerComputation) -> ServerFinalizer:
  """A finalizer process that runs one TF computation at the server.

  Every KD method's server stage has this shape: its state comes from
  `init_tf()`, and `finalize(state, global_weights, aggregate)` returns
  `(new_state, new_global_weights, metrics)`, all placed at the server.

  The returned `ServerFinalizer` keeps `finalize` as its `server_step`, so
  that `tff_kd.runtime.server_stage.DriverServerProcess` can run the same
  step outside the TFF runtime.

  Args:
    init_tf: No-arg TF computation returning the initial finalizer state.
    finalize: `ServerComputation` `(state, weights, aggregate) -> (state,
      weights, metrics)` (see `server_computation`).

  Returns:
    A `ServerFinalizer` (a `tff.templates.MeasuredProcess` with the
    finalizer signature).
  """
  finalize_tf = finalize.computation
  state_type, weights_type, aggregate_type = (
      finalize_tf.type_signature.parameter)

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(init_tf, tff.SERVER)

  @tff.federated_computation(
      tff.FederatedType(state_type, tff.SERVER),
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(aggregate_type, tff.SERVER))
  def next_fn(state, weights, aggregate):
    new_state, new_weights, metrics = tff.federated_map(
        finalize_tf, (state, weights, aggregate))
    return tff.templates.MeasuredProcessOutput(
        state=new_state, result=new_weights, measurements=metrics)

  return ServerFinalizer(init_fn, next_fn, finalize)


def build_keras_learning_process(
    model_fn: ModelFn,
    element_spec: collections.OrderedDict,
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
    proximal_strength: float = 0.0,
    dataset_fn: Optional[DatasetFn] = None,
    clients_per_call: int = 1,
    fuse_clients: bool = False,
) -> tff.learning.templates.LearningProcess:
  """Composes broadcast, client work, weighted mean and finalizer.

  Args:
    model_fn: No-arg callable building the Keras classifier (logits).
    element_spec: Batch structure of the client datasets.
    client_optimizer: Client `tff.learning.optimizers` optimizer.
    server_optimizer: Server `tff.learning.optimizers` optimizer.
    learning_rate: Client learning rate at round 0.
    learning_rate_decay: Multiplicative client lr decay per round.
    proximal_strength: FedProx mu (0 for FedAvg).
    dataset_fn: Optional key -> dataset function; see `client_data_type`.
    clients_per_call: Clients per TFF client (`build_client_work`).
    fuse_clients: Train them as one computation (`build_client_work`).

  Returns:
    A `tff.learning.templates.LearningProcess` whose `next` takes
    `(state, {element_spec*}@CLIENTS)`, or `(state, {str}@CLIENTS)` of keys
    when `dataset_fn` is given (`{str[G]}@CLIENTS`, `group_keys`, with
    `clients_per_call` G > 1).
  """
  weights_type = _unplaced_weights_type(model_fn)
  client_work = build_client_work(
      model_fn, element_spec, client_optimizer,
      learning_rate=learning_rate, learning_rate_decay=learning_rate_decay,
      proximal_strength=proximal_strength, dataset_fn=dataset_fn,
      clients_per_call=clients_per_call, fuse_clients=fuse_clients)
  aggregator = tff.aggregators.MeanFactory().create(
      weights_type, tff.TensorType(np.float32))
  return composer.compose_learning_process(
      build_initial_weights_fn(model_fn),
      tff.learning.templates.build_broadcast_process(weights_type),
      client_work,
      aggregator,
      build_weights_finalizer(weights_type, server_optimizer))
