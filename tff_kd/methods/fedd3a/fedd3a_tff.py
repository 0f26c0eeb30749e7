"""FedD3A as a TFF learning process: its stages, builder and registry entry.

Su, Li and Xue, "Domain Discrepancy Aware Distillation for Model Aggregation
in Federated Learning", AAAI 2023 (Algorithm 1): each client uploads, with
its model, the subspace projection P of its data's batch-mean features under
the global backbone (eq. 5); the server weights the client models per
unlabeled server sample by how close the sample's feature lies to each
client's subspace (eq. 6), and distils that weighted ensemble (eq. 7) into
the averaged model (eq. 8). The maths is `tff_kd.methods.fedd3a.fedd3a_tf`
and `tff_kd.methods.fedd3a.projection_tf`. One round:

1. distributor: broadcast the global `ModelWeights`;
2. client work (`build_client_work`): `fedd3a_tf.client_round` builds the
   projection P (eq. 5) from the received backbone's batch-mean features,
   then trains locally; the update is `{'delta': ModelWeights,
   'projection': [d, d], 'client_id': int32}`, weighted by the number of
   examples (client id: the first field of the data key, -1 for sequence
   data);
3. aggregator: FedDF's stacking aggregator
   (`tff_kd.federated.stacking.build_stacking_aggregator`): every client's
   delta, P and id reach the server as rows of an [M, ...] stack;
4. finalizer (`build_finalizer`), a server TF computation: the
   example-weighted mean delta is applied with the server optimiser (SGD
   lr 1: FedAvg's average, the student's start), then
   `fedd3a_tf.server_round` weights the client models per server sample
   (eq. 6), builds the eq. 7 target and distils it (eq. 8) through
   `tff_kd.core.distillation.distill`. The server's unlabeled pool is read
   from files (`ServerData`). Its state is the server-optimiser state and
   the round number (the 'random' weighting's seed).

Heterogeneous client models (the paper's "Application to Heterogeneous
Models", selected by `client_model_fns`; `build_hetero_client_work`,
`build_hetero_finalizer`): client k has architecture k % A and keeps its own
local model across rounds in a server-held
`tff_kd.federated.client_store.ClientStore` (one table per architecture, row
k // A: exactly K models, no padding; the simulation broadcasts all K
models to every client, a real client keeps its own). It builds P from the
received global backbone and trains its local model with CE + KD from the
received global model; the stack delivers every client's whole local model
(one zero-filled slot per other architecture: M x the sum of the
architectures' sizes), P, id and architecture; the finalizer distils the
eq. 7 ensemble of the clients' own models into the previous global model
(there is nothing to average across architectures).

State: `tff.learning.templates.LearningAlgorithmState` with one global
`ModelWeights`, so `get_model_weights` / `set_model_weights` are TFF's and
see the global model (`config.model`'s architecture). The heterogeneous
clients' own models live in the client work's state (`local_model_rows`).
"""

import collections
import functools
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd import models
from tff_kd.core import distill_hparams
from tff_kd.core import distillation as distillation_lib
from tff_kd.core import fused
from tff_kd.core import local_training
from tff_kd.core import stacking as stacking_tf
from tff_kd.core import teachers as teachers_tf
from tff_kd.federated import client_store
from tff_kd.federated import client_works
from tff_kd.federated import composer
from tff_kd.federated import execution
from tff_kd.federated import finalizers
from tff_kd.federated import learning
from tff_kd.federated import schedules
from tff_kd.federated import server_data as server_data_lib
from tff_kd.federated import stacking
from tff_kd.federated import tff_types
from tff_kd.methods import common
from tff_kd.methods.fedd3a import fedd3a_tf
from tff_kd.methods.fedd3a import hparams as hparams_lib
from tff_kd.models import names as model_names

ClassifierFn = Callable[[], models.Classifier]
ModelWeights = tff.learning.models.ModelWeights


def model_fn_of(classifier_fn: ClassifierFn) -> tff_types.ModelFn:
  """The Keras-model builder of a classifier builder."""
  return lambda: classifier_fn().model


def classifier_specs(classifier_fn: ClassifierFn):
  """(`ModelWeights` of `tf.TensorSpec`s, feature dim, input shape).

  Read off `local_training.structure_of(classifier_fn)`.
  """
  classifier = local_training.structure_of(classifier_fn)
  specs = tf.nest.map_structure(
      lambda v: tf.TensorSpec(v.shape, v.dtype),
      local_training.model_weights(classifier.model))
  return (specs, int(classifier.feature_dim),
          tuple(classifier.model.input_shape[1:]))


def _second_pass(data, dataset_fn: Optional[tff_types.DatasetFn]
                 ) -> Optional[tf.data.Dataset]:
  """The projection's own dataset: a keyed client builds its batches again
  from the key (the same batches as training's; `fedd3a_tf.client_round`)."""
  return None if dataset_fn is None else dataset_fn(data)


def build_client_work(
    classifier_fn: ClassifierFn,
    element_spec: collections.OrderedDict,
    client_optimizer: tff.learning.optimizers.Optimizer,
    hparams: hparams_lib.FedD3AHparams,
    *,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
    dataset_fn: Optional[tff_types.DatasetFn] = None,
    client_execution: execution.ClientExecution = execution.ONE_BY_ONE,
) -> tff.templates.MeasuredProcess:
  """FedD3A's client work: local SGD, and P with the received backbone.

  Same schedule, state and measurements as
  `tff_kd.federated.client_works.build_client_work`; `bytes_up` includes P.
  Grouped or fused clients (`client_execution`, keyed clients): the update
  is a `tff_kd.core.stacking.GroupRows` of G clients' updates; fused
  clients build P from the batches they trained on
  (`fedd3a_tf.fused_projections`).

  Args:
    classifier_fn: Builds the global `Classifier` (model, features, head).
    element_spec: Batch structure of the client datasets.
    client_optimizer: A `tff.learning.optimizers` optimizer.
    hparams: `config.fedd3a`: the ridge `alpha` of eq. 5 and the
      `projection_batches` P is built from (0: all).
    learning_rate: Client learning rate at round 0.
    learning_rate_decay: Multiplicative decay per round.
    dataset_fn: Key -> dataset function; None: clients receive sequences.
    client_execution: How each TFF client call runs its clients (grouped
      or fused: `dataset_fn`).

  Returns:
    A `tff.templates.MeasuredProcess` (a `ClientWorkProcess` for sequences).
  """
  weights_specs, d, _ = classifier_specs(classifier_fn)
  weights_type = tff_types.spec_to_type(weights_specs)
  group = client_execution.clients_per_call
  data_type = tff_types.client_data_type(
      element_spec, dataset_fn,
      clients_per_call=group if client_execution.grouped else 1)
  itemsize = np.dtype(np.float32).itemsize
  bytes_down = float(tff_types.payload_bytes(weights_type))
  # Up: the delta, P, the client id and the weight.
  bytes_up = bytes_down + d * d * itemsize + 2 * itemsize
  local_steps = execution.LocalSteps(client_optimizer, 0.0,
                                     (bytes_down, bytes_up))
  if client_execution.grouped:
    execution.check_execution(client_execution, model_fn_of(classifier_fn),
                              dataset_fn, local_steps)

  def one_client(classifier, weights, data, lr):
    client = tff_types.client_input(data, dataset_fn)
    dataset, client_id = client.dataset, client.client_id
    result = fedd3a_tf.client_round(
        classifier, client_optimizer, weights, dataset, lr,
        alpha=float(hparams.alpha),
        projection_batches=hparams.projection_batches,
        projection_dataset=_second_pass(data, dataset_fn))
    update = collections.OrderedDict(
        delta=result.local.weights_delta, projection=result.projection,
        client_id=client_id)
    return client_works.screen_client(
        tff.learning.templates.ClientResult(
            update=update, update_weight=result.local.num_examples),
        client_works.client_stats(result.local, bytes_down, bytes_up))[:2]

  def client_update(weights, data, lr):
    return one_client(classifier_fn(), weights, data, lr)

  def grouped_update(weights, keys, lr):
    classifier = classifier_fn()
    keys = tf.reshape(keys, [group])
    rows = execution.train_rows(
        client_execution, classifier.model, weights, keys, dataset_fn, lr,
        client_of_key=lambda key: one_client(classifier, weights, key, lr),
        local_steps=local_steps, row_specs=collections.OrderedDict(
            delta=weights_specs, projection=tf.TensorSpec([d, d]),
            client_id=tf.TensorSpec([], tf.int32)))
    values = rows.values
    if rows.batches is not None:
      present = rows.weights > 0
      projections = fedd3a_tf.fused_projections(
          classifier, weights, rows.batches.x, rows.batches.schedule.indices,
          rows.batches.schedule.mask, alpha=float(hparams.alpha),
          projection_batches=hparams.projection_batches)
      ids = tff_types.client_ids_of_keys(keys)
      values = collections.OrderedDict(
          delta=values,
          projection=fused.select(present, projections,
                                  tf.zeros_like(projections)),
          client_id=tf.where(present, ids, 0))
    return rows.client_result(values)

  return client_works.build_scheduled_client_work(
      tff.tensorflow.computation(weights_type, data_type, np.float32)(
          grouped_update if client_execution.grouped else client_update),
      learning_rate=learning_rate,
      learning_rate_decay=learning_rate_decay,
      sequence_data=dataset_fn is None)


def build_finalizer(
    classifier_fn: ClassifierFn,
    hparams: hparams_lib.FedD3AHparams,
    stack_type: tff.Type,
    server_optimizer: tff.learning.optimizers.Optimizer,
    distill_optimizer: tff.learning.optimizers.Optimizer,
    server_data: server_data_lib.ServerData,
    config: distill_hparams.DistillConfig,
    *,
    num_clients: int = 0,
) -> tff.templates.MeasuredProcess:
  """Averages the client deltas, then domain-aware ensemble distillation.

  Measurements (per round): `num_teachers`; `score_mean` (mean r_k over the
  round's clients and the pool); `weight_entropy` (mean over samples of the
  entropy of alpha, nats; ln M for uniform weights) and `weight_max` (mean
  largest weight); `projection_trace` (mean trace of the received P, the
  "soft rank" of the client subspaces); the distillation's `steps`,
  `first_loss`, `last_loss`; `teacher_seconds`, `distill_seconds`; and, when
  `num_clients` > 0, `client_weight_<k>` and `client_score_<k>` for every
  client id k: its mean weight / score over the pool (0 for clients not in
  the round; the weights sum to 1 over the round's clients). With a labeled
  server validation set: the accuracy on it of the eq. 7 ensemble
  (`ensemble_accuracy`), of the uniform one (`uniform_accuracy`) and of the
  student before and after distillation (`labeled_accuracy_before`,
  `labeled_accuracy_after`), and `accepted` (`DistillConfig.accept`).
  Always the link table (`tff_kd.core.links.NAMES`: on the labeled
  images, -1 without them; `target_entropy` on the pool), as every KD
  method reports it; its `labeled_accuracy_before` / `_after` are the
  distillation's above.

  Args:
    classifier_fn: Builds the global `Classifier`.
    hparams: `config.fedd3a`: `weighting` ('soft', 'onehot', 'avg' or
      'random'), `ensemble` ('probs', eq. 7, or 'logits') and
      `score_backbone` ('broadcast' or 'aggregated',
      `fedd3a_tf.server_round`).
    stack_type: Unplaced type of the stack the aggregator reports.
    server_optimizer: Applies the mean delta (SGD lr 1: the plain average).
    distill_optimizer: Student optimiser, fresh state every round.
    server_data: The unlabeled server pool, read from files.
    config: Distillation settings (validated).
    num_clients: K of the federation, for the per-client vectors (0: none).

  Returns:
    A `tff.templates.MeasuredProcess` with the finalizer signature.
  """
  model_fn = model_fn_of(classifier_fn)
  weights_specs, _, _ = classifier_specs(classifier_fn)
  weights_type = tff_types.spec_to_type(weights_specs)
  trainable_specs = tuple(weights_specs.trainable)
  num_slots = int(stack_type[1].shape[0])
  seed = int(config.seed)
  settings = fedd3a_tf.ServerSettings(hparams, config)

  @tff.tensorflow.computation
  def init_tf():
    return (server_optimizer.initialize(trainable_specs),
            tf.constant(0, tf.int32))

  state_type = init_tf.type_signature.result

  @finalizers.server_computation(state_type, weights_type, stack_type)
  def finalize_tf(state, global_weights, stack):
    opt_state, round_num = state
    stack = stacking_tf.Stack(*stack)
    valid = tf.range(num_slots) < stack.count
    values = stack.values
    new_opt_state, start = stacking_tf.server_update(
        server_optimizer, opt_state, global_weights, values['delta'],
        stacking_tf.example_weights(stack.weights, valid))
    result = fedd3a_tf.server_round(
        classifier_fn(), model_fn(), distill_optimizer,
        global_weights=global_weights, start_weights=start,
        uploads=fedd3a_tf.Uploads(values['delta'], values['projection'],
                                  valid),
        samples=fedd3a_tf.ServerSamples(server_data.read_pool(),
                                        server_data.read_validation()),
        settings=settings,
        seed=tf.stack([tf.constant(seed, tf.int64),
                       tf.cast(round_num, tf.int64)]))
    metrics = _round_metrics(result, stack, valid, num_clients,
                             bool(server_data.val_size))
    return (new_opt_state, round_num + 1), result.weights, metrics

  return finalizers.build_server_finalizer(init_tf, finalize_tf)


def _round_metrics(result: fedd3a_tf.ServerRound, stack: stacking_tf.Stack,
                   valid: tf.Tensor, num_clients: int, has_labeled: bool
                   ) -> collections.OrderedDict:
  """The finalizers' measurements (see `build_finalizer`)."""
  values = stack.values
  count = tf.maximum(tf.cast(stack.count, tf.float32), 1.0)
  w = result.teacher_weights
  traces = tf.linalg.trace(values['projection'])
  metrics = collections.OrderedDict(
      num_teachers=tf.cast(stack.count, tf.float32),
      score_mean=tf.reduce_sum(tf.reduce_mean(result.scores, 1)) / count,
      weight_entropy=distillation_lib.mean_entropy(w, axis=0),
      weight_max=tf.reduce_mean(tf.reduce_max(w, axis=0)),
      projection_trace=tf.reduce_sum(
          traces * tf.cast(valid, tf.float32)) / count,
      steps=tf.cast(result.distill.steps_run, tf.float32),
      first_loss=result.distill.first_loss,
      last_loss=result.distill.last_loss,
      teacher_seconds=result.teacher_seconds,
      distill_seconds=result.distill_seconds)
  if has_labeled:
    metrics.update(
        ensemble_accuracy=result.ensemble_accuracy,
        uniform_accuracy=result.uniform_accuracy,
        labeled_accuracy_before=result.distill.labeled_accuracy_before,
        labeled_accuracy_after=result.distill.labeled_accuracy_after,
        accepted=result.distill.accepted)
  # The student's two links are the distillation's own measurements above
  # where there is a labeled set.
  metrics.update((name, value) for name, value in result.links.items()
                 if name not in metrics)
  if num_clients > 0:
    ids = values['client_id']
    client_w = fedd3a_tf.per_client_mean(w, ids, valid, num_clients)
    client_r = fedd3a_tf.per_client_mean(result.scores, ids, valid,
                                         num_clients)
    for k in range(num_clients):
      metrics[f'client_weight_{k}'] = client_w[k]
      metrics[f'client_score_{k}'] = client_r[k]
  return metrics


# ---------------------------------------------------------------------------
# Heterogeneous client models.


def _weights_row(model_fn: tff_types.ModelFn) -> tuple:
  """A freshly built model's variables, trainable then non-trainable."""
  weights = local_training.model_weights(model_fn())
  return tuple(weights.trainable) + tuple(weights.non_trainable)


def _row_weights(row, num_trainable: int) -> ModelWeights:
  return ModelWeights(list(row[:num_trainable]), list(row[num_trainable:]))


def _row_flat(weights: ModelWeights) -> tuple:
  return tuple(weights.trainable) + tuple(weights.non_trainable)


def build_local_model_stores(client_model_fns: Sequence[tff_types.ModelFn],
                             num_clients: int
                             ) -> list[client_store.ClientStore]:
  """One `ClientStore` per client architecture.

  Client k uses architecture a = k % A and row k // A of store a, so store
  a has one row per client of that architecture (|{k < K: k % A = a}|) and
  the stores together hold exactly K models, without padding. Each row is
  a model's variables (trainable, then non-trainable), initialised to the
  architecture's seeded initial weights.
  """
  num_archs = len(client_model_fns)
  return [
      client_store.ClientStore(
          functools.partial(_weights_row, fn),
          len(range(a, num_clients, num_archs)), what='client')
      for a, fn in enumerate(client_model_fns)
  ]


def build_hetero_client_work(
    classifier_fn: ClassifierFn,
    client_model_fns: Sequence[tff_types.ModelFn],
    element_spec: collections.OrderedDict,
    client_optimizer: tff.learning.optimizers.Optimizer,
    dataset_fn: Optional[tff_types.DatasetFn],
    hparams: hparams_lib.FedD3AHparams,
    *,
    num_clients: int,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
) -> tff.templates.MeasuredProcess:
  """Heterogeneous FedD3A client work with the per-client model stores.

  State: `(round_num, stores)`, one `ClientStore` table per architecture
  (`build_local_model_stores`). Client k (id from its key) has
  architecture a = k % A; it reads its previous local model from row k // A
  of store a, runs `fedd3a_tf.hetero_client_round` (P from the received
  global backbone; CE + KD from the received global model), and its new
  local model is scattered back into the store. Update: `{'models': one
  whole `ModelWeights` per architecture (zero but the client's own),
  'projection', 'client_id', 'architecture'}`, weighted by its examples.
  Measurements: `client_works.client_measurements`.

  Traffic (`bytes_down` / `bytes_up`) counts what a real client moves: the
  global model and its own local model down (the store row; a client that
  kept its model on its device would skip that part), its own local model,
  P, its id, architecture and weight up. Not counted: the simulation's
  broadcast of every store and the other architectures' zero slots.

  Args:
    classifier_fn: Builds the global `Classifier`.
    client_model_fns: One Keras model builder (logits) per architecture.
    element_spec: Batch structure of the client datasets.
    client_optimizer: A `tff.learning.optimizers` optimizer.
    dataset_fn: Key -> dataset (the fast path: the key carries the client
      id), or None: clients take `OrderedDict(client_id=int32,
      data=<dataset>)`.
    hparams: `config.fedd3a`: the ridge `alpha` of eq. 5, the
      `projection_batches` P is built from (0: all), and the local loss's
      `kd_weight` and `kd_temperature`.
    num_clients: K; client ids must lie in [0, K).
    learning_rate: Client learning rate at round 0.
    learning_rate_decay: Multiplicative decay per round.

  Returns:
    A `tff.templates.MeasuredProcess` (clients take keys).
  """
  num_archs = len(client_model_fns)
  stores = build_local_model_stores(client_model_fns, num_clients)
  num_trainable = [len(local_training.structure_of(fn).trainable_weights)
                   for fn in client_model_fns]
  weights_specs, d, _ = classifier_specs(classifier_fn)
  weights_type = tff_types.spec_to_type(weights_specs)
  data_type = tff_types.client_data_type(element_spec, dataset_fn,
                                        with_id=True)
  itemsize = np.dtype(np.float32).itemsize
  global_bytes = float(tff_types.payload_bytes(weights_type))
  model_bytes = [s.row_bytes for s in stores]
  # Up besides the local model: P, the id, the architecture and the weight.
  extra_up = d * d * itemsize + 3 * itemsize

  def client_fn(global_weights, data, lr, round_num, tables):
    del round_num  # Unused by FedD3A.
    client = tff_types.client_input(data, dataset_fn)
    client_id = client.client_id
    architecture = tff_types.prototype_of_id(client_id, num_archs)
    own = [tf.equal(architecture, a) for a in range(num_archs)]
    # Only the own architecture's index is checked; others read row 0.
    indices = [tf.where(own[a], client_id // num_archs, 0)
               for a in range(num_archs)]
    local_weights = [
        _row_weights(store.read(table, index), n)
        for store, table, index, n in zip(stores, tables, indices,
                                          num_trainable)]
    result = fedd3a_tf.hetero_client_round(
        classifier_fn(), [fn() for fn in client_model_fns], client_optimizer,
        global_weights, local_weights, client.dataset, lr,
        architecture=architecture, hparams=hparams,
        projection_dataset=_second_pass(data, dataset_fn))
    uploads = tuple(
        tf.nest.map_structure(lambda v, o=o: v * tf.cast(o, v.dtype), w)
        for w, o in zip(result.weights, own))
    update = collections.OrderedDict(
        models=uploads, projection=result.projection, client_id=client_id,
        architecture=architecture)
    own_bytes = tf.gather(tf.constant(model_bytes, tf.float32), architecture)
    client_result, stats, keep = client_works.screen_client(
        tff.learning.templates.ClientResult(
            update=update, update_weight=result.local.num_examples),
        client_works.client_stats(result.local, global_bytes + own_bytes,
                              own_bytes + extra_up))
    # An excluded client's local model is not stored either.
    entries = tuple(
        store.entry(_row_flat(w), index,
                    tf.cast(tf.logical_and(o, keep), tf.float32))
        for store, w, index, o in zip(stores, result.weights, indices, own))
    return client_store.ClientOutput(client_result, stats, entries)

  return client_store.build_stateful_client_work(
      client_fn, stores, weights_type, data_type, learning_rate,
      learning_rate_decay)


def build_hetero_finalizer(
    classifier_fn: ClassifierFn,
    client_model_fns: Sequence[tff_types.ModelFn],
    hparams: hparams_lib.FedD3AHparams,
    stack_type: tff.Type,
    distill_optimizer: tff.learning.optimizers.Optimizer,
    server_data: server_data_lib.ServerData,
    config: distill_hparams.DistillConfig,
    *,
    num_clients: int = 0,
) -> tff.templates.MeasuredProcess:
  """Domain-aware distillation of heterogeneous client models.

  `fedd3a_tf.hetero_server_round` from the previous global model (no
  average). State: the round number (the 'random' weighting's seed).
  Measurements: those of `build_finalizer`, plus `num_teachers_a<i>`, the
  round's clients of architecture i.

  Args:
    classifier_fn: Builds the global `Classifier`.
    client_model_fns: One Keras model builder per client architecture.
    hparams: `config.fedd3a`: `weighting` ('soft', 'onehot', 'avg' or
      'random') and `ensemble` ('probs', eq. 7, or 'logits').
    stack_type: Unplaced type of the stack the aggregator reports.
    distill_optimizer: Student optimiser, fresh state every round.
    server_data: The unlabeled server pool, read from files.
    config: Distillation settings (validated).
    num_clients: K, for the per-client vectors (0: none).

  Returns:
    A `tff.templates.MeasuredProcess` with the finalizer signature.
  """
  weights_specs, _, _ = classifier_specs(classifier_fn)
  weights_type = tff_types.spec_to_type(weights_specs)
  num_slots = int(stack_type[1].shape[0])
  seed = int(config.seed)
  settings = fedd3a_tf.ServerSettings(hparams, config)

  @tff.tensorflow.computation
  def init_tf():
    return tf.constant(0, tf.int32)

  @finalizers.server_computation(np.int32, weights_type, stack_type)
  def finalize_tf(round_num, global_weights, stack):
    stack = stacking_tf.Stack(*stack)
    valid = tf.range(num_slots) < stack.count
    values = stack.values
    result = fedd3a_tf.hetero_server_round(
        classifier_fn(), [fn() for fn in client_model_fns],
        distill_optimizer, start_weights=global_weights,
        uploads=fedd3a_tf.Uploads(values['models'], values['projection'],
                                  valid, values['architecture']),
        samples=fedd3a_tf.ServerSamples(server_data.read_pool(),
                                        server_data.read_validation()),
        settings=settings,
        seed=tf.stack([tf.constant(seed, tf.int64),
                       tf.cast(round_num, tf.int64)]))
    metrics = _round_metrics(result, stack, valid, num_clients,
                             bool(server_data.val_size))
    for a in range(len(client_model_fns)):
      metrics[f'num_teachers_a{a}'] = tf.reduce_sum(tf.cast(
          tf.logical_and(valid, tf.equal(values['architecture'], a)),
          tf.float32))
    return round_num + 1, result.weights, metrics

  return finalizers.build_server_finalizer(init_tf, finalize_tf)


def build_fedd3a_process(
    classifier_fn: ClassifierFn,
    element_spec: collections.OrderedDict,
    *,
    server_data: server_data_lib.ServerData,
    clients_per_round: int,
    training: learning.Training,
    distillation: distillation_lib.Distillation,
    hparams: hparams_lib.FedD3AHparams = hparams_lib.FedD3AHparams(),
    num_clients: int = 0,
    dataset_fn: Optional[tff_types.DatasetFn] = None,
    client_model_fns: Sequence[tff_types.ModelFn] = (),
) -> tff.learning.templates.LearningProcess:
  """Builds FedD3A.

  Args:
    classifier_fn: No-arg builder of the global `tff_kd.models.Classifier`
      (logits model plus its shared-variable backbone `features`).
    element_spec: Batch structure of the client datasets.
    server_data: The server's unlabeled pool (another domain).
    clients_per_round: M, the most clients per round (stack rows).
    training: The client optimiser and learning-rate schedule, and the
      server optimiser that applies the mean delta before distillation
      (`build_sgdm(1.0)`: the plain average, Algorithm 1 line 7; unused
      with heterogeneous clients).
    distillation: The student optimiser and the distillation settings.
    hparams: `config.fedd3a` (`hparams_lib.FedD3AHparams`: alpha,
      weighting, ensemble, projection_batches, score_backbone; kd_weight
      and kd_temperature for heterogeneous clients, whose models
      `client_models` names and `client_model_fns` builds).
    num_clients: K of the federation, for the per-client weight report (0:
      no report); with heterogeneous clients, the rows of the local-model
      store (required, >= the number of architectures).
    dataset_fn: Key -> dataset function (clients then receive keys, and the
      per-client report knows their ids; required with heterogeneous
      clients).
    client_model_fns: Empty: homogeneous FedD3A. Otherwise one Keras model
      builder (logits) per client architecture; client k uses entry
      k % len(client_model_fns). Same input shape and classes as the
      global model. With heterogeneous clients, both of
      `hparams.score_backbone`'s backbones are the previous global model.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ConfigError: a bad hyper-parameter (alpha <= 0, unknown weighting, ...).
    DataError: a server pool whose images do not match the model input.
  """
  distillation.config.check_labeled(server_data.val_size)
  schedules.check_schedule(training.learning_rate,
                           training.learning_rate_decay)
  if (isinstance(clients_per_round, bool) or
      not isinstance(clients_per_round, int) or clients_per_round < 1):
    raise errors.ConfigError(
        f'clients_per_round must be >= 1, got {clients_per_round!r}')
  if not isinstance(num_clients, int) or num_clients < 0:
    raise errors.ConfigError(f'num_clients must be >= 0, got {num_clients!r}')
  model_fn = model_fn_of(classifier_fn)
  client_model_fns = tuple(client_model_fns)
  client_execution = training.client_execution
  if client_model_fns and client_execution.grouped:
    raise model_names.grouped_clients_error(
        hparams_lib.HETERO_UNGROUPED, client_execution.clients_per_call,
        client_execution.mode)
  if client_model_fns:
    if num_clients < len(client_model_fns):
      raise errors.ConfigError(
          f'heterogeneous fedd3a keeps one local model per client: '
          f'num_clients must be >= the {len(client_model_fns)} client '
          f'architectures, got {num_clients}')
    teachers_tf.check_models((model_fn,) + client_model_fns,
                             server_data.image_shape,
                             what='fedd3a global and client models')
    client_work = build_hetero_client_work(
        classifier_fn, client_model_fns, element_spec,
        training.client_optimizer, dataset_fn, hparams,
        num_clients=num_clients, learning_rate=training.learning_rate,
        learning_rate_decay=training.learning_rate_decay)
  else:
    _, _, input_shape = classifier_specs(classifier_fn)
    fedd3a_tf.check_pool(server_data.image_shape, input_shape)
    client_work = build_client_work(
        classifier_fn, element_spec, training.client_optimizer, hparams,
        learning_rate=training.learning_rate,
        learning_rate_decay=training.learning_rate_decay,
        dataset_fn=dataset_fn, client_execution=client_execution)
  aggregator, stack_type = stacking.build_client_stack(
      client_work, clients_per_round, client_execution)
  if client_model_fns:
    finalizer = build_hetero_finalizer(
        classifier_fn, client_model_fns, hparams, stack_type,
        distillation.optimizer, server_data, distillation.config,
        num_clients=num_clients)
  else:
    finalizer = build_finalizer(
        classifier_fn, hparams, stack_type, training.server_optimizer,
        distillation.optimizer, server_data, distillation.config,
        num_clients=num_clients if dataset_fn is not None else 0)
  weights_type = client_work.next.type_signature.parameter[1].member
  return composer.compose_learning_process(
      learning.build_initial_weights_fn(model_fn),
      tff.learning.templates.build_broadcast_process(weights_type),
      client_work, aggregator, finalizer)


def local_model_rows(state, architecture: int) -> list[np.ndarray]:
  """The heterogeneous clients' stored local models of one architecture.

  Returns the store's leaves (trainable, then non-trainable variables of
  the architecture's model), each [R, ...] with row r holding client
  r * A + architecture.
  """
  return [np.asarray(v) for v in state.client_work[1][architecture]]


def build_from_settings(
    inputs: common.ProcessInputs, settings: common.Settings
) -> tff.learning.templates.LearningProcess:
  """The registry's builder: fedd3a from the run's validated settings."""
  if inputs.server_data is None or not inputs.server_data.pool_size:
    raise errors.ConfigError(
        'fedd3a needs an unlabeled server pool: set server_data.proxy (a '
        'held-out domain) and server_data.proxy_size')
  if inputs.classifier_fn is None:
    raise errors.ConfigError(
        'fedd3a needs a classifier_fn (the backbone whose features define '
        'the client subspaces)')
  f = settings.hparams
  # Heterogeneous clients (`fedd3a.client_models` non-empty): client k uses
  # entry k % A; the global model stays `model`'s architecture.
  # Entry i starts from `client_weights` entry i (pretrained weights are
  # read and checked here, before the process is built).
  input_shape = tuple(inputs.element_spec['x'].shape[1:])
  client_model_fns = tuple(
      models.model_fn_of(models.classifier_builder(
          name, input_shape=input_shape, num_classes=inputs.num_classes,
          norm=norm, seed=settings.run.seed, weights=weights,
          what=f'fedd3a.client_weights entry {i}',
          data_dir=settings.dataset.data_dir,
          manual_dir=settings.dataset.manual_dir or None))
      for i, ((name, norm), weights) in enumerate(zip(
          models.parse_model_list(f.client_models,
                                  default_norm=settings.model.norm,
                                  key='fedd3a.client_models'),
          models.parse_weights_list(f.client_weights, f.client_models,
                                    key='fedd3a.client_weights'))))
  return build_fedd3a_process(
      inputs.classifier_fn, inputs.element_spec,
      server_data=inputs.server_data,
      clients_per_round=settings.run.clients_per_round,
      distillation=distillation_lib.Distillation(
          optimizer=tff.learning.optimizers.build_adam(
              learning_rate=settings.distill.learning_rate),
          config=settings.distill),
      training=common.training(settings, inputs), hparams=f,
      num_clients=inputs.num_clients, dataset_fn=inputs.dataset_fn,
      client_model_fns=client_model_fns)


METHOD = common.Method(
    'fedd3a', build_from_settings,
    'FedD3A domain-aware distillation (Su et al., 2023)',
    needs_server_data=True, hparams=hparams_lib.FedD3AHparams,
    uses_distill=True, groups_clients=True, fuses_clients=True,
    smoke={'fedd3a.variant': 'paper',
           'server_data.proxy': 'split', 'server_data.proxy_size': 100,
           'distill.steps': 5, 'distill.batch_size': 32,
           'distill.val_fraction': 0.0})
