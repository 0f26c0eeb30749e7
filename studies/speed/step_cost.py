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

The last two rows are the same two steps for `--fused_clients` clients in
lockstep, each with its own weights and batch (`tff_kd.core.fused.
StackedModel`: one grouped convolution or batched matmul per layer, as
`runtime.client_execution='fused'` runs FedAvg's clients), per client: what
fusing DaFKD's clients could save at most on this step. The fused DaFKD
step is built here from the public pieces (the classifier in training mode,
the discriminator's image-to-logit model in inference mode on the real
batch and on the negatives, eq. 9 per client); the library has no fused
DaFKD client.

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
from tff_kd.core import fused
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
_FUSED = flags.DEFINE_integer('fused_clients', 5, 'Clients per fused step '
                              '(G; 0 leaves the fused rows out).')
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
  teacher scoring a batch) as `tf.function`s, DaFKD's settings, and the
  models they train (DaFKD's `GanModels`, FedAvg's Keras model)."""

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

  return fedavg, dafkd, forward, spec.settings, models, fedavg_model


def _stacked_variables(trainable, non_trainable, g: int
                       ) -> tuple[list[tf.Variable], list[tf.Variable]]:
  """The clients' weights: G copies of each value (`fused.stack`), held in
  variables [G, ...]; (trainable, non-trainable)."""
  stacked = fused.stack(tff.learning.models.ModelWeights(
      list(trainable), list(non_trainable)), g)
  return ([tf.Variable(t) for t in stacked.trainable],
          [tf.Variable(t) for t in stacked.non_trainable])


def _fused_steps(models: gan.GanModels, fedavg_model: tf.keras.Model,
                 settings: gan.GanSettings, g: int):
  """FedAvg's and DaFKD's steps for G clients in lockstep (`StackedModel`).

  Each client g steps on its own batch `x[g]` (and negatives
  `negatives[g]`) with its own weights, held [G, ...]; the loss is the sum
  over clients of each one's mean loss, so each client's gradient is its
  own step's. The same plain SGD update as the per-client steps.
  """
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=0.01)

  def sgd_step(stacked, grads):
    state = sgd.initialize(tuple(tf.TensorSpec(v.shape, v.dtype)
                                 for v in stacked))
    _, updated = sgd.next(state, tuple(stacked), tuple(grads))
    for variable, value in zip(stacked, updated):
      variable.assign(value)

  def cross_entropy(labels, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits), axis=1)

  fedavg_net = fused.StackedModel(fedavg_model)
  fedavg_vars, fedavg_stats = _stacked_variables(
      fedavg_model.trainable_weights, fedavg_model.non_trainable_weights, g)

  @tf.function(autograph=False)
  def fedavg(x, y):
    mask = tf.ones(tf.shape(y), tf.float32)
    with tf.GradientTape() as tape:
      logits, stats = fedavg_net(list(fedavg_vars), list(fedavg_stats), x,
                                 mask, training=True)
      loss = tf.reduce_sum(cross_entropy(y, logits))
    sgd_step(fedavg_vars, tape.gradient(loss, fedavg_vars))
    for variable, value in zip(fedavg_stats, stats):
      variable.assign(value)
    return loss

  # The joint variables of eq. 9 (classifier and discriminator head, the
  # extractor shared), stacked once; each model reads its own in its order.
  classifier = models.classifier.model
  disc = models.discriminator.logit_model
  joint = gan.gan_variables(*models).joint
  stats = list({v.ref(): v for v in (classifier.non_trainable_weights +
                                     disc.non_trainable_weights)}.values())
  joint_vars, stat_vars = _stacked_variables(joint, stats, g)
  index = {v.ref(): i for i, v in enumerate(joint)}
  stat_index = {v.ref(): i for i, v in enumerate(stats)}
  classifier_net = fused.StackedModel(classifier)
  disc_net = fused.StackedModel(disc)

  def weights_of(model, trainable, statistics):
    return ([trainable[index[v.ref()]] for v in model.trainable_weights],
            [statistics[stat_index[v.ref()]]
             for v in model.non_trainable_weights])

  @tf.function(autograph=False)
  def dafkd(x, y, negatives):
    mask = tf.ones(tf.shape(y), tf.float32)
    statistics = list(stat_vars)
    with tf.GradientTape() as tape:
      trainable = list(joint_vars)
      tape.watch(trainable)
      logits, new_stats = classifier_net(
          *weights_of(classifier, trainable, statistics), x, mask,
          training=True)
      for v, value in zip(classifier.non_trainable_weights, new_stats):
        statistics[stat_index[v.ref()]] = value
      # Eq. 2 in the server's mode ('inference'), after the real batch's
      # moving-statistics update, as `client_gan_step` orders it.
      d_real, _ = disc_net(*weights_of(disc, trainable, statistics), x,
                           mask, training=False)
      d_fake, _ = disc_net(*weights_of(disc, trainable, statistics),
                           negatives, mask, training=False)
      # Eq. 2, each client's on its own scores.
      disc_loss = tf.stack([
          gan.discriminator_loss(d_real[i], d_fake[i], from_logits=True)
          for i in range(g)])
      loss = tf.reduce_sum(cross_entropy(y, logits) +
                           settings.adv_weight * disc_loss)
    sgd_step(joint_vars, tape.gradient(loss, trainable))
    for variable, value in zip(stat_vars, statistics):
      variable.assign(value)
    return loss

  return fedavg, dafkd


def _fused_loss_error(models: gan.GanModels, settings: gan.GanSettings,
                      fused_dafkd, x, y, negatives) -> float:
  """|fused eq. 9 loss - sum of the per-client ones| / the sum, all from
  the same (tiled) start: the fused step computes the per-client step's
  function. Restores every variable it moves."""
  variables = list({v.ref(): v for m in (models.classifier.model,
                                         models.discriminator.model)
                    for v in m.weights}.values())
  start = [tf.identity(v) for v in variables]
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=0.0)
  optimizers = gan.GanOptimizers(sgd, sgd)
  states = (gan.initial_optimizer_state(
      sgd, gan.gan_variables(*models).joint), ())
  total = 0.0
  for g in range(int(x.shape[0])):
    r = gan.client_gan_step(models, {'x': x[g], 'y': y[g]}, optimizers,
                            states, settings, tf.constant([1, 2], tf.int64),
                            negatives=negatives[g])
    total += float(r.ce_loss + settings.adv_weight * r.disc_loss)
    for v, value in zip(variables, start):
      v.assign(value)
  fused_loss = float(fused_dafkd(x, y, negatives))
  return abs(fused_loss - total) / abs(total)


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
  fedavg, dafkd, forward, settings, models, fedavg_model = _steps(
      shape, _CLASSES.value)
  images = tf.TensorSpec([batch, *shape], tf.float32)
  labels = tf.TensorSpec([batch], tf.int32)
  mflop = [_flops(fedavg.get_concrete_function(images, labels)) / 1e6,
           _flops(dafkd.get_concrete_function(images, labels, images)) / 1e6,
           _flops(forward.get_concrete_function(images)) / 1e6]
  rng = tf.random.Generator.from_seed(0)
  x = rng.uniform([batch, *shape])
  negatives = rng.uniform([batch, *shape])
  y = rng.uniform([batch], 0, _CLASSES.value, tf.int32)
  calls = [lambda: fedavg(x, y), lambda: dafkd(x, y, negatives),
           lambda: forward(x)]
  g = _FUSED.value
  if g:
    fused_fedavg, fused_dafkd = _fused_steps(models, fedavg_model,
                                            settings, g)
    gx = rng.uniform([g, batch, *shape])
    gnegatives = rng.uniform([g, batch, *shape])
    gy = rng.uniform([g, batch], 0, _CLASSES.value, tf.int32)
    gimages = tf.TensorSpec([g, batch, *shape], tf.float32)
    glabels = tf.TensorSpec([g, batch], tf.int32)
    mflop += [
        _flops(fused_fedavg.get_concrete_function(gimages, glabels)) / 1e6
        / g,
        _flops(fused_dafkd.get_concrete_function(gimages, glabels, gimages))
        / 1e6 / g]
    fused_loss_error = _fused_loss_error(models, settings, fused_dafkd, gx,
                                         gy, gnegatives)
    calls += [lambda: fused_fedavg(gx, gy),
              lambda: fused_dafkd(gx, gy, gnegatives)]
  ms = _median_ms(calls, _REPEATS.value)
  ms[3:] = [t / g for t in ms[3:]]
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
      ] + ([
          {'step': f'FedAvg, {g} clients fused (per client)',
           'mflop': mflop[3], 'ms': ms[3]},
          {'step': f'DaFKD eq. 9, {g} clients fused (per client)',
           'mflop': mflop[4], 'ms': ms[4]},
      ] if g else []),
  }
  if g:
    result['fused_loss_error'] = fused_loss_error
  print(common.write_result(_OUT.value, result, _markdown))


if __name__ == '__main__':
  app.run(main)
