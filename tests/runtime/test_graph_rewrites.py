"""`runtime.grappler`: which `tf.function`s the worker optimises.

TFF's compilation inlines a computation's `tf.function` calls and turns
Grappler off on the ones left. `graph_rewrites.compile_server_for_worker`
(`'server'`, the default) keeps the calls with Grappler on in the graphs
marked as a KD server step, and compiles the rest TFF's way;
`compile_for_worker_grappler` (`'worker'`) keeps them in every graph.
Pinned: the compiled graphs' call ops, the same values (to float round-off)
under every context, the test context's secure sums, remote workers'
compiler, and the same FedDF round.
"""

import numpy as np
import psutil
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import helpers
from tests.conftest import live_workers
from tff_kd.models import classifiers
from tff_kd.program import experiment
from tff_kd.program import tff_programs
from tff_kd.runtime import context
from tff_kd.runtime import graph_rewrites
from tff_kd.runtime import workers

_CALL_OPS = ('PartitionedCall', 'StatefulPartitionedCall')


def _forward(marked: bool = False):
  """A computation whose work is a Keras CNN inside a `tf.function`,
  marked as a server step if `marked`."""

  @tff.tensorflow.computation(tff.TensorType(np.float32, [16, 28, 28, 1]))
  def forward(x):
    if marked:
      graph_rewrites.mark_for_worker()
    model = classifiers.build_classifier(
        'cnn', input_shape=(28, 28, 1), num_classes=10).model
    return tf.function(lambda x: model(x, training=False))(x)

  return forward


def _call_ops(comp) -> list:
  """(op, Grappler off?) of every function call op of `comp`'s graphs."""
  found = []
  for part in graph_rewrites.tensorflow_parts(comp):
    graph = tf.compat.v1.GraphDef()
    part.graph_def.Unpack(graph)
    nodes = list(graph.node) + [n for f in graph.library.function
                                for n in f.node_def]
    for node in nodes:
      if node.op in _CALL_OPS:
        config = tf.compat.v1.ConfigProto()
        config.ParseFromString(node.attr['config_proto'].s)
        found.append((node.op, config.graph_options.rewrite_options
                      .disable_meta_optimizer))
  return found


def test_the_function_calls_keep_grappler_for_the_worker():
  forward, marked = _forward(), _forward(marked=True)
  tffs = _call_ops(tff.backends.native.desugar_and_transform_to_native(
      forward))
  assert all(off for _, off in tffs), tffs  # TFF's: none left on.
  for comp in (forward, marked):
    ours = _call_ops(graph_rewrites.compile_for_worker_grappler(comp))
    assert ours and not any(off for _, off in ours), ours
  # 'server': the marked graph keeps its call, the unmarked one is TFF's.
  server = graph_rewrites.compile_server_for_worker
  assert _call_ops(server(forward)) == tffs
  ours = _call_ops(server(marked))
  assert ours and not any(off for _, off in ours), ours
  assert (graph_rewrites.compiler_for('static') is
          tff.backends.native.desugar_and_transform_to_native)
  with pytest.raises(ValueError, match="grappler='jit'; choose one of "
                     'server, static, worker'):
    graph_rewrites.compiler_for('jit')


@pytest.mark.parametrize('mode', ['server', 'worker'])
def test_the_contexts_compute_the_same(mode, restore_context):
  """The local context, and the test context with a secure sum, compile
  with the mode's compiler and give TFF's values to float round-off."""
  forward = _forward(marked=True)
  x = np.random.default_rng(0).random((16, 28, 28, 1)).astype(np.float32)
  context.shutdown()
  context.set_local_context(grappler='static')
  want = forward(x)
  context.shutdown()
  context.set_local_context(grappler=mode)
  assert len(live_workers(psutil.Process())) == 1
  compiler = context.compiler_cache()._compiler_fn  # pylint: disable=protected-access
  assert compiler is graph_rewrites.compiler_for(mode)
  np.testing.assert_allclose(forward(x), want, rtol=1e-5, atol=1e-5)

  @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
  def secure_total(values):
    return tff.federated_secure_sum_bitwidth(values, 8)

  context.shutdown()
  context.set_test_context(grappler=mode)
  np.testing.assert_allclose(forward(x), want, rtol=1e-5, atol=1e-5)
  assert secure_total([3, 4, 5]) == 12


@pytest.mark.parametrize('mode', graph_rewrites.MODES)
def test_train_models_context_compiles_with_the_mode(mode, restore_context):
  """`tff_programs.native_context` (TFF's program logic) compiles as the
  synchronous context does; an unknown mode is refused before its worker
  starts."""
  native = tff_programs.native_context(grappler=mode)
  compiler = native._execution_context._compiler_pipeline._compiler_fn  # pylint: disable=protected-access
  assert compiler is graph_rewrites.compiler_for(mode)
  context.shutdown()
  with pytest.raises(ValueError, match="grappler='jit'; choose one of"):
    tff_programs.native_context(grappler='jit')
  assert not live_workers(psutil.Process())


def test_remote_workers_compile_with_the_mode():
  """Each worker's context compiles with `runtime.grappler`'s compiler
  (built without a worker: nothing connects until a call)."""
  for mode in graph_rewrites.MODES:
    merged = workers.remote_context(['localhost:1'], grappler=mode)
    compilers = {c._compiler_pipeline._compiler_fn  # pylint: disable=protected-access
                 for c in merged._async_execution_contexts}  # pylint: disable=protected-access
    assert compilers == {graph_rewrites.compiler_for(mode)}, mode


def test_a_feddf_round_is_the_same_round(tmp_path, restore_context):
  """A FedDF round (its server step is one `tf.function`) under the
  default ('server'): the student and the server's measurements of TFF's
  compilation's ('static') round, to float round-off."""
  config = helpers.smoke_config('feddf', **{'runtime.grappler': 'static'})
  exp = experiment.prepare(config, str(tmp_path / 'w'))
  keys = exp.client_data.keys([0, 1, 2], seed=0, round_num=0)
  context.shutdown()
  experiment.set_context(exp.settings)
  want = exp.process.next(exp.process.initialize(), keys)
  context.shutdown()
  context.set_local_context()
  compiler = context.compiler_cache()._compiler_fn  # pylint: disable=protected-access
  assert compiler is graph_rewrites.compile_server_for_worker
  got = exp.process.next(exp.process.initialize(), keys)
  a = exp.process.get_model_weights(got.state)
  b = exp.process.get_model_weights(want.state)
  for x, y in zip(a.trainable + a.non_trainable,
                  b.trainable + b.non_trainable):
    np.testing.assert_allclose(x, y, atol=1e-4)
  got_f, want_f = got.metrics['finalizer'], want.metrics['finalizer']
  names = [n for n in want_f if not n.endswith(
      ('_seconds', 'samples_per_second'))]
  assert 'labeled_accuracy_after' in names
  for name in names:
    assert got_f[name] == pytest.approx(want_f[name], abs=1e-4), name
