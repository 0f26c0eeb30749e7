"""Where the worker's TensorFlow graphs are optimised (`runtime.grappler`).

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
paid once per run. The modes:

* 'server' (the default): TFF's compilation for every graph except the KD
  methods' server steps (the graphs `mark_for_worker` marks, which
  `tff_kd.federated.finalizers.server_computation` does): there the
  `tf.function` calls stay, with TensorFlow's default Grappler, which the
  worker runs when it first instantiates each function, for its own
  devices. The teachers' pass is where the runtime lost most against a
  plain `tf.function` (FedDF's teachers scoring a 2,000-image pool: 13.4
  ms each in the worker as TFF compiles, 6.2 ms left to the worker, 3.6-6.3
  ms in a plain `tf.function`; studies/speed/results/worker_grappler.md).
* 'worker': every graph that way (`compile_for_worker_grappler`); the
  clients' training too, which not every method gains from.
* 'static': TFF's own compilation, unchanged.

Grappler's rewrites change float round-off (fused kernels), so a server
step under 'server' or 'worker' is not bit-identical to 'static''s
(BUILD_NOTES.md, "The worker's graph rewrites"). Every context the library
installs compiles with the mode: the local runtime, TFF's test context
(secure sums; its secure intrinsics are replaced first, as TFF's test
context does) and remote workers.
"""

from typing import Any, Callable

import tensorflow as tf

# `runtime.grappler`: 'server' | 'static' (TFF's compilation) | 'worker'.
MODES = ('server', 'static', 'worker')
DEFAULT = 'server'
# The name of the no-op that marks a graph for the worker's Grappler.
_MARK = 'tff_kd_optimised_by_worker'


def mark_for_worker() -> None:
  """Marks the TF computation being traced: under `runtime.grappler=
  'server'` its `tf.function` calls are left to the worker's Grappler.

  Call inside the body of a `tff.tensorflow.computation` (its graph's top
  level); the work to optimise must be inside `tf.function` calls.
  """
  tf.no_op(name=_MARK)


def _is_marked(block: Any) -> bool:
  """Whether a TensorFlow `CompiledComputation`'s graph has the mark."""
  graph = tf.compat.v1.GraphDef()
  block.proto.tensorflow.graph_def.Unpack(graph)
  return any(node.name.startswith(_MARK) for node in graph.node)


def tensorflow_parts(comp: Any) -> list[Any]:
  """The TensorFlow computations (`computation_pb2.TensorFlow`: a graph,
  its bindings and initialiser) inside a (compiled) `tff.Computation`, in
  proto order: what the worker runs in its sessions."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.proto.v0 import computation_pb2
  from tensorflow_federated.python.core.impl.computation import computation_impl
  # pylint: enable=g-import-not-at-top

  found = []

  def walk(message):
    if isinstance(message, computation_pb2.Computation) and (
        message.WhichOneof('computation') == 'tensorflow'):
      found.append(message.tensorflow)
      return
    for field, value in message.ListFields():
      if field.type == field.TYPE_MESSAGE:
        for item in (value if field.label == field.LABEL_REPEATED
                     else [value]):
          walk(item)

  walk(computation_impl.ConcreteComputation.get_proto(comp))
  return found


def _tff_grappler_config() -> Any:
  """TFF 0.87's static Grappler configuration
  (`desugar_and_transform_to_native`)."""
  config = tf.compat.v1.ConfigProto()
  rewrite_options = config.graph_options.rewrite_options
  aggressive = rewrite_options.AGGRESSIVE
  rewrite_options.memory_optimization = aggressive
  rewrite_options.constant_folding = aggressive
  rewrite_options.arithmetic_optimization = aggressive
  rewrite_options.loop_optimization = aggressive
  rewrite_options.function_optimization = aggressive
  return config


def _compile(comp: Any, leave_to_worker: Callable[[Any], bool]) -> Any:
  """TFF's `desugar_and_transform_to_native`, except that the TensorFlow
  graphs for which `leave_to_worker` holds keep their function calls, with
  Grappler on, and are not optimised here."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.environments.tensorflow_backend import compiled_computation_transformations as cct
  from tensorflow_federated.python.core.environments.tensorflow_backend import tensorflow_computation_transformations
  from tensorflow_federated.python.core.environments.tensorflow_backend import tensorflow_tree_transformations
  from tensorflow_federated.python.core.impl.compiler import building_blocks
  from tensorflow_federated.python.core.impl.compiler import transformation_utils
  from tensorflow_federated.python.core.impl.compiler import transformations
  from tensorflow_federated.python.core.impl.computation import computation_impl
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  # pylint: enable=g-import-not-at-top

  config = _tff_grappler_config()

  def static(block):
    if not (isinstance(block, building_blocks.CompiledComputation) and
            block.proto.WhichOneof('computation') == 'tensorflow') or (
                leave_to_worker(block)):
      return block, False
    block = cct.optimize_tensorflow_comp(block, config)
    proto = (tensorflow_computation_transformations
             .disable_grappler_for_partitioned_calls(block.proto))
    return building_blocks.CompiledComputation(
        proto, type_signature=block.type_signature), True

  desugared, _ = tensorflow_tree_transformations.replace_intrinsics_with_bodies(
      comp.to_building_block())
  call_dominant = transformations.to_call_dominant(desugared)
  compiled, _ = transformation_utils.transform_postorder(call_dominant, static)
  with_ids, _ = cct.transform_tf_add_ids(compiled)
  return computation_impl.ConcreteComputation(
      computation_proto=with_ids.proto,
      context_stack=context_stack_impl.context_stack)


def compile_for_worker_grappler(comp: Any) -> Any:
  """`comp` compiled for the native runtime, Grappler left to the worker
  in every graph (`runtime.grappler='worker'`).

  TFF's `desugar_and_transform_to_native` without its static Grappler pass
  and without turning Grappler off on the function calls.

  Args:
    comp: A `tff.Computation` (TFF's `ConcreteComputation`).

  Returns:
    The compiled `ConcreteComputation`.
  """
  return _compile(comp, lambda block: True)


def compile_server_for_worker(comp: Any) -> Any:
  """`comp` compiled TFF's way except its marked graphs (`mark_for_worker`,
  the KD server steps), left to the worker (`runtime.grappler='server'`).

  Args:
    comp: A `tff.Computation` (TFF's `ConcreteComputation`).

  Returns:
    The compiled `ConcreteComputation`.
  """
  return _compile(comp, _is_marked)


def compiler_for(mode: str) -> Callable[[Any], Any]:
  """The compiler of `runtime.grappler=mode` (a `compiler_fn` of TFF's
  execution contexts).

  Raises:
    ValueError: an unknown `mode`.
  """
  if mode not in MODES:
    raise ValueError(f'grappler={mode!r}; choose one of {", ".join(MODES)}')
  if mode == 'static':
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    return tff.backends.native.desugar_and_transform_to_native
  return (compile_server_for_worker if mode == 'server' else
          compile_for_worker_grappler)


def test_compiler_for(mode: str) -> Callable[[Any], Any]:
  """`compiler_for(mode)` after TFF's test context's rewrite of the secure
  sums to plain ones (as `tff.backends.test` compiles)."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.backends.test import compiler as test_compiler
  # pylint: enable=g-import-not-at-top
  compile_native = compiler_for(mode)

  def compile_test(comp):
    return compile_native(
        test_compiler.replace_secure_intrinsics_with_bodies(comp))

  return compile_test


def local_context(max_concurrent_computation_calls: int,
                  compiler_fn: Callable[[Any], Any], *,
                  sync: bool = True) -> Any:
  """TFF's local C++ context, synchronous or (`sync=False`) asynchronous,
  compiling with `compiler_fn` (as `tff.backends.native.
  create_sync_local_cpp_execution_context`, its async twin and
  `tff.backends.test.create_sync_test_cpp_execution_context` build it with
  their own compilers)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  kind = (tff.framework.SyncExecutionContext if sync else
          tff.framework.AsyncExecutionContext)
  return kind(
      executor_fn=tff.framework.local_cpp_executor_factory(
          max_concurrent_computation_calls=max_concurrent_computation_calls),
      compiler_fn=compiler_fn,
      transform_args=tff.tensorflow.transform_args,
      transform_result=tff.tensorflow.transform_result)
