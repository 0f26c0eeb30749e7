"""FedDF as a TFF learning process: its stages, builder and registry entry.

Lin, Kong, Stich and Jaggi, "Ensemble Distillation for Robust Model Fusion
in Federated Learning", NeurIPS 2020 (Algorithms 1 and 3): FedAvg's round,
then server-side ensemble distillation of every received client model
(AVGLOGITS, optionally after drop-worst) on an unlabeled proxy pool into
each architecture prototype's averaged model. The maths is
`tff_kd.methods.feddf.feddf_tf`. One round, with P architecture prototypes
(P = 1 is the homogeneous Algorithm 1):

1. distributor: broadcast the P global models, a struct of P `ModelWeights`
   (in a real deployment a client downloads only its own prototype's model;
   `bytes_down` counts that);
2. client work (`build_prototype_client_work`): a client's prototype is
   `int(client_id) % P` (from its key `"<id>|<seed>|<round>"`); it trains
   that prototype with `local_training.train_locally` and returns a struct of
   P deltas, zero for the other prototypes (trained on an empty dataset),
   plus its prototype index, weighted by its number of examples;
3. aggregator (`tff_kd.federated.stacking.build_stacking_aggregator`): a
   `tff.federated_aggregate` whose accumulator is a fixed-size [M, ...]
   stack (M = clients per round): each client's update lands in its own row
   (`tff_kd.core.stacking.Stack`), so the server receives every client
   model, not only their mean;
4. finalizer (`build_fusion_finalizer`), a server TF computation: per
   prototype, the example-weighted mean delta of its clients is applied with
   the server optimiser (SGD lr 1: FedAvg's average x_{t,0}^P); the proxy
   pool and the labeled validation set are read from files (`ServerData`);
   every received client model is a teacher; the AVGLOGITS target
   (optionally after drop-worst) is distilled into each prototype's student
   (`feddf_tf.fuse`, which calls `tff_kd.core.distillation.distill`).

State: `tff.learning.templates.LearningAlgorithmState` whose
`global_model_weights` is a tuple of one `ModelWeights` per prototype (one
element for homogeneous FedDF). `get_model_weights` / `set_model_weights`
must use a single `ModelWeights` (TFF's signature, and what the program's
evaluation and export consume), so they read and write the *first*
prototype's model; read every prototype's model with `prototype_weights`.

Why a stack and not one-hot slots in a federated sum, or summed predictions
on a broadcast batch: the stack sends each model once, sums nothing it does
not need, and keeps teacher evaluation at the server, where the proxy pool
is; `tff.federated_aggregate` runs in TFF's local C++ context, so no
key-encoded slot index is needed. Its size is fixed when the process is
built: more clients than M fail with a clear error; fewer leave zero rows
that are masked out.
"""

import collections
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.core import distill_hparams
from tff_kd.core import distillation as distillation_lib
from tff_kd.core import local_training
from tff_kd.core import stacking as stacking_tf
from tff_kd.core import teachers as teachers_tf
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
from tff_kd.methods.feddf import feddf_tf
from tff_kd.methods.feddf import hparams as hparams_lib
from tff_kd.models import names as model_names

ModelFn = tff_types.ModelFn


def prototypes_weights_type(model_fns: Sequence[ModelFn]) -> tff.Type:
  """TFF type of the server model: one `ModelWeights` per prototype."""
  return tff_types.spec_to_type(tuple(
      local_training.model_weights(local_training.structure_of(fn))
      for fn in model_fns))


def build_initial_weights_fn(model_fns: Sequence[ModelFn]) -> tff.Computation:
  """A no-arg TFF computation returning every prototype's initial weights."""

  @tff.tensorflow.computation
  def initial_weights():
    return tuple(local_training.model_weights(fn()) for fn in model_fns)

  return initial_weights


def build_prototype_client_work(
    model_fns: Sequence[ModelFn],
    element_spec: collections.OrderedDict,
    client_optimizer: tff.learning.optimizers.Optimizer,
    *,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
    dataset_fn: Optional[tff_types.DatasetFn] = None,
    client_execution: execution.ClientExecution = execution.ONE_BY_ONE,
) -> tff.templates.MeasuredProcess:
  """Local training of each client's own prototype.

  Same schedule, measurements and state (the round number) as
  `tff_kd.federated.client_works.build_client_work`. The update is
  `{'deltas': (ModelWeights,) * P, 'prototype': int32}`; the deltas of the
  prototypes a client does not train are zero. With G > 1 clients per
  call (`client_execution`, one prototype, keyed clients), it is a
  `tff_kd.core.stacking.GroupRows` of G such updates, trained in turn or
  fused (`execution.train_rows`).

  Args:
    model_fns: One model builder per prototype.
    element_spec: Batch structure of the client datasets.
    client_optimizer: A `tff.learning.optimizers` optimizer.
    learning_rate: Client learning rate at round 0.
    learning_rate_decay: Multiplicative decay per round.
    dataset_fn: Key -> dataset function (the fast path). Without it,
      clients receive sequences (P = 1), or with several prototypes
      `OrderedDict(client_id=int32, data=<dataset>)`: a client trains
      prototype `client_id % P`.
    client_execution: How each TFF client call runs its clients (grouped
      or fused: P = 1 and `dataset_fn`).

  Returns:
    A `tff.templates.MeasuredProcess`.

  Raises:
    ConfigError: grouped or fused clients with several prototypes.
  """
  num_prototypes = len(model_fns)
  weights_type = prototypes_weights_type(model_fns)
  if client_execution.grouped:
    if num_prototypes > 1:
      raise model_names.grouped_clients_error(
          f'feddf trains {num_prototypes} prototypes',
          client_execution.clients_per_call, client_execution.mode)
    return _grouped_client_work(
        model_fns[0], element_spec, client_optimizer,
        learning_rate=learning_rate, learning_rate_decay=learning_rate_decay,
        dataset_fn=dataset_fn, client_execution=client_execution)
  data_type = tff_types.client_data_type(element_spec, dataset_fn,
                                        with_id=num_prototypes > 1)
  # What a real client moves: its own prototype down; it, its weight and its
  # prototype index up.
  sizes = [float(tff_types.payload_bytes(t)) for t in weights_type]
  extra_up = 2 * np.dtype(np.float32).itemsize

  @tff.tensorflow.computation(weights_type, data_type, np.float32)
  def client_update(weights, data, lr):
    client = tff_types.client_input(data, dataset_fn)
    dataset = client.dataset
    prototype = tff_types.prototype_of_id(client.client_id, num_prototypes)
    results = []
    for p, model_fn in enumerate(model_fns):
      # take(-1) is the whole dataset, take(0) none: a zero delta.
      count = tf.where(tf.equal(prototype, p), tf.constant(-1, tf.int64),
                       tf.constant(0, tf.int64))
      results.append(local_training.train_locally(
          model_fn(), client_optimizer, weights[p], dataset.take(count), lr))
    num_examples = tf.add_n([r.num_examples for r in results])
    update = collections.OrderedDict(
        deltas=tuple(r.weights_delta for r in results), prototype=prototype)
    model_bytes = tf.gather(tf.constant(sizes, tf.float32), prototype)
    total = local_training.LocalResult(
        weights_delta=None, num_examples=num_examples,
        loss_sum=tf.add_n([r.loss_sum for r in results]),
        num_steps=tf.add_n([r.num_steps for r in results]))
    return client_works.screen_client(
        tff.learning.templates.ClientResult(
            update=update, update_weight=num_examples),
        client_works.client_stats(total, model_bytes, model_bytes + extra_up))[:2]

  return client_works.build_scheduled_client_work(
      client_update, learning_rate=learning_rate,
      learning_rate_decay=learning_rate_decay)


def _grouped_client_work(
    model_fn: ModelFn, element_spec: collections.OrderedDict,
    client_optimizer: tff.learning.optimizers.Optimizer, *,
    learning_rate: float, learning_rate_decay: float,
    dataset_fn: Optional[tff_types.DatasetFn],
    client_execution: execution.ClientExecution
) -> tff.templates.MeasuredProcess:
  """`build_prototype_client_work` of one prototype with G clients per
  call: their updates are the rows of a `GroupRows`, with the same bytes
  per client."""
  group = client_execution.clients_per_call
  weights_type = prototypes_weights_type((model_fn,))
  data_type = tff_types.client_data_type(element_spec, dataset_fn,
                                        clients_per_call=group)
  model_bytes = float(tff_types.payload_bytes(weights_type[0]))
  local_steps = execution.LocalSteps(
      client_optimizer, 0.0,
      (model_bytes, model_bytes + 2 * np.dtype(np.float32).itemsize))
  execution.check_execution(client_execution, model_fn, dataset_fn,
                            local_steps)

  @tff.tensorflow.computation(weights_type, data_type, np.float32)
  def client_update(weights, keys, lr):
    model = model_fn()
    one_client = client_works.local_client(local_steps)
    rows = execution.train_rows(
        client_execution, model, weights[0], tf.reshape(keys, [group]),
        dataset_fn, lr, local_steps=local_steps,
        client_of_key=lambda key: one_client(model, weights[0],
                                             dataset_fn(key), lr))
    return rows.client_result(collections.OrderedDict(
        deltas=(rows.values,), prototype=tf.zeros([group], tf.int32)))

  return client_works.build_scheduled_client_work(
      client_update, learning_rate=learning_rate,
      learning_rate_decay=learning_rate_decay)


def _prototype_suffix(p: int, num_prototypes: int) -> str:
  return '' if num_prototypes == 1 else f'_p{p}'


# The link-table entries that are each prototype's own.
_STUDENT_LINKS = ('labeled_accuracy_before', 'labeled_accuracy_after')


def build_fusion_finalizer(
    model_fns: Sequence[ModelFn],
    stack_type: tff.Type,
    server_optimizer: tff.learning.optimizers.Optimizer,
    distill_optimizer: tff.learning.optimizers.Optimizer,
    server_data: server_data_lib.ServerData,
    config: distill_hparams.DistillConfig,
    *,
    drop_worst: bool,
) -> tff.templates.MeasuredProcess:
  """Averages within each prototype, then distills all teachers into each.

  State: one server-optimiser state per prototype. Measurements (per round):
  `num_teachers`, `teachers_kept` (after drop-worst), the wall
  `teacher_seconds` and `distill_seconds`, `samples_per_second` of the
  distillation loops, the round's link table (`tff_kd.core.links.NAMES`:
  `ensemble_labeled_accuracy` is AVGLOGITS over the kept teachers; -1
  without a validation set), and per prototype (suffix `_p<i>` when P > 1)
  `num_clients`, `steps`, `first_loss`, `last_loss` and its student's
  `labeled_accuracy_before` / `labeled_accuracy_after`.

  Args:
    model_fns: One model builder per prototype.
    stack_type: Unplaced type of the `Stack` the aggregator reports.
    server_optimizer: Applies each prototype's mean delta (SGD lr 1 gives
      FedAvg's average, FedDF's starting point).
    distill_optimizer: Student optimiser (FedDF: Adam 1e-3); fresh state
      every round.
    server_data: The proxy pool and validation set, read from files in the
      computation.
    config: Distillation settings (validated).
    drop_worst: Apply drop-worst (needs a validation set).

  Returns:
    A `tff.templates.MeasuredProcess` with the finalizer signature.
  """
  num_prototypes = len(model_fns)
  weights_type = prototypes_weights_type(model_fns)
  num_slots = int(stack_type[1].shape[0])
  trainable_specs = [tuple(tff_types.tensor_specs(t.trainable))
                     for t in weights_type]
  n_train = server_data.pool_size
  if config.val_fraction > 0:
    n_train -= max(1, int(np.floor(config.val_fraction *
                                   server_data.pool_size)))
  samples_per_step = float(min(config.batch_size, n_train))

  @tff.tensorflow.computation
  def init_tf():
    return tuple(server_optimizer.initialize(s) for s in trainable_specs)

  opt_state_type = init_tf.type_signature.result

  @finalizers.server_computation(opt_state_type, weights_type, stack_type)
  def fuse_tf(opt_states, global_weights, stack):
    stack = stacking_tf.Stack(*stack)
    filled = tf.range(num_slots) < stack.count
    prototypes, new_states, num_clients = [], [], []
    for p, model_fn in enumerate(model_fns):
      g = global_weights[p]
      deltas = stack.values['deltas'][p]
      valid = tf.logical_and(filled,
                             tf.equal(stack.values['prototype'], p))
      # No client of this prototype: it keeps its model and optimiser state.
      state, start = stacking_tf.server_update(
          server_optimizer, opt_states[p], g, deltas,
          stacking_tf.example_weights(stack.weights, valid))
      new_states.append(state)
      prototypes.append(feddf_tf.Prototype(
          student=model_fn(), teacher=model_fn(), global_weights=g,
          deltas=deltas, valid=valid, start_weights=start))
      num_clients.append(tf.reduce_sum(tf.cast(valid, tf.float32)))
    validation = server_data.read_validation()
    val_x, val_y = validation if validation is not None else (None, None)
    result = feddf_tf.fuse(prototypes, distill_optimizer,
                           server_data.read_pool(), config, val_x=val_x,
                           val_y=val_y, drop_worst=drop_worst)
    steps = [tf.cast(r.steps_run, tf.float32) for r in result.distill]
    metrics = collections.OrderedDict(
        num_teachers=tf.cast(result.num_teachers, tf.float32),
        teachers_kept=tf.cast(result.teachers_kept, tf.float32),
        teacher_seconds=result.teacher_seconds,
        distill_seconds=result.distill_seconds,
        samples_per_second=tf.add_n(steps) * samples_per_step / tf.maximum(
            result.distill_seconds, 1e-6))
    # The teachers' and the ensemble's links are the same for every
    # prototype: reported once; each student's are its own.
    metrics.update((name, value) for name, value in result.links[0].items()
                   if name not in _STUDENT_LINKS)
    for p in range(num_prototypes):
      sfx = _prototype_suffix(p, num_prototypes)
      r = result.distill[p]
      metrics[f'num_clients{sfx}'] = num_clients[p]
      metrics[f'steps{sfx}'] = steps[p]
      metrics[f'first_loss{sfx}'] = r.first_loss
      metrics[f'last_loss{sfx}'] = r.last_loss
      for name in _STUDENT_LINKS:
        metrics[f'{name}{sfx}'] = result.links[p][name]
    return tuple(new_states), tuple(result.weights), metrics

  return finalizers.build_server_finalizer(init_tf, fuse_tf)


def build_feddf_process(
    model_fns: Sequence[tff_types.ModelFn],
    element_spec: collections.OrderedDict,
    *,
    server_data: server_data_lib.ServerData,
    clients_per_round: int,
    training: learning.Training,
    distillation: distillation_lib.Distillation,
    hparams: hparams_lib.FedDFHparams = hparams_lib.FedDFHparams(),
    dataset_fn: Optional[tff_types.DatasetFn] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds FedDF with one or several architecture prototypes.

  Args:
    model_fns: One no-arg Keras classifier builder per prototype (logits);
      client i trains prototype i % len(model_fns). All must have the same
      input shape and number of classes.
    element_spec: Batch structure of the client datasets.
    server_data: The server's proxy pool (and labeled validation set).
    clients_per_round: M, the most clients per round (teacher slots).
    training: The client optimiser and learning-rate schedule, and the
      server optimiser applied to each prototype's mean delta before
      distillation (`build_sgdm(1.0)`: the plain average, as in FedDF).
    distillation: The student optimiser (FedDF: Adam, lr 1e-3) and the
      distillation settings (steps, batch, T, clipping, early stopping,
      cosine decay).
    hparams: `config.feddf`: `drop_worst` drops teachers at or below
      random-guess accuracy on the server validation set (needs
      `server_data.val_size > 0`); `prototypes` is what `model_fns` were
      built from.
    dataset_fn: Key -> dataset function (the fast path), or None: clients
      take datasets, and with several prototypes `OrderedDict(client_id,
      data)` (a client's prototype is its id modulo their number).

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ConfigError: bad settings (e.g. zero distillation steps).
    DataError: proxy images whose shape does not match the models.
  """
  model_fns = tuple(model_fns)
  if not model_fns:
    raise errors.ConfigError('feddf needs at least one model prototype')
  schedules.check_schedule(training.learning_rate,
                           training.learning_rate_decay)
  if not isinstance(clients_per_round, int) or clients_per_round < 1:
    raise errors.ConfigError(
        f'clients_per_round must be >= 1, got {clients_per_round!r}')
  distillation.config.check_labeled(server_data.val_size)
  if hparams.drop_worst and not server_data.val_size:
    raise errors.ConfigError(
        'feddf.drop_worst needs a labeled server validation set '
        '(server_data.val_size > 0)')
  teachers_tf.check_models(model_fns, server_data.image_shape)

  client_work = build_prototype_client_work(
      model_fns, element_spec, training.client_optimizer,
      learning_rate=training.learning_rate,
      learning_rate_decay=training.learning_rate_decay, dataset_fn=dataset_fn,
      client_execution=training.client_execution)
  aggregator, stack_type = stacking.build_client_stack(
      client_work, clients_per_round, training.client_execution)
  finalizer = build_fusion_finalizer(
      model_fns, stack_type, training.server_optimizer,
      distillation.optimizer, server_data, distillation.config,
      drop_worst=hparams.drop_worst)
  weights_type = prototypes_weights_type(model_fns)
  process = composer.compose_learning_process(
      build_initial_weights_fn(model_fns),
      tff.learning.templates.build_broadcast_process(weights_type),
      client_work, aggregator, finalizer)
  return composer.first_model_view(process)


def prototype_weights(state) -> list[tff.learning.models.ModelWeights]:
  """Every prototype's global `ModelWeights` from a FedDF process state."""
  return composer.global_models(state)


def with_prototype_weights(
    state, weights: Sequence[tff.learning.models.ModelWeights]):
  """A state whose prototypes' models are replaced by `weights` (in order).

  `process.set_model_weights` only reaches prototype 0; this rebuilds the
  Python state for all of them.
  """
  current = list(state.global_model_weights)
  if len(weights) != len(current):
    raise errors.ConfigError(
        f'{len(weights)} weights given for {len(current)} prototypes')
  new = tuple(
      tff.learning.models.ModelWeights(
          trainable=[np.asarray(v) for v in w.trainable],
          non_trainable=[np.asarray(v) for v in w.non_trainable])
      for w in weights)
  return tff.learning.templates.LearningAlgorithmState(
      new, state.distributor, state.client_work, state.aggregator,
      state.finalizer)


def build_from_settings(
    inputs: common.ProcessInputs, settings: common.Settings
) -> tff.learning.templates.LearningProcess:
  """The registry's builder: feddf from the run's validated settings."""
  if inputs.server_data is None or not inputs.server_data.pool_size:
    raise errors.ConfigError(
        'feddf needs a proxy pool: set server_data.proxy (and proxy_size)')
  return build_feddf_process(
      inputs.prototype_fns or (inputs.model_fn,), inputs.element_spec,
      server_data=inputs.server_data,
      clients_per_round=settings.run.clients_per_round,
      distillation=distillation_lib.Distillation(
          optimizer=tff.learning.optimizers.build_adam(
              learning_rate=settings.distill.learning_rate),
          config=settings.distill),
      training=common.training(settings, inputs), hparams=settings.hparams,
      dataset_fn=inputs.dataset_fn)


METHOD = common.Method(
    'feddf', build_from_settings,
    'FedDF ensemble distillation (Lin et al., 2020)', needs_server_data=True,
    hparams=hparams_lib.FedDFHparams, uses_distill=True,
    distill_defaults=hparams_lib.DISTILL_DEFAULTS,
    global_model_per_architecture=True, groups_clients=True,
    fuses_clients=True,
    smoke={'server_data.proxy': 'split', 'server_data.proxy_size': 100,
           'distill.steps': 5, 'distill.batch_size': 32,
           'distill.val_fraction': 0.0})
