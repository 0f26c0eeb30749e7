"""Composes distributor, client work, aggregator and finalizer into a process.

The same four-stage round as `tff.learning.templates.compose_learning_process`
(McMahan et al., AISTATS 2017's FedAvg written as stages), with the same
`tff.learning.templates.LearningAlgorithmState`, so TFF's own tooling reads
the state and `get_model_weights` / `set_model_weights` work as for
`tff.learning.algorithms.build_weighted_fed_avg`. One difference: the client
work may take any CLIENTS-placed data, not only sequences. tff_kd's clients
receive a short string key and build their datasets inside their own
TensorFlow computation (`tff_kd.federated.tff_types.client_data_type`), which
TFF's composer rejects.

The stages are checked as TFF's composer checks them (each output fits the
next stage's input), except for the client data's type.

A round: broadcast the global weights; run the client work; aggregate its
updates; the finalizer turns the aggregate into new global weights (for KD
methods, this is where server-side distillation happens).

The composed process is a `ComposedProcess`: a `LearningProcess` that also
holds its stages (`Stages`) as a declared field and can be recomposed with
another finalizer (`with_finalizer`), which
`tff_kd.runtime.server_stage` uses to run a KD method's server step
outside the runtime.
"""

import collections
from typing import Callable, NamedTuple, Optional

import tensorflow_federated as tff


class Stages(NamedTuple):
  """The stages a process was composed from (`compose_learning_process`)."""

  initial_weights_fn: tff.Computation
  distributor: tff.templates.MeasuredProcess
  client_work: tff.templates.MeasuredProcess
  aggregator: tff.templates.AggregationProcess
  finalizer: tff.templates.MeasuredProcess


class ComposedProcess(tff.learning.templates.LearningProcess):
  """A `LearningProcess` composed here, with its stages.

  It is a plain `LearningProcess` to TFF. `stages` are the stages it was
  composed from, and `with_finalizer` the same process (or view, see
  `first_model_view`) recomposed around another finalizer of the same
  signature.
  """

  def __init__(self, initialize_fn: tff.Computation, next_fn: tff.Computation,
               get_model_weights: tff.Computation,
               set_model_weights: tff.Computation, *, stages: Stages,
               recompose: Callable[[Stages], 'ComposedProcess']):
    super().__init__(initialize_fn, next_fn, get_model_weights,
                     set_model_weights)
    self._stages = stages
    self._recompose = recompose

  @property
  def stages(self) -> Stages:
    return self._stages

  def with_finalizer(
      self, finalizer: tff.templates.MeasuredProcess) -> 'ComposedProcess':
    """The same process with another finalizer of the same signature."""
    return self._recompose(self._stages._replace(finalizer=finalizer))


def compose_learning_process(
    initial_weights_fn: tff.Computation,
    distributor: tff.templates.MeasuredProcess,
    client_work: tff.templates.MeasuredProcess,
    aggregator: tff.templates.AggregationProcess,
    finalizer: tff.templates.MeasuredProcess,
) -> ComposedProcess:
  """Composes the four stages into a `tff.learning.templates.LearningProcess`.

  Args:
    initial_weights_fn: No-arg TF computation returning `ModelWeights`.
    distributor: Broadcasts `ModelWeights` (e.g.
      `tff.learning.templates.build_broadcast_process`).
    client_work: `next(state@S, weights@C, data@C)` returning a
      `MeasuredProcessOutput` whose result is a `ClientResult`@C.
    aggregator: Weighted aggregation of the client updates.
    finalizer: `next(state@S, weights@S, aggregate@S)` returning the new
      global `ModelWeights`@S.

  Returns:
    A `ComposedProcess` (a `LearningProcess`) whose state is a
    `LearningAlgorithmState`.
  """
  _check_stages(initial_weights_fn, distributor, client_work, aggregator,
                finalizer)
  state_cls = tff.learning.templates.LearningAlgorithmState
  data_type = client_work.next.type_signature.parameter[2]

  @tff.federated_computation
  def init_fn():
    return tff.federated_zip(state_cls(
        tff.federated_eval(initial_weights_fn, tff.SERVER),
        distributor.initialize(), client_work.initialize(),
        aggregator.initialize(), finalizer.initialize()))

  @tff.federated_computation(init_fn.type_signature.result, data_type)
  def next_fn(state, client_data):
    dist = distributor.next(state.distributor, state.global_model_weights)
    work = client_work.next(state.client_work, dist.result, client_data)
    agg = aggregator.next(state.aggregator, work.result.update,
                          work.result.update_weight)
    fin = finalizer.next(state.finalizer, state.global_model_weights,
                         agg.result)
    new_state = tff.federated_zip(state_cls(
        fin.result, dist.state, work.state, agg.state, fin.state))
    # TFF's layout: the clients' training measurements under
    # `client_work/train` (what `tff.learning.programs.train_model` releases
    # to its `train_metrics_manager`).
    client_metrics = tff.federated_zip(
        collections.OrderedDict(train=work.measurements))
    metrics = tff.federated_zip(collections.OrderedDict(
        distributor=dist.measurements, client_work=client_metrics,
        aggregator=agg.measurements, finalizer=fin.measurements))
    return tff.learning.templates.LearningProcessOutput(new_state, metrics)

  state_type = init_fn.type_signature.result.member

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    return state.global_model_weights

  @tff.tensorflow.computation(state_type, state_type.global_model_weights)
  def set_model_weights(state, weights):
    return state_cls(weights, state.distributor, state.client_work,
                     state.aggregator, state.finalizer)

  return ComposedProcess(
      init_fn, next_fn, get_model_weights, set_model_weights,
      stages=Stages(initial_weights_fn, distributor, client_work, aggregator,
                    finalizer),
      recompose=lambda stages: compose_learning_process(*stages))


def _check_assignable(target: tff.Type, source: tff.Type, what: str) -> None:
  try:
    target.check_assignable_from(source)
  except TypeError as e:
    raise TypeError(f'{what}: expected {target}, got {source}') from e


def _check_stages(initial_weights_fn, distributor, client_work, aggregator,
                  finalizer) -> None:
  """TFF's composer checks, but for the client data's type.

  As `tff.learning.templates.compose_learning_process`: each stage is a
  process of the right kind, and each stage's output is assignable to the
  next one's input. The client data may be any CLIENTS-placed type (TFF
  insists on sequences; tff_kd's fast path passes keys).

  Raises:
    TypeError: naming the first stage that does not fit.
  """
  if not isinstance(initial_weights_fn, tff.Computation) or (
      initial_weights_fn.type_signature.parameter is not None):
    raise TypeError('initial_weights_fn must be a no-arg tff.Computation')
  weights_type = initial_weights_fn.type_signature.result
  if isinstance(weights_type, tff.FederatedType):
    raise TypeError('initial_weights_fn must return unplaced weights, got '
                    f'{weights_type}')
  for stage, kind in ((distributor, tff.templates.MeasuredProcess),
                      (client_work, tff.templates.MeasuredProcess),
                      (aggregator, tff.templates.AggregationProcess),
                      (finalizer, tff.templates.MeasuredProcess)):
    if not isinstance(stage, kind):
      raise TypeError(f'expected a {kind.__name__}, got {type(stage)}')
  if not aggregator.is_weighted:
    raise TypeError('the aggregator must be weighted')
  server_weights = tff.FederatedType(weights_type, tff.SERVER)
  dist = distributor.next.type_signature
  work = client_work.next.type_signature
  agg = aggregator.next.type_signature
  fin = finalizer.next.type_signature
  _check_assignable(dist.parameter[1], server_weights,
                    'distributor input (the global weights)')
  _check_assignable(work.parameter[1], dist.result.result,
                    'client work input (the broadcast weights)')
  _check_assignable(agg.parameter[1].member, work.result.result.member.update,
                    'aggregator input (the client updates)')
  _check_assignable(agg.parameter[2].member,
                    work.result.result.member.update_weight,
                    'aggregator weight (the client update weights)')
  _check_assignable(fin.parameter[1], server_weights,
                    'finalizer input (the global weights)')
  _check_assignable(fin.parameter[2], agg.result.result,
                    'finalizer input (the aggregate)')
  _check_assignable(server_weights, fin.result.result,
                    'finalizer output (the new global weights)')


def finalizer_of(
    process: tff.learning.templates.LearningProcess
) -> Optional[tff.templates.MeasuredProcess]:
  """The finalizer a process was composed with here, or None."""
  if isinstance(process, ComposedProcess):
    return process.stages.finalizer
  return None


def global_models(state) -> list[tff.learning.models.ModelWeights]:
  """Every global model's `ModelWeights` of a `first_model_view` state.

  For processes whose `global_model_weights` is a tuple of models (FedDF's
  architecture prototypes); `get_model_weights` reads only the first.
  """
  return [
      tff.learning.models.ModelWeights(
          trainable=list(w.trainable), non_trainable=list(w.non_trainable))
      for w in state.global_model_weights
  ]


def first_model_view(process: ComposedProcess) -> ComposedProcess:
  """The same process whose get/set_model_weights see only the first model.

  For processes whose `global_model_weights` is a tuple whose element 0 is
  the classifier's `ModelWeights` and whose other elements are further
  server models: FedDF's other architecture prototypes, DaFKD's and FedGen's
  global generators. TFF's tooling (evaluation, program logic, export) reads
  and writes a single classifier through `get_model_weights` /
  `set_model_weights`; the other elements are carried unchanged.

  Args:
    process: A process composed by `compose_learning_process` with a tuple
      of models as its global model.

  Returns:
    A `ComposedProcess` with the same `initialize`, `next` and stages.
  """
  state_type = process.initialize.type_signature.result.member
  state_cls = tff.learning.templates.LearningAlgorithmState
  first_type = state_type.global_model_weights[0]

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    return state.global_model_weights[0]

  @tff.tensorflow.computation(state_type, first_type)
  def set_model_weights(state, weights):
    others = tuple(state.global_model_weights[1:])
    return state_cls((weights,) + others, state.distributor,
                     state.client_work, state.aggregator, state.finalizer)

  return ComposedProcess(
      process.initialize, process.next, get_model_weights, set_model_weights,
      stages=process.stages,
      recompose=lambda stages: first_model_view(
          process.with_finalizer(stages.finalizer)))
