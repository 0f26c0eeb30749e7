r"""KD teachers scoring a pool: in a plain `tf.function` and in TFF's worker.

FedDF's teacher phase cost about 17.5 ms per teacher inside TFF's runtime
against about 7 ms in a plain `tf.function` (feddf_teacher_phase.md). This
script times the same work, `tff_kd.core.teachers.stacked_logits` of K
stacked small-CNN teachers on an N-image pool with one thread per op,
timestamps inside the graph, each setting in a fresh process:

* `plain`: a `tf.function` in this process's TensorFlow (Grappler on);
* `plain_no_grappler`: the same with Grappler off;
* `plain_one_thread`: `plain` with one inter-op thread (TensorFlow's
  default is one per core; a TFF worker's session runs this function on
  one core whatever its thread settings, BUILD_NOTES.md, "The server step
  in TFF's runtime");
* `worker_static`: a TFF computation in the local worker, compiled TFF's
  way (`runtime.grappler='static'`);
* `worker_server`: the same computation marked as a server step
  (`graph_rewrites.mark_for_worker`, as every KD method's server step is)
  under `runtime.grappler='server'`, the default: its `tf.function` is
  left to the worker's Grappler;
* `worker_grappler`: the unmarked computation under
  `runtime.grappler='worker'` (every graph left to the worker;
  `tff_kd.runtime.graph_rewrites`);
* `session_*`: `worker_server`'s compiled graph run in this process by a
  `tf.compat.v1.Session` with the options of TFF's worker sessions (its
  `session_provider.cc`: Grappler off, optimisation level L0, no JIT, a
  static graph; `session_worker`), and with one of them changed:
  `session_l1` (level L1), `session_meta` (the session's Grappler on),
  `session_inter2` (two inter-op threads, per session), `session_default`
  (TensorFlow's default options). They say which of the worker's settings
  the remaining time depends on.

The settings alternate within each repeat. Reports the median over a
process's calls after the first, then the median over repeats, each
setting's ratio to `plain` within a repeat, the CPU time per teacher (of
this process for `plain*`, of the worker for `worker_*`, over the timed
calls) and the sum of the logits (the same work in every setting).

Usage (about 10 s per process on 2 CPU cores):
  .venv/bin/python -m studies.speed.worker_grappler --repeats=2 \
      --out=studies/speed/results/worker_grappler
"""

import json
import os
import statistics

import psutil

# One thread per op in this process and in its worker (the library's
# default); TensorFlow and TFF are imported before absl runs `main`, as the
# binaries do (Keras builds its models wrongly otherwise).
os.environ['TF_NUM_INTRAOP_THREADS'] = '1'
from tff_kd.runtime import context  # pylint: disable=g-import-not-at-top
context.install()
import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order
import tensorflow as tf  # pylint: disable=g-import-not-at-top,g-bad-import-order
import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top,g-bad-import-order

from absl import app  # pylint: disable=g-bad-import-order
from absl import flags

from studies import common
from tff_kd.core import local_training
from tff_kd.core import teachers
from tff_kd.models import classifiers
from tff_kd.runtime import graph_rewrites

_MODES = ('plain', 'plain_no_grappler', 'plain_one_thread', 'worker_static',
          'worker_server', 'worker_grappler', 'session_worker', 'session_l1',
          'session_meta', 'session_inter2', 'session_default')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Processes per setting.')
_TEACHERS = flags.DEFINE_integer('teachers', 50, 'K.')
_POOL = flags.DEFINE_integer('pool', 2000, 'N, the pool images (28x28x1).')
_CALLS = flags.DEFINE_integer('calls', 4, 'Timed calls per process.')
_OUT = flags.DEFINE_string('out', 'studies/speed/results/worker_grappler',
                           'Result prefix (.json, .md).')
_CHILD = flags.DEFINE_list(
    'child', None, 'Run these settings in turn, here, and print their JSON '
    'list (internal).')
_FRESH = flags.DEFINE_boolean(
    'fresh', True, 'Each setting in a fresh process (the measurement). '
    "--nofresh: the settings in two processes, one for the setting that "
    "sets the process's threads and one for the rest in turn (a check that "
    'every setting runs and gives the same logits, not a measurement: a '
    "setting's time then depends on the ones before it).")
# `--nofresh`'s processes: a setting that changes the process's TensorFlow
# set-up runs first in its process (inter-op threads) or last (Grappler
# off for every function after it); the worker settings each start and
# stop their own worker.
_SHARED_PROCESSES = (('plain_one_thread',),
                     tuple(m for m in _MODES if m not in (
                         'plain_one_thread', 'plain_no_grappler')) +
                     ('plain_no_grappler',))


def _child(mode: str) -> dict:
  """One setting's per-teacher milliseconds, in this (fresh) process."""
  k, n = _TEACHERS.value, _POOL.value
  if mode == 'plain_no_grappler':
    tf.config.optimizer.set_experimental_options(
        {'disable_meta_optimizer': True})
  if mode == 'plain_one_thread':
    tf.config.threading.set_inter_op_parallelism_threads(1)

  def build():
    return classifiers.build_classifier(
        'cnn', input_shape=(28, 28, 1), num_classes=10).model

  shapes = local_training.model_weights(local_training.structure_of(build))

  def score(trainable, non_trainable, x):
    if mode == 'worker_server' or mode.startswith('session'):
      graph_rewrites.mark_for_worker()
    model = build()

    @tf.function
    def timed(trainable, non_trainable, x):
      start = tf.timestamp()
      with tf.control_dependencies([start]):
        x = tf.identity(x)
      logits = teachers.stacked_logits(
          model, None, tff.learning.models.ModelWeights(
              list(trainable), list(non_trainable)),
          tf.ones([k], tf.bool), x)
      with tf.control_dependencies([logits]):
        end = tf.timestamp()
      return tf.reduce_sum(logits), end - start

    return timed(trainable, non_trainable, x)

  specs = [[tff.TensorType(np.float32, [k] + v.shape.as_list())
            for v in part] for part in (shapes.trainable,
                                        shapes.non_trainable)]
  rng = np.random.default_rng(0)
  trainable = [(0.05 * rng.standard_normal(s.shape)).astype(np.float32)
               for s in specs[0]]
  non_trainable = [np.ones(s.shape, np.float32) for s in specs[1]]
  x = rng.random((n, 28, 28, 1)).astype(np.float32)
  if mode.startswith('worker'):
    context.set_local_context(
        concurrent_clients=0, intra_op_threads=1,
        grappler={'worker_static': 'static', 'worker_server': 'server',
                  'worker_grappler': 'worker'}[mode])
    fn = tff.tensorflow.computation(
        specs[0], specs[1], tff.TensorType(np.float32, x.shape))(score)
    (process,) = [p for p in psutil.Process().children(recursive=True)
                  if 'worker_binary' in p.name()]
  elif mode.startswith('session'):
    fn = _session_fn(mode, tff.tensorflow.computation(
        specs[0], specs[1], tff.TensorType(np.float32, x.shape))(score))
    process = psutil.Process()
  else:
    fn = score
    process = psutil.Process()
  times, total = [], None
  for call in range(_CALLS.value + 1):
    if call == 1:
      cpu = sum(process.cpu_times()[:2])
    total, seconds = fn(trainable, non_trainable, x)
    times.append(float(seconds))
  cpu = sum(process.cpu_times()[:2]) - cpu
  if mode.startswith('worker'):
    context.shutdown()
  return {'mode': mode, 'ms_per_teacher': [1000 * t / k for t in times[1:]],
          'cpu_ms_per_teacher': 1000 * cpu / (k * _CALLS.value),
          'logit_sum': float(total)}


def _session_config(mode: str) -> tf.compat.v1.ConfigProto:
  """The session options of TFF's worker (`session_worker`), or with one
  of them changed."""
  config = tf.compat.v1.ConfigProto()
  if mode == 'session_default':
    return config
  options = config.graph_options
  options.rewrite_options.disable_meta_optimizer = mode != 'session_meta'
  options.optimizer_options.opt_level = (
      tf.compat.v1.OptimizerOptions.L1 if mode == 'session_l1' else
      tf.compat.v1.OptimizerOptions.L0)
  options.optimizer_options.global_jit_level = (
      tf.compat.v1.OptimizerOptions.OFF)
  config.experimental.optimize_for_static_graph = True
  config.experimental.disable_output_partition_graphs = True
  config.allow_soft_placement = True
  if mode == 'session_inter2':
    config.use_per_session_threads = True
    config.inter_op_parallelism_threads = 2
  return config


def _session_fn(mode: str, comp: tff.Computation):
  """`comp` compiled as `runtime.grappler='server'` compiles it, run by a
  session of this process with `mode`'s options: a function of the
  computation's arguments."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.utils import tensorflow_utils
  # pylint: enable=g-import-not-at-top

  (compiled,) = graph_rewrites.tensorflow_parts(
      graph_rewrites.compiler_for('server')(comp))
  graph_def = tf.compat.v1.GraphDef()
  compiled.graph_def.Unpack(graph_def)
  graph = tf.Graph()
  with graph.as_default():
    tf.graph_util.import_graph_def(graph_def, name='')
  session = tf.compat.v1.Session(graph=graph, config=_session_config(mode))
  params = tensorflow_utils.extract_tensor_names_from_binding(
      compiled.parameter)
  results = tensorflow_utils.extract_tensor_names_from_binding(
      compiled.result)

  def run(trainable, non_trainable, x):
    feed = dict(zip(params, list(trainable) + list(non_trainable) + [x]))
    if compiled.initialize_op:  # Fresh variables every call, as TFF's.
      session.run(compiled.initialize_op, feed_dict=feed)
    return session.run(results, feed_dict=feed)

  return run


def _report(result: dict) -> str:
  lines = [
      '# KD teachers scoring a pool: plain `tf.function` and TFF\'s worker',
      '', f"Command: `{result['command']}`", '',
      f"Machine: {result['machine']}. {result['teachers']} small-CNN "
      f"teachers (`teachers.stacked_logits`) on {result['pool']} images, "
      'one thread per op, timestamps inside the graph; '
      + ('each setting a fresh process, alternated'
         if result.get('fresh_processes', True) else
         'the settings in two processes, in turn (`--nofresh`: a check, '
         'not a measurement)')
      + '; per process the median of the calls after the first.', '',
      '| setting | ms per teacher, per process | median | ratio to '
      '`plain` within each repeat | CPU ms per teacher, median | logit sum |',
      '|---|---|---|---|---|---|']
  plain = [statistics.median(r['ms_per_teacher']) for r in result['runs']
           if r['mode'] == 'plain']
  for mode in _MODES:
    runs = [r for r in result['runs'] if r['mode'] == mode]
    per = [statistics.median(r['ms_per_teacher']) for r in runs]
    ratios = [v / p for v, p in zip(per, plain)]
    lines.append(f"| `{mode}` | {' / '.join(f'{v:.2f}' for v in per)} | "
                 f'**{statistics.median(per):.2f}** | '
                 f"{' / '.join(f'{v:.2f}' for v in ratios)} "
                 f'(median **{statistics.median(ratios):.2f}**) | '
                 f"{statistics.median(r['cpu_ms_per_teacher'] for r in runs):.2f}"
                 ' | '
                 f"{' / '.join(str(r['logit_sum']) for r in runs)} |")
  return '\n'.join(lines) + '\n'


def main(argv) -> None:
  del argv
  if _CHILD.value:
    unknown = sorted(set(_CHILD.value) - set(_MODES))
    if unknown:
      raise app.UsageError(f'--child: unknown settings {unknown}')
    print(json.dumps([_child(mode) for mode in _CHILD.value]))
    return
  runs = []
  processes = (tuple((mode,) for mode in _MODES) if _FRESH.value else
               _SHARED_PROCESSES)
  for _ in range(_REPEATS.value):
    for modes in processes:
      runs += common.run_child(
          'speed.worker_grappler', f'--child={",".join(modes)}',
          f'--teachers={_TEACHERS.value}', f'--pool={_POOL.value}',
          f'--calls={_CALLS.value}')
      for run in runs[-len(modes):]:
        print(run['mode'], run['ms_per_teacher'], flush=True)
  result = {'command': common.command('speed.worker_grappler'),
            'machine': common.machine(), 'teachers': _TEACHERS.value,
            'pool': _POOL.value, 'fresh_processes': _FRESH.value,
            'runs': runs}
  print(common.write_result(_OUT.value, result, _report))


if __name__ == '__main__':
  app.run(main)
