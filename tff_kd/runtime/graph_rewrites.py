"""Where the local worker's TensorFlow graphs are optimised (`runtime.grappler`).

TFF 0.87 compiles each TensorFlow computation for its C++ runtime once, in
the driver (`tff.backends.native.desugar_and_transform_to_native`): it runs
Grappler over the graph there, which inlines every `tf.function` call, and
then turns Grappler off on every function call that is left. The worker
runs its sessions with Grappler off and graph optimisation level L0 (TFF's
`session_provider.cc`: its sessions are expected to be short-lived). So the
worker never applies the rewrites that need its devices, e.g. fusing a
convolution, its bias and its ReLU into one oneDNN kernel: the driver's
Grappler pass has no device to fuse for.

This library's computations do their work inside `tf.function`s (a
client's local training, a KD method's whole server step), and the worker
keeps a computation's sessions from call to call, so a per-session cost is
paid once per run. `compile_for_worker_grappler` compiles a computation as
TFF does (intrinsics replaced by their TensorFlow bodies, call-dominant
form, cache ids) but leaves out both Grappler steps: the `tf.function`
calls stay, with TensorFlow's default Grappler, which the worker then runs
when it first instantiates each function, for its own devices. FedDF's
teachers scoring a 2,000-image pool took 13.4 ms each in the worker, 6.2
ms with this, 3.6-6.3 ms in a plain `tf.function` (one thread;
studies/speed/results/worker_grappler.md; BUILD_NOTES.md, "The worker's
graph rewrites").

Grappler's rewrites change float round-off (fused kernels), so a run with
`'worker'` is not bit-identical to one with `'static'` (TFF's way, the
default). Only for the local C++ context: the test context (secure sums)
and remote workers compile TFF's way.
"""

from typing import Any

# `runtime.grappler`: 'static' (TFF's compilation) | 'worker'.
MODES = ('static', 'worker')


def compile_for_worker_grappler(comp: Any) -> Any:
  """`comp` compiled for the native runtime, Grappler left to the worker.

  TFF's `desugar_and_transform_to_native` without its static Grappler pass
  and without turning Grappler off on the function calls.

  Args:
    comp: A `tff.Computation` (TFF's `ConcreteComputation`).

  Returns:
    The compiled `ConcreteComputation`.
  """
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.environments.tensorflow_backend import compiled_computation_transformations
  from tensorflow_federated.python.core.environments.tensorflow_backend import tensorflow_tree_transformations
  from tensorflow_federated.python.core.impl.compiler import transformations
  from tensorflow_federated.python.core.impl.computation import computation_impl
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  # pylint: enable=g-import-not-at-top

  desugared, _ = tensorflow_tree_transformations.replace_intrinsics_with_bodies(
      comp.to_building_block())
  call_dominant = transformations.to_call_dominant(desugared)
  with_ids, _ = compiled_computation_transformations.transform_tf_add_ids(
      call_dominant)
  return computation_impl.ConcreteComputation(
      computation_proto=with_ids.proto,
      context_stack=context_stack_impl.context_stack)


def sync_local_context(max_concurrent_computation_calls: int) -> Any:
  """TFF's synchronous local C++ context, compiling with
  `compile_for_worker_grappler` (as `tff.backends.native.
  create_sync_local_cpp_execution_context` builds it otherwise)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  return tff.framework.SyncExecutionContext(
      executor_fn=tff.framework.local_cpp_executor_factory(
          max_concurrent_computation_calls=max_concurrent_computation_calls),
      compiler_fn=compile_for_worker_grappler,
      transform_args=tff.tensorflow.transform_args,
      transform_result=tff.tensorflow.transform_result)
