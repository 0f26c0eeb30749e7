"""Finalizers: the server stage of a learning process, as TFF processes.

`build_weights_finalizer` applies the clients' mean update with a server
optimiser (FedAvg, FedProx); `build_server_finalizer` wraps a KD method's
server step (distillation, generator training), one TF computation kept
with its Python function (`ServerComputation`) so the driver can run it
(`tff_kd.runtime.server_stage`).
"""

import functools
from typing import Callable, NamedTuple

import tensorflow_federated as tff

from tff_kd.core import stacking as stacking_tf
from tff_kd.federated import tff_types
from tff_kd.runtime import graph_rewrites


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
  specs = tuple(tff_types.tensor_specs(weights_type.trainable))

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


def server_computation(
    *parameter_types,
    leave_to_worker: bool = True) -> Callable[..., ServerComputation]:
  """Decorator: `tff.tensorflow.computation` that keeps its Python function.

  Args:
    *parameter_types: The computation's parameter types, as for
      `tff.tensorflow.computation`.
    leave_to_worker: Mark the step so that under `runtime.grappler=
      'server'` (the default) the worker optimises its `tf.function`s for
      its devices (`tff_kd.runtime.graph_rewrites.mark_for_worker`); False:
      TFF's compilation, for a step that the worker's Grappler does not
      make faster.

  Returns:
    A decorator returning a `ServerComputation`.
  """

  def wrap(fn):

    @functools.wraps(fn)
    def marked(*args, **kwargs):
      graph_rewrites.mark_for_worker()
      return fn(*args, **kwargs)

    return ServerComputation(
        tff.tensorflow.computation(*parameter_types)(
            marked if leave_to_worker else fn), fn)

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
