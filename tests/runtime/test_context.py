"""The local context's worker settings, its prestarted worker, precompiling."""

import numpy as np
import psutil
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.conftest import live_workers
from tff_kd.runtime import context


def _mean():
  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def mean(x):
    return tff.federated_mean(x)
  return mean


def test_max_concurrent_calls():
  assert context.max_concurrent_calls(0) == context.usable_cores() >= 1
  assert context.max_concurrent_calls(-1) == -1
  assert context.max_concurrent_calls(3) == 3
  with pytest.raises(ValueError, match='>= -1'):
    context.max_concurrent_calls(-2)


def test_threads_env():
  assert context.threads_env(1) == {'TF_NUM_INTRAOP_THREADS': '1'}
  assert context.threads_env(0) == {}
  with pytest.raises(ValueError, match='>= 0'):
    context.threads_env(-1)


def test_the_prestarted_worker_serves_with_its_settings(restore_context):
  context.shutdown()
  context.set_local_context(concurrent_clients=2, intra_op_threads=1)
  before = live_workers(psutil.Process())
  assert len(before) == 1, 'the worker starts with the context'
  assert _mean()([1.0, 3.0]) == 2.0
  after = live_workers(psutil.Process())
  assert [p.pid for p in after] == [before[0].pid], 'TFF used the prestarted'
  assert '--max_concurrent_computation_calls=2' in after[0].cmdline()
  assert after[0].environ().get('TF_NUM_INTRAOP_THREADS') == '1'


def test_tensorflow_default_threads_leave_the_environment_alone(
    restore_context):
  context.shutdown()
  context.set_local_context(concurrent_clients=-1, intra_op_threads=0)
  assert _mean()([1.0, 3.0]) == 2.0
  (worker,) = live_workers(psutil.Process())
  assert '--max_concurrent_computation_calls=-1' in worker.cmdline()
  assert 'TF_NUM_INTRAOP_THREADS' not in worker.environ()


def test_a_context_replaced_before_its_first_call_leaks_no_worker(
    restore_context):
  context.shutdown()
  context.set_local_context()
  context.set_local_context()
  context.set_test_context()
  assert len(live_workers(psutil.Process())) == 1
  assert _mean()([1.0, 3.0]) == 2.0
  assert len(live_workers(psutil.Process())) == 1


def test_precompile_fills_the_contexts_cache():
  @tff.tensorflow.computation(np.float32)
  def double(x):
    return x * 2.0

  from tensorflow_federated.python.core.impl.execution_contexts import compiler_pipeline  # pylint: disable=g-import-not-at-top
  info = compiler_pipeline.CompilerPipeline.compile.cache_info
  assert context.precompile(double, 'not a computation') == 1
  misses = info().misses
  assert double(tf.constant(2.0)) == 4.0
  assert info().misses == misses, 'the first call compiled again'


def test_freeze_imported_objects_hides_what_lives_now():
  import gc  # pylint: disable=g-import-not-at-top
  try:
    assert context.freeze_imported_objects() >= 0
    assert gc.get_freeze_count() > 0
    later = [[]]
    later.append(later)  # A cycle made after the freeze is still collected.
    del later
    assert gc.collect() > 0
  finally:
    gc.unfreeze()
