"""Client works: what each client computes in a round, as TFF processes.

The `tff.learning.templates.ClientWorkProcess` stage of a learning process:
local (proximal) training (`build_client_work`), its per-round schedule
state (`build_scheduled_client_work`), the screening of non-finite client
results (`screen_client`), the per-client statistics every method reports
(`client_stats`, `client_measurements`), and the two ways one TFF client can
run several clients (`tff_kd.federated.execution`: in turn or in lockstep).
"""

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import local_training
from tff_kd.federated import execution
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
    client_execution: execution.ClientExecution = execution.ONE_BY_ONE,
) -> tff.templates.MeasuredProcess:
  """Local (proximal) training as a client-work process.

  See `build_scheduled_client_work` for the state (the round number, which
  drives the learning-rate schedule) and the measurements.

  How one TFF client call runs its clients is `client_execution`, one
  value applied around the per-client step (`tff_kd.federated.execution`):
  one client per call (the default), G clients in turn, or G clients in
  lockstep as one batched computation.

  Args:
    model_fn: No-arg callable building the Keras classifier (logits).
    element_spec: Batch structure of the client datasets.
    client_optimizer: A `tff.learning.optimizers` optimizer.
    learning_rate: Client learning rate at round 0.
    learning_rate_decay: Multiplicative decay per round.
    proximal_strength: FedProx mu (0 for FedAvg).
    dataset_fn: See `tff_types.client_data_type`.
    client_execution: How a TFF client call runs its clients
      (`execution.ClientExecution`; more than one needs `dataset_fn`, fused
      ones a `client_data.KeyedDatasets` and a model that
      `fused.unsupported` accepts).

  Returns:
    A `tff.learning.templates.ClientWorkProcess`, or with `dataset_fn` a
    `tff.templates.MeasuredProcess` of the same signature taking keys (or
    [G] vectors of keys).

  Raises:
    ValueError: grouped clients without `dataset_fn`, or fused ones
      without `KeyedDatasets`.
    ConfigError: fused clients with a model they cannot run (one line
      naming the layer).
  """
  weights_type = tff_types.weights_type_of(model_fn)
  # Per client: the broadcast weights down; the update plus its weight up.
  bytes_down = float(tff_types.payload_bytes(weights_type))
  bytes_up = bytes_down + np.dtype(np.float32).itemsize

  local_steps = execution.LocalSteps(client_optimizer, proximal_strength,
                                     (bytes_down, bytes_up))
  client_update = execution.client_update(
      client_execution, model_fn, element_spec, dataset_fn,
      local_client(local_steps), local_steps)
  return build_scheduled_client_work(
      client_update, learning_rate=learning_rate,
      learning_rate_decay=learning_rate_decay,
      sequence_data=dataset_fn is None)


def local_client(local_steps: execution.LocalSteps) -> execution.OneClient:
  """One client's screened local (proximal) training, as
  `execution.OneClient`: its update is its `weights_delta`, weighted by
  its examples."""

  def one_client(model, initial_weights, dataset, lr):
    result = local_training.train_locally(
        model, local_steps.optimizer, initial_weights, dataset, lr,
        proximal_strength=local_steps.proximal_strength)
    client_result = tff.learning.templates.ClientResult(
        update=result.weights_delta, update_weight=result.num_examples)
    return screen_client(client_result,
                         client_stats(result, *local_steps.client_bytes))[:2]

  return one_client


CLIENT_STATS = tff_types.CLIENT_STATS


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
  # Grouped clients (`execution.merge_clients`) count their own clients.
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
