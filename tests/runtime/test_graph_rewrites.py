"""`runtime.grappler='worker'`: the worker optimises the `tf.function`s.

TFF's compilation inlines a computation's `tf.function` calls and turns
Grappler off on the ones left; `graph_rewrites.compile_for_worker_grappler`
keeps the calls with Grappler on, so the worker optimises them for its
devices. Pinned: the compiled graphs' call ops, the same values (to float
round-off) under both contexts, the same FedDF round, and the refusals.
"""

import numpy as np
import psutil
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import helpers
from tests.conftest import live_workers
from tff_kd import errors
from tff_kd.models import classifiers
from tff_kd.program import experiment
from tff_kd.runtime import context
from tff_kd.runtime import graph_rewrites

_CALL_OPS = ('PartitionedCall', 'StatefulPartitionedCall')


def _forward():
  """A computation whose work is a Keras CNN inside a `tf.function`."""

  @tff.tensorflow.computation(tff.TensorType(np.float32, [16, 28, 28, 1]))
  def forward(x):
    model = classifiers.build_classifier(
        'cnn', input_shape=(28, 28, 1), num_classes=10).model
    return tf.function(lambda x: model(x, training=False))(x)

  return forward


def _call_ops(comp) -> list:
  """(op, Grappler off?) of every function call op of `comp`'s graphs."""
  from tensorflow_federated.python.core.impl.computation import computation_impl  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.proto.v0 import computation_pb2  # pylint: disable=g-import-not-at-top

  found = []

  def walk(message):
    if isinstance(message, computation_pb2.Computation) and (
        message.WhichOneof('computation') == 'tensorflow'):
      graph = tf.compat.v1.GraphDef()
      message.tensorflow.graph_def.Unpack(graph)
      nodes = list(graph.node) + [n for f in graph.library.function
                                  for n in f.node_def]
      for node in nodes:
        if node.op in _CALL_OPS:
          config = tf.compat.v1.ConfigProto()
          config.ParseFromString(node.attr['config_proto'].s)
          found.append((node.op, config.graph_options.rewrite_options
                        .disable_meta_optimizer))
      return
    for field, value in message.ListFields():
      if field.type == field.TYPE_MESSAGE:
        for item in (value if field.label == field.LABEL_REPEATED
                     else [value]):
          walk(item)

  walk(computation_impl.ConcreteComputation.get_proto(comp))
  return found


def test_the_function_calls_keep_grappler_for_the_worker():
  forward = _forward()
  ours = _call_ops(graph_rewrites.compile_for_worker_grappler(forward))
  assert ours and not any(off for _, off in ours), ours
  tffs = _call_ops(tff.backends.native.desugar_and_transform_to_native(
      forward))
  assert all(off for _, off in tffs), tffs  # TFF's: none left on.


def test_the_worker_context_computes_the_same(restore_context):
  forward = _forward()
  x = np.random.default_rng(0).random((16, 28, 28, 1)).astype(np.float32)
  want = forward(x)
  context.shutdown()
  context.set_local_context(grappler='worker')
  assert len(live_workers(psutil.Process())) == 1
  compiler = context.compiler_cache()._compiler_fn  # pylint: disable=protected-access
  assert compiler is graph_rewrites.compile_for_worker_grappler
  np.testing.assert_allclose(forward(x), want, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="grappler='jit'; choose one of "
                     'static, worker'):
    context.set_local_context(grappler='jit')
  with pytest.raises(ValueError, match="TFF's test context compiles"):
    context.set_test_context(grappler='worker')


def test_a_feddf_round_is_the_same_round(tmp_path, restore_context):
  """A FedDF round (its server step is one `tf.function`) under the
  worker's Grappler: the student and the server's measurements of the
  default context's round, to float round-off."""
  config = helpers.smoke_config('feddf', **{'runtime.grappler': 'worker'})
  exp = experiment.prepare(config, str(tmp_path / 'w'))
  keys = exp.client_data.keys([0, 1, 2], seed=0, round_num=0)
  want = exp.process.next(exp.process.initialize(), keys)
  context.shutdown()
  experiment.set_context(exp.settings)
  compiler = context.compiler_cache()._compiler_fn  # pylint: disable=protected-access
  assert compiler is graph_rewrites.compile_for_worker_grappler
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


@pytest.mark.parametrize('case,overrides,why', [
    ('dafkd', {'dafkd.private': True}, "secure sums need TFF's test "
     'context'),
    ('fedavg', {'runtime.workers': 'localhost:8000'}, 'remote workers'),
])
def test_only_the_local_runtime_takes_it(case, overrides, why):
  with pytest.raises(errors.ConfigError,
                     match=r"runtime.grappler='worker' is for the local "
                     r'runtime; .*' + why):
    experiment.from_config(helpers.smoke_config(
        case, **{'runtime.grappler': 'worker', **overrides}))
