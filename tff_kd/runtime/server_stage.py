"""A KD method's server step run in the driver process instead of the runtime.

The KD methods (FedDF, Lin et al., NeurIPS 2020; FedD3A; DaFKD, Wang et al.,
CVPR 2023; FedGen, Zhu et al., ICML 2021; FedFTG) spend most of their
server time in one TF computation: ensemble distillation, or generator
training. Inside TFF's runtime that computation runs in the PyPI
`worker_binary`, which is built without CUDA, and TFF 0.87's C++ executors
place nothing on a device (BUILD_NOTES.md, "Server distillation outside the
runtime"). A GPU on the driver's machine is therefore never used.

`DriverServerProcess` moves that one step out of the runtime. The same
stages are recomposed around a pass-through finalizer that returns the
round's aggregate as its measurements; the driver then runs the method's
own server function (`tff_kd.federated.finalizers.ServerComputation`) in its
own TensorFlow, traced once into a graph and run in a session the way TFF
runs a TF computation (fresh variables, initialised every call). TensorFlow's
device placement applies there: `device='driver'` lets it choose (a visible
GPU first), and a device string such as `'/GPU:0'` or `'/CPU:0'` pins it.

What it costs:
  * it is not a `tff.learning.templates.LearningProcess`, since one round is
    two steps: `tff.learning.programs.train_model` cannot drive it;
  * the aggregate (FedDF: one model delta per client of the round) leaves
    the runtime every round, an extra transfer of that size;
  * the state keeps the same type, so checkpoints move freely between the
    two modes.
"""

from typing import Any, Callable, Sequence, Union

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.federated import composer
from tff_kd.federated import finalizers

IN_RUNTIME = 'runtime'
DRIVER = 'driver'


def check_device(device: str) -> None:
  """Raises `ConfigError` unless `device` is 'runtime', 'driver' or a device.

  Args:
    device: `runtime.server_device` from the config.
  """
  if device in (IN_RUNTIME, DRIVER):
    return
  try:
    valid = device.startswith('/') and bool(
        tf.DeviceSpec.from_string(device).device_type)
  except ValueError:
    valid = False
  if not valid:
    raise errors.ConfigError(
        "runtime.server_device must be 'runtime', 'driver' or a TensorFlow "
        f"device such as '/GPU:0' or '/CPU:0', got {device!r}")


def has_server_step(process: tff.learning.templates.LearningProcess) -> bool:
  """Whether the process's server step can move to the driver: it was
  composed by `tff_kd.federated.composer` around a finalizer built by
  `tff_kd.federated.finalizers.build_server_finalizer`."""
  return isinstance(composer.finalizer_of(process), finalizers.ServerFinalizer)


def _passthrough(
    finalizer: tff.templates.MeasuredProcess) -> tff.templates.MeasuredProcess:
  """A finalizer that keeps state and weights and reports the aggregate."""
  state_type, weights_type, aggregate_type = (
      finalizer.next.type_signature.parameter)

  @tff.federated_computation(state_type, weights_type, aggregate_type)
  def next_fn(state, weights, aggregate):
    return tff.templates.MeasuredProcessOutput(
        state=state, result=weights, measurements=aggregate)

  return tff.templates.MeasuredProcess(finalizer.initialize, next_fn)


def _placeholders(type_spec: tff.Type) -> Any:
  """Graph placeholders for a TFF type, in its Python containers."""
  if isinstance(type_spec, tff.TensorType):
    return tf.compat.v1.placeholder(tf.as_dtype(type_spec.dtype),
                                    type_spec.shape)
  if isinstance(type_spec, tff.StructType):
    elements = tff.structure.Struct([
        (name, _placeholders(member))
        for name, member in tff.structure.iter_elements(type_spec)])
    return tff.types.type_to_py_container(elements, type_spec)
  raise TypeError(f'a server step takes tensors and structures, got '
                  f'{type_spec}')


class GraphStep:
  """A Python TF function traced into a graph and run like a TFF computation.

  As for TFF's TF computations: the function is traced once in graph mode
  with placeholders for its typed arguments, every variable it creates is
  initialised afresh at each call, and its result comes back as numpy. The
  trace happens at construction, as TFF's does when a process is built:
  Keras refuses models made in a graph after eager models of the same
  process.
  """

  def __init__(self, fn: Callable[..., Any],
               parameter_types: Sequence[tff.Type], device: str = DRIVER):
    graph = tf.Graph()
    variables = []

    def record(next_creator, **kwargs):
      variable = next_creator(**kwargs)
      variables.append(variable)
      return variable

    with graph.as_default():
      self._placeholders = tuple(_placeholders(t) for t in parameter_types)
      with tf.device(None if device == DRIVER else device), (
          tf.variable_creator_scope(record)):
        self._result = fn(*self._placeholders)
      self._fetches = tf.nest.flatten(self._result)
      self._init = tf.group(
          tf.compat.v1.initializers.variables(variables),
          *tf.compat.v1.get_collection(
              tf.compat.v1.GraphKeys.TABLE_INITIALIZERS))
    self._session = tf.compat.v1.Session(
        graph=graph,
        config=tf.compat.v1.ConfigProto(allow_soft_placement=True))

  def __call__(self, *args: Any) -> Any:
    """Runs the function on numpy arguments; returns numpy results."""
    feed = dict(zip(tf.nest.flatten(self._placeholders),
                    tf.nest.flatten(args)))
    self._session.run(self._init)
    values = self._session.run(self._fetches, feed_dict=feed)
    return tf.nest.pack_sequence_as(self._result, values)

  def close(self) -> None:
    self._session.close()


def _like(template: Any, value: Any) -> Any:
  """`value` in `template`'s containers (what TFF returned before)."""
  return tf.nest.pack_sequence_as(template, tf.nest.flatten(value))


class DriverServerProcess:
  """A KD process whose server step runs in the driver's TensorFlow.

  It has `initialize`, `next`, `get_model_weights` and `set_model_weights`
  like the `LearningProcess` it wraps, with the same state type, and gives
  the same rounds (tested on CPU in tests/runtime/test_server_stage.py). It
  is not a `LearningProcess`: see the module docstring for why and for what
  the mode costs.
  """

  def __init__(self, process: composer.ComposedProcess,
               device: str = DRIVER):
    """Recomposes `process` around a pass-through finalizer.

    Args:
      process: A KD method's process, composed by
        `tff_kd.federated.composer` with a `build_server_finalizer`
        finalizer.
      device: 'driver' (TensorFlow's own placement) or a device string.

    Raises:
      ConfigError: a process with no server step (FedAvg, FedProx), or a
        bad device string.
    """
    check_device(device)
    if device == IN_RUNTIME:
      raise errors.ConfigError(
          "DriverServerProcess needs a device other than 'runtime'")
    if not has_server_step(process):
      raise errors.ConfigError(
          'this method has no server step to move to the driver: its server '
          "only applies an optimizer step (use runtime.server_device="
          "'runtime')")
    finalizer = process.stages.finalizer
    self._split = process.with_finalizer(_passthrough(finalizer))
    self._step = GraphStep(
        finalizer.server_step.python_fn,
        [t.member for t in finalizer.next.type_signature.parameter], device)
    self.initialize = self._split.initialize
    self.get_model_weights = self._split.get_model_weights
    self.set_model_weights = self._split.set_model_weights

  @property
  def runtime_process(self) -> tff.learning.templates.LearningProcess:
    """The part of the round that runs in TFF's runtime."""
    return self._split

  def next(self, state: Any,
           client_data: Any) -> tff.learning.templates.LearningProcessOutput:
    """One round: clients and aggregation in TFF, the server step here."""
    output = self._split.next(state, client_data)
    mid = output.state
    new_finalizer, new_weights, server_metrics = self._step(
        mid.finalizer, mid.global_model_weights, output.metrics['finalizer'])
    new_state = tff.learning.templates.LearningAlgorithmState(
        _like(mid.global_model_weights, new_weights), mid.distributor,
        mid.client_work, mid.aggregator, _like(mid.finalizer, new_finalizer))
    metrics = type(output.metrics)(output.metrics)
    metrics['finalizer'] = server_metrics
    return tff.learning.templates.LearningProcessOutput(new_state, metrics)

  def close(self) -> None:
    """Frees the driver session."""
    self._step.close()


def place_server(process: tff.learning.templates.LearningProcess,
                 device: str) -> Any:
  """The process as configured by `runtime.server_device`.

  Args:
    process: A method's process.
    device: 'runtime' (unchanged), 'driver' or a TensorFlow device string.

  Returns:
    `process` itself for 'runtime', else a `DriverServerProcess`.
  """
  if device == IN_RUNTIME:
    return process
  return DriverServerProcess(process, device)


def runtime_part(
    process: Union[tff.learning.templates.LearningProcess,
                   DriverServerProcess]
) -> tff.learning.templates.LearningProcess:
  """The part of a process's round that runs in TFF's runtime: the process
  itself, or a `DriverServerProcess`'s `runtime_process`."""
  if isinstance(process, DriverServerProcess):
    return process.runtime_process
  return process
