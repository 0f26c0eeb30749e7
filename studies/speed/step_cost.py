r"""One local step's arithmetic: DaFKD's joint step against FedAvg's.

DaFKD's client step (Wang et al., CVPR 2023, eq. 9; `gan.client_gan_step`)
trains the classifier and the discriminator head on the shared extractor.
With the default `dafkd.discriminator_mode='inference'` the extractor runs
three times per step: on the real batch in training mode (the
cross-entropy), on the real batch in inference mode (eq. 2's real term,
scored as the server scores) and on the negatives (eq. 2's fake term), and
eq. 9's gradient flows back through all three passes. FedAvg's step is one
training-mode pass and its backward.

This script builds both steps on the same Keras classifier (the library's
builders; DaFKD's models and GAN settings from `DaFKDHparams()` with
`pool='real'`, the `real_pool` preset) and records, per step of
`--batch_size` examples:

* `mflop`: the floating-point operations of one traced step
  (TensorFlow's graph profiler: forward, loss, backward and a plain SGD
  update, the same optimiser in both), and their ratio to FedAvg's;
* `ms`: the wall time of that step as a `tf.function` on one
  thread (the local worker's `runtime.intra_op_threads=1`), the median of
  `--repeats` timed calls, the calls alternated.

A third row is the classifier's inference-mode forward pass on the batch:
what one KD teacher costs per pool image (FedDF's server scores the pool
with each of the K teachers).

Usage (a minute on 2 CPU cores):
  TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -m studies.speed.step_cost \
      --out=studies/speed/results/step_cost
"""

import statistics
import time

from absl import app
from absl import flags
import tensorflow as tf
import tensorflow_federated as tff

from studies import common
from tff_kd.methods.dafkd import dafkd_tff
from tff_kd.methods.dafkd import gan
from tff_kd.methods.dafkd import hparams as dafkd_hparams
from tff_kd.models import classifiers

_MODEL = flags.DEFINE_string('model', 'cnn', 'Classifier name.')
_SHAPE = flags.DEFINE_list('input_shape', ['28', '28', '1'],
                           'Image shape (MNIST by default).')
_CLASSES = flags.DEFINE_integer('num_classes', 10, 'Classes.')
_BATCH = flags.DEFINE_integer('batch_size', 32, 'Examples per step (and '
                              'negatives per DaFKD step).')
_REPEATS = flags.DEFINE_integer('repeats', 200, 'Timed calls per step.')
_OUT = flags.DEFINE_string('out', 'studies/speed/results/step_cost',
                           'Result path without its extension.')


def _flops(concrete: tf.types.experimental.ConcreteFunction) -> int:
  """Float operations of a traced function's graph (TF's profiler)."""
  # The v1 profiler is TensorFlow's FLOP counter for a graph.
  from tensorflow.python.profiler import model_analyzer  # pylint: disable=g-import-not-at-top
  from tensorflow.python.profiler import option_builder  # pylint: disable=g-import-not-at-top
  options = option_builder.ProfileOptionBuilder.float_operation()
  options['output'] = 'none'
  return int(model_analyzer.profile(concrete.graph,
                                    options=options).total_float_ops)


def _steps(shape: tuple[int, ...], num_classes: int):
  """FedAvg's and DaFKD's steps and the classifier's inference pass (a
  teacher scoring a batch) as `tf.function`s, and DaFKD's settings."""

  def classifier_fn():
    return classifiers.build_classifier(_MODEL.value, input_shape=shape,
                                        num_classes=num_classes)

  hparams = dafkd_hparams.DaFKDHparams(pool='real')
  spec = dafkd_tff.model_spec(classifier_fn, hparams)
  models = spec.build()
  fedavg_model = classifier_fn().model
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=0.01)
  optimizers = gan.GanOptimizers(sgd, sgd)
  states = (gan.initial_optimizer_state(
      sgd, gan.gan_variables(*models).joint), ())
  fedavg_state = sgd.initialize(tuple(
      tf.TensorSpec(v.shape, v.dtype)
      for v in fedavg_model.trainable_variables))
  seed = tf.constant([1, 2], tf.int64)

  @tf.function(autograph=False)
  def fedavg(x, y):
    variables = fedavg_model.trainable_variables
    with tf.GradientTape() as tape:
      logits = fedavg_model(x, training=True)
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=y, logits=logits))
    grads = tape.gradient(loss, variables)
    _, updated = sgd.next(fedavg_state, tuple(variables), tuple(grads))
    for variable, value in zip(variables, updated):
      variable.assign(value)
    return loss

  @tf.function(autograph=False)
  def dafkd(x, y, negatives):
    # The real pool's negatives: no generator step (`client_gan_step`).
    return gan.client_gan_step(models, {'x': x, 'y': y}, optimizers,
                               states, spec.settings, seed,
                               negatives=negatives).ce_loss

  @tf.function(autograph=False)
  def forward(x):
    return fedavg_model(x, training=False)

  return fedavg, dafkd, forward, spec.settings


def _median_ms(calls, repeats: int) -> list[float]:
  """Median wall ms of each no-arg call, the calls alternated."""
  for call in calls:
    call()  # Traced and warmed outside the timing.
  times = [[] for _ in calls]
  for _ in range(repeats):
    for i, call in enumerate(calls):
      start = time.perf_counter()
      tf.nest.map_structure(lambda t: t.numpy(), call())
      times[i].append(1000 * (time.perf_counter() - start))
  return [statistics.median(t) for t in times]


def _markdown(result: dict) -> str:
  rows = result['rows']
  lines = [
      '# One local step: DaFKD\'s joint step against FedAvg\'s',
      '',
      f"Command: `{result['command']}`",
      f"Machine: {result['machine']}",
      '',
      f"{result['setting']}",
      '',
      '| step | MFLOP | x FedAvg | ms (median, 1 thread) | x FedAvg |',
      '|---|---|---|---|---|',
  ]
  base = rows[0]
  for row in rows:
    lines.append(
        f"| {row['step']} | {row['mflop']:.1f} | "
        f"{row['mflop'] / base['mflop']:.2f} | {row['ms']:.2f} | "
        f"{row['ms'] / base['ms']:.2f} |")
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  shape = tuple(int(s) for s in _SHAPE.value)
  batch = _BATCH.value
  fedavg, dafkd, forward, settings = _steps(shape, _CLASSES.value)
  images = tf.TensorSpec([batch, *shape], tf.float32)
  labels = tf.TensorSpec([batch], tf.int32)
  mflop = [_flops(fedavg.get_concrete_function(images, labels)) / 1e6,
           _flops(dafkd.get_concrete_function(images, labels, images)) / 1e6,
           _flops(forward.get_concrete_function(images)) / 1e6]
  rng = tf.random.Generator.from_seed(0)
  x = rng.uniform([batch, *shape])
  negatives = rng.uniform([batch, *shape])
  y = rng.uniform([batch], 0, _CLASSES.value, tf.int32)
  ms = _median_ms([lambda: fedavg(x, y), lambda: dafkd(x, y, negatives),
                   lambda: forward(x)], _REPEATS.value)
  result = {
      'command': common.command('speed.step_cost'),
      'machine': common.machine(),
      'setting': (
          f'Classifier `{_MODEL.value}` on {shape} images, {batch} examples '
          f'per step (DaFKD: and {batch} negatives), DaFKD\'s '
          f'discriminator_mode={settings.discriminator_mode!r}, '
          f'detach_extractor={settings.detach_extractor}, '
          f'gp_weight={settings.gp_weight}; one step with a plain SGD update '
          f'(the same in both); {_REPEATS.value} timed calls each.'),
      'rows': [
          {'step': 'FedAvg (cross-entropy)', 'mflop': mflop[0], 'ms': ms[0]},
          {'step': 'DaFKD (eq. 9: cross-entropy + eq. 2)',
           'mflop': mflop[1], 'ms': ms[1]},
          {'step': 'Inference forward (a teacher scoring the batch)',
           'mflop': mflop[2], 'ms': ms[2]},
      ],
  }
  print(common.write_result(_OUT.value, result, _markdown))


if __name__ == '__main__':
  app.run(main)
