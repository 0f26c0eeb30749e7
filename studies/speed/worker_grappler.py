r"""KD teachers scoring a pool: in a plain `tf.function` and in TFF's worker.

FedDF's teacher phase cost about 17.5 ms per teacher inside TFF's runtime
against about 7 ms in a plain `tf.function` (feddf_teacher_phase.md). This
script times the same work, `tff_kd.core.teachers.stacked_logits` of K
stacked small-CNN teachers on an N-image pool with one thread per op,
timestamps inside the graph, each setting in a fresh process:

* `plain`: a `tf.function` in this process's TensorFlow (Grappler on);
* `plain_no_grappler`: the same with Grappler off;
* `worker_static`: a TFF computation in the local worker, compiled TFF's
  way (`runtime.grappler='static'`, the default);
* `worker_grappler`: the same, Grappler left to the worker
  (`runtime.grappler='worker'`, `tff_kd.runtime.graph_rewrites`).

The settings alternate within each repeat. Reports the median over a
process's calls after the first, then the median over repeats, and the
sum of the logits (the same work in every setting).

Usage (about 10 s per process on 2 CPU cores):
  .venv/bin/python -m studies.speed.worker_grappler --repeats=2 \
      --out=studies/speed/results/worker_grappler
"""

import json
import os
import statistics

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

_MODES = ('plain', 'plain_no_grappler', 'worker_static', 'worker_grappler')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Processes per setting.')
_TEACHERS = flags.DEFINE_integer('teachers', 50, 'K.')
_POOL = flags.DEFINE_integer('pool', 2000, 'N, the pool images (28x28x1).')
_CALLS = flags.DEFINE_integer('calls', 4, 'Timed calls per process.')
_OUT = flags.DEFINE_string('out', 'studies/speed/results/worker_grappler',
                           'Result prefix (.json, .md).')
_CHILD = flags.DEFINE_enum('child', None, _MODES,
                           'Run one setting and print its JSON (internal).')


def _child(mode: str) -> dict:
  """One setting's per-teacher milliseconds, in this (fresh) process."""
  k, n = _TEACHERS.value, _POOL.value
  if mode == 'plain_no_grappler':
    tf.config.optimizer.set_experimental_options(
        {'disable_meta_optimizer': True})

  def build():
    return classifiers.build_classifier(
        'cnn', input_shape=(28, 28, 1), num_classes=10).model

  shapes = local_training.model_weights(local_training.structure_of(build))

  def score(trainable, non_trainable, x):
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
        grappler='worker' if mode == 'worker_grappler' else 'static')
    fn = tff.tensorflow.computation(
        specs[0], specs[1], tff.TensorType(np.float32, x.shape))(score)
  else:
    fn = score
  times, total = [], None
  for _ in range(_CALLS.value + 1):
    total, seconds = fn(trainable, non_trainable, x)
    times.append(float(seconds))
  return {'mode': mode, 'ms_per_teacher': [1000 * t / k for t in times[1:]],
          'logit_sum': float(total)}


def _report(result: dict) -> str:
  lines = [
      '# KD teachers scoring a pool: plain `tf.function` and TFF\'s worker',
      '', f"Command: `{result['command']}`", '',
      f"Machine: {result['machine']}. {result['teachers']} small-CNN "
      f"teachers (`teachers.stacked_logits`) on {result['pool']} images, "
      'one thread per op, timestamps inside the graph; each setting a '
      'fresh process, alternated; per process the median of the calls '
      'after the first.', '',
      '| setting | ms per teacher, per process | median | logit sum |',
      '|---|---|---|---|']
  for mode in _MODES:
    runs = [r for r in result['runs'] if r['mode'] == mode]
    per = [statistics.median(r['ms_per_teacher']) for r in runs]
    lines.append(f"| `{mode}` | {' / '.join(f'{v:.2f}' for v in per)} | "
                 f'**{statistics.median(per):.2f}** | '
                 f"{' / '.join(str(r['logit_sum']) for r in runs)} |")
  return '\n'.join(lines) + '\n'


def main(argv) -> None:
  del argv
  if _CHILD.value:
    print(json.dumps(_child(_CHILD.value)))
    return
  runs = []
  for _ in range(_REPEATS.value):
    for mode in _MODES:
      runs.append(common.run_child(
          'speed.worker_grappler', f'--child={mode}',
          f'--teachers={_TEACHERS.value}', f'--pool={_POOL.value}',
          f'--calls={_CALLS.value}'))
      print(mode, runs[-1]['ms_per_teacher'], flush=True)
  result = {'command': common.command('speed.worker_grappler'),
            'machine': common.machine(), 'teachers': _TEACHERS.value,
            'pool': _POOL.value, 'runs': runs}
  print(common.write_result(_OUT.value, result, _report))


if __name__ == '__main__':
  app.run(main)
