r"""Where a DaFKD round goes, next to FedAvg's on the same clients.

Workload: `configs/compare_mnist.py` as `benchmarks/compare_methods.py` runs
it (MNIST, 20 clients, 8 per round, Dir(0.1), the small CNN, 10 local
epochs of batch 32), with one of its DaFKD variants (`--variant`, e.g.
`dafkd`: 100 GAN steps at the end of each client round, the DCGAN
generator, averaging by examples; or `dafkd_local_aux_proj`) and its
`fedavg` variant. Both processes are built in this one process and every
round runs, on the same sampled clients:

  * DaFKD's `process.next` and FedAvg's `process.next` (the runtime, as
    `train` calls them; each process keeps its own state);
  * DaFKD's client work in pure TensorFlow, in this process, from the
    round's starting state (the DaFKD process's): every client's
    `dafkd_tf.client_round` as a whole, and the same client's work split
    into its parts, each a loop of its own over the client's batches: the
    data pipeline alone, the plain cross-entropy steps (the steps before the
    GAN window), the GAN steps' joint step (eq. 9 on classifier and
    discriminator, with the pseudo batch it generates:
    `gan.client_gan_step(train_generator=False)`) and their generator step
    (eq. 3, `gan._generator_step`), plus FedAvg's `train_locally` on the
    same datasets;
  * DaFKD's server round in pure TensorFlow, on those clients' uploads:
    `dafkd_tf.server_round` as a whole, and its parts, each a
    `tf.function` of its own: pool generation (`pseudo_pool`), teacher and
    discriminator scoring (`teacher_outputs`, eq. 7's weights and eq. 8's
    target), the mechanism diagnostics on the labeled validation set
    (`_diagnose`; 0 in the rounds that `dafkd.diagnostics_every` skips)
    and the distillation (with the student's agreement before and after).

The pure-TF server round's new classifier is compared with `process.next`'s
(max abs difference), so the parts time the work the runtime does. Round 1
(tracing) is reported apart from the median over rounds 2..N. Each process
runs in the context `train` installs for its config (its `runtime`
settings: compare_mnist's METHOD_OVERRIDES run DaFKD one client at a time
with every core per op), the pure-TF parts in this process with
TensorFlow's default threads.

Flags `--manual_dir`, `--data_dir` and `--config` are
`benchmarks/compare_methods.py`'s.

Usage (about 5 minutes on 2 busy cores):
  TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -m benchmarks.dafkd_breakdown \
      --variant=dafkd --timed_rounds=3
"""

import os
import statistics
import tempfile
import time
from typing import Any, Callable, Optional

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

from benchmarks import common as benchmark_common
from benchmarks import compare_methods  # Installs the tff_kd context.
from tff_kd import hparams as hp
from tff_kd.core import distillation
from tff_kd.core import local_training
from tff_kd.core import loops
from tff_kd.methods import common
from tff_kd.methods.dafkd import dafkd_tf
from tff_kd.methods.dafkd import dafkd_tff
from tff_kd.methods.dafkd import gan
from tff_kd.methods.dafkd import hparams as hparams_lib
from tff_kd.program import checkpoints
from tff_kd.runtime import context
from tff_kd.program import experiment
from tff_kd.program import sampling
from tff_kd.program import settings as settings_lib
from tff_kd.program import validation as validation_lib
# pylint: enable=g-import-not-at-top,wrong-import-position

ModelWeights = tff.learning.models.ModelWeights

_VARIANT = flags.DEFINE_string(
    'variant', 'dafkd', 'A DaFKD variant of benchmarks/compare_methods.py.')
_TIMED_ROUNDS = flags.DEFINE_integer(
    'timed_rounds', 3, 'Rounds run (the first one traces).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed.')
_EXTRA = flags.DEFINE_list(
    'extra_overrides', [], 'key=value config overrides for the DaFKD '
    'variant (e.g. dafkd.diagnostics_every=5); recorded in the results.')
_DEFAULT_RUNTIME = flags.DEFINE_bool(
    'default_runtime', False, "Also time DaFKD's `process.next` (same start "
    "state, output dropped) with the runtime section's defaults, when its "
    'config has other runtime settings.')
_PARTS = flags.DEFINE_bool(
    'parts', True, 'Time the pure-TF parts too (--noparts: only the '
    '`process.next` calls, for more rounds in the same time).')
_NOTE = flags.DEFINE_string('note', '', 'Text added to the Markdown.')
_RESULT = flags.DEFINE_string(
    'result', '', 'Output prefix (.json and .md); default '
    'benchmarks/results/dafkd_breakdown_<variant>.')


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
  t0 = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - t0


def _tensors(structure):
  return tf.nest.map_structure(tf.convert_to_tensor, structure)


# -- Client parts: each loops one kind of step over a client's batches, from
# the broadcast models, as `dafkd_tf.client_round` runs it.


@tf.function(autograph=False)
def _data_only(dataset: tf.data.Dataset) -> tf.Tensor:
  """Iterates the batches and counts them (the data pipeline alone)."""
  return loops.fold_batches(dataset, lambda n, batch: n + 1, tf.constant(0))


@tf.function(autograph=False)
def _ce_steps(models: gan.GanModels, weights, row, dataset: tf.data.Dataset,
              optimizer, learning_rate: tf.Tensor) -> tf.Tensor:
  """The round's plain cross-entropy steps (`_cross_entropy_step`)."""
  dafkd_tf._start_round(models, weights, row)  # pylint: disable=protected-access
  joint = gan.gan_variables(*models).joint
  state = gan.initial_optimizer_state(optimizer, joint, learning_rate)

  def step(carry, batch):
    state, total = carry
    ce, state = dafkd_tf._cross_entropy_step(  # pylint: disable=protected-access
        models.classifier, joint, batch, optimizer, state)
    return state, total + ce

  return loops.fold_batches(dataset, step, (state, tf.constant(0.0)))[1]


@tf.function(autograph=False)
def _joint_steps(models: gan.GanModels, weights, row,
                 dataset: tf.data.Dataset, optimizers: gan.GanOptimizers,
                 learning_rate: tf.Tensor, seed: tf.Tensor,
                 settings: gan.GanSettings) -> tf.Tensor:
  """The GAN steps' joint step (eq. 9 with its pseudo batch), no eq. 3."""
  dafkd_tf._start_round(models, weights, row)  # pylint: disable=protected-access
  variables = gan.gan_variables(*models)
  joint_state = gan.initial_optimizer_state(optimizers.joint, variables.joint,
                                            learning_rate)
  gen_state = gan.initial_optimizer_state(optimizers.generator,
                                          variables.generator)

  def step(carry, batch):
    state, i, total = carry
    r = gan.client_gan_step(models, batch, optimizers, (state, gen_state),
                            settings, dafkd_tf.step_seed(seed, i),
                            train_generator=False)
    return r.joint_state, i + 1, total + r.disc_loss

  return loops.fold_batches(
      dataset, step, (joint_state, tf.constant(0), tf.constant(0.0)))[2]


@tf.function(autograph=False)
def _generator_steps(models: gan.GanModels, weights, row,
                     dataset: tf.data.Dataset, optimizers: gan.GanOptimizers,
                     seed: tf.Tensor, settings: gan.GanSettings) -> tf.Tensor:
  """The GAN steps' generator updates (eq. 3, `generator_steps` each)."""
  dafkd_tf._start_round(models, weights, row)  # pylint: disable=protected-access
  gen_state = gan.initial_optimizer_state(
      optimizers.generator, gan.gan_variables(*models).generator)

  def step(carry, batch):
    state, i, total = carry
    for j in range(settings.generator_steps):
      state, loss = gan._generator_step(  # pylint: disable=protected-access
          models, optimizers.generator, state, tf.shape(batch['y'])[0],
          settings, dafkd_tf.step_seed(seed + j, i), batch['y'])
      total += loss
    return state, i + 1, total

  return loops.fold_batches(
      dataset, step, (gen_state, tf.constant(0), tf.constant(0.0)))[2]


def _split_steps(num_steps: int, settings: gan.GanSettings) -> tuple[int,
                                                                     int]:
  """(first GAN step, GAN steps) of a client round of `num_steps` steps."""
  if not settings.gan_steps:
    return 0, num_steps
  gan_steps = min(settings.gan_steps, num_steps)
  first = num_steps - gan_steps if settings.gan_window == 'last' else 0
  return first, gan_steps


# -- Server parts, as `dafkd_tf.server_round` runs them.


@tf.function(autograph=False)
def _pool_part(generator: tf.keras.Model, generator_weights: ModelWeights,
               settings: dafkd_tf.ServerSettings, seed: tf.Tensor):
  """Loads the pool's generator and draws the pool (`pseudo_pool`)."""
  tf.nest.map_structure(lambda v, t: v.assign(t),
                        local_training.model_weights(generator),
                        generator_weights)
  return dafkd_tf.pseudo_pool(generator, settings.pool_size,
                              noise_dim=settings.gan.noise_dim,
                              num_classes=settings.gan.num_classes,
                              seed=seed, with_labels=True)


@tf.function(autograph=False)
def _teacher_part(models: gan.GanModels, global_classifier: ModelWeights,
                  uploads: dafkd_tf.Uploads, pool: tf.Tensor,
                  pool_labels: tf.Tensor, settings: dafkd_tf.ServerSettings):
  """Teachers' logits and scores on the pool, eq. 7's alpha, eq. 8's target."""
  logits, scores = dafkd_tf.teacher_outputs(
      models.classifier, models.discriminator, global_classifier,
      uploads.classifier_deltas, uploads.discriminator_rows, uploads.valid,
      pool, labels=pool_labels)
  alpha = dafkd_tf.teacher_weights(scores, uploads.valid,
                                   correlation=settings.correlation)
  target = distillation.weighted_ensemble(
      logits, alpha, temperature=settings.distill.temperature,
      ensemble=settings.ensemble)
  return logits, scores, target, gan.weights_entropy(alpha)


@tf.function(autograph=False)
def _diagnose_part(models: gan.GanModels, global_classifier: ModelWeights,
                   uploads: dafkd_tf.Uploads, logits: tf.Tensor,
                   scores: tf.Tensor, target: tf.Tensor,
                   validation: dafkd_tf.Validation,
                   settings: dafkd_tf.ServerSettings,
                   pool_labels: tf.Tensor):
  """`dafkd_tf._diagnose` (teachers on the validation set, metrics)."""
  return dafkd_tf._diagnose(  # pylint: disable=protected-access
      models, global_classifier, uploads, (logits, scores), target,
      validation, settings.correlation, pool_labels)


@tf.function(autograph=False)
def _distill_part(classifier, optimizer, new_classifier: ModelWeights,
                  pool: tf.Tensor, target: tf.Tensor,
                  config: distillation.DistillConfig, labeled):
  """Loads the mean classifier; agreement before, distillation, after."""
  tf.nest.map_structure(lambda v, t: v.assign(t),
                        local_training.model_weights(classifier.model),
                        new_classifier)
  before = distillation.teacher_logits([classifier.model], pool)[0]
  result = distillation.distill(classifier.model, optimizer, pool, target,
                                config, labeled=labeled)
  after = distillation.teacher_logits([classifier.model], pool)[0]
  return (result.weights, dafkd_tf.argmax_agreement(before, target),
          dafkd_tf.argmax_agreement(after, target))


def _stack(rows: list, num_slots: int) -> np.ndarray:
  rows = [np.asarray(r) for r in rows]
  pad = [np.zeros_like(rows[0])] * (num_slots - len(rows))
  return np.stack(rows + pad)


def _uploads(results: list[dafkd_tf.ClientRoundResult], num_slots: int,
             aggregation: str) -> tuple[dafkd_tf.Uploads, tf.Tensor]:
  """The aggregator's `Uploads` (and stacked label counts) of the clients."""
  deltas = ModelWeights(
      [_stack([r.classifier_delta.trainable[i] for r in results], num_slots)
       for i in range(len(results[0].classifier_delta.trainable))],
      [_stack([r.classifier_delta.non_trainable[i] for r in results],
              num_slots)
       for i in range(len(results[0].classifier_delta.non_trainable))])
  rows = [_stack([r.discriminator[i] for r in results], num_slots)
          for i in range(len(results[0].discriminator))]
  examples = np.array([float(r.local.num_examples) for r in results])
  weights = examples if aggregation == 'examples' else np.ones_like(examples)

  def mean(parts):
    return [sum(w * np.asarray(p[i]) for w, p in zip(weights, parts)) /
            weights.sum() for i in range(len(parts[0]))]

  generator_mean = ModelWeights(
      mean([r.generator_delta.trainable for r in results]),
      mean([r.generator_delta.non_trainable for r in results]))
  valid = np.arange(num_slots) < len(results)
  uploads = dafkd_tf.Uploads(
      _tensors(deltas), _tensors(generator_mean), tf.constant(valid),
      _tensors(rows), None,
      tf.constant(_stack(list(examples), num_slots), tf.float32)
      if aggregation == 'examples' else None)
  counts = tf.constant(_stack([r.label_counts for r in results], num_slots))
  return uploads, counts


def _max_abs_diff(a, b) -> float:
  return float(max(np.max(np.abs(np.asarray(x) - np.asarray(y)))
                   for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b))))


class _Runner:
  """The two processes and DaFKD's pure-TF pieces of one run."""

  def __init__(self, variant: str, seed: int, root: str):
    self.config = compare_methods.make_config(variant, seed,
                                              overrides=_EXTRA.value)
    fedavg_config = compare_methods.make_config('fedavg', seed)
    self.exp = experiment.prepare(self.config, os.path.join(root, 'dafkd'))
    self.fedavg = experiment.prepare(fedavg_config,
                                     os.path.join(root, 'fedavg'))
    c = self.config
    self.hparams = hp.section_hparams(c, hparams_lib.DaFKDHparams)
    if self.hparams.private or self.hparams.pool == 'real':
      raise app.UsageError('the breakdown covers plain DaFKD with a '
                           'generated pool (not private, not pool=real)')
    inputs = self.exp.inputs
    self.spec = dafkd_tff.model_spec(inputs.classifier_fn, self.hparams,
                                     c.seed)
    self.optimizers = dafkd_tff.optimizers_from_config(c, self.hparams)
    self.distill_config = common.distill_config(c)
    self.server_settings = dafkd_tff.server_settings(
        self.spec, self.hparams, self.distill_config, self.hparams.pool_size)
    self.client_models = self.spec.build()
    self.server_models = self.spec.build()
    self.fedavg_model = inputs.model_fn()
    self.fedavg_optimizer = common.build_optimizer(c.client_optimizer)
    self.local = validation_lib.local_work(c)
    val_x, val_y = self.exp.server_data.read_validation()
    self.val_x, self.val_y = val_x, val_y
    self.states, self.contexts = {}, {}
    defaults = settings_lib.RuntimeSettings()
    default_runtime = settings_lib.with_overrides(
        c.copy_and_resolve_references(), {
            'runtime.concurrent_clients': defaults.concurrent_clients,
            'runtime.intra_op_threads': defaults.intra_op_threads})
    self.default_runtime = (_DEFAULT_RUNTIME.value and
                            default_runtime.runtime != c.runtime)
    for name, exp, config in (
        ('dafkd', self.exp, c), ('fedavg', self.fedavg, fedavg_config),
        ('dafkd_default_runtime', self.exp, default_runtime)):
      if name == 'dafkd_default_runtime' and not self.default_runtime:
        continue
      # Each process in the context `train` gives its config (its runtime
      # settings); the first call starts that context's worker.
      validation_lib.set_context(config)
      self.contexts[name] = context_stack_impl.context_stack.current
      initial = exp.process.initialize()
      self.states[name] = exp.process.set_model_weights(
          initial, checkpoints.seeded_initial_weights(exp.model_fn))

  def next(self, name: str, keys: list[str], state=None):
    """`process.next` of 'dafkd', 'fedavg' or 'dafkd_default_runtime' in its
    own context, from `state` (default: that process's last state)."""
    context_stack_impl.context_stack.set_default_context(self.contexts[name])
    exp = self.fedavg if name == 'fedavg' else self.exp
    return exp.process.next(
        self.states[name] if state is None else state, keys)

  def round(self, r: int) -> dict:
    """One round: both processes, then (`--parts`) DaFKD's pure-TF parts."""
    c = self.config
    row = {}
    clients = sampling.sample_clients(c.partition.num_clients,
                                      c.clients_per_round, seed=c.seed,
                                      round_num=r)
    keys = self.exp.client_data.keys(clients, seed=c.seed, round_num=r)
    start = self.states['dafkd']
    # The runtime, interleaved with FedAvg's.
    out, row['dafkd_process_next'] = _timed(lambda: self.next('dafkd', keys))
    self.states['dafkd'] = out.state
    fout, row['fedavg_process_next'] = _timed(
        lambda: self.next('fedavg', keys))
    self.states['fedavg'] = fout.state
    row['ratio_process_next'] = (row['dafkd_process_next'] /
                                 row['fedavg_process_next'])
    if self.default_runtime:
      _, row['dafkd_default_runtime_process_next'] = _timed(
          lambda: self.next('dafkd_default_runtime', keys, start))
      row['ratio_default_runtime'] = (
          row['dafkd_default_runtime_process_next'] /
          row['fedavg_process_next'])
    if _PARTS.value:
      row.update(self.pure_tf_round(r, clients, keys, start, out.state))
      row['runtime_overhead'] = (row['dafkd_process_next'] -
                                 row['pure_tf_round'])
    return row

  def pure_tf_round(self, r: int, clients, keys: list[str], start,
                    end) -> dict:
    """DaFKD's round in pure TF from the process state `start`, whole and in
    parts; `end` is the runtime's state after it (for the differences)."""
    c = self.config
    row = {}
    # DaFKD in pure TF, from the round's starting state.
    clf, gen = _tensors(tuple(start.global_model_weights))
    weights = (ModelWeights(list(clf.trainable), list(clf.non_trainable)),
               ModelWeights(list(gen.trainable), list(gen.non_trainable)))
    store = dafkd_tff.discriminator_store(start)
    lr = tf.constant(c.client_optimizer.learning_rate *
                     c.client_optimizer.lr_decay ** r, tf.float32)
    settings = self.spec.settings
    models = self.client_models
    results = []
    parts = dict.fromkeys(
        ('client_round', 'data_only', 'ce_steps', 'joint_steps',
         'generator_steps', 'fedavg_local'), 0.0)
    counts = dict(steps=[], gan_steps=[], ce_steps=[])
    for client, key in zip(clients, keys):
      dataset = self.exp.client_data.dataset_from_key(tf.constant(key),
                                                      self.local)
      disc_row = [tf.constant(a[client]) for a in store]
      seed = dafkd_tf.key_seed(tf.constant(key))
      result, t = _timed(lambda: dafkd_tf.client_round(  # pylint: disable=cell-var-from-loop
          models, weights, disc_row, dataset, self.optimizers.client, lr,
          seed, settings))
      parts['client_round'] += t
      results.append(result)
      steps = int(result.local.num_steps)
      first, gan_steps = _split_steps(steps, settings)
      ce_data = dataset.take(first)
      gan_data = dataset.skip(first).take(gan_steps)
      counts['steps'].append(steps)
      counts['gan_steps'].append(gan_steps)
      counts['ce_steps'].append(steps - gan_steps)
      for name, fn in (
          ('data_only', lambda: _data_only(dataset)),  # pylint: disable=cell-var-from-loop
          ('ce_steps', lambda: _ce_steps(  # pylint: disable=cell-var-from-loop
              models, weights, disc_row, ce_data, self.optimizers.joint, lr)),
          ('joint_steps', lambda: _joint_steps(  # pylint: disable=cell-var-from-loop
              models, weights, disc_row, gan_data, self.optimizers.client,
              lr, seed, settings)),
          ('generator_steps', lambda: _generator_steps(  # pylint: disable=cell-var-from-loop
              models, weights, disc_row, gan_data, self.optimizers.client,
              seed, settings)),
          ('fedavg_local', lambda: local_training.train_locally(  # pylint: disable=cell-var-from-loop
              self.fedavg_model, self.fedavg_optimizer, weights[0], dataset,
              lr))):
        parts[name] += _timed(fn)[1]
    row.update({f'client_{k}': v for k, v in parts.items()})
    row['counts'] = {k: sum(v) for k, v in counts.items()}
    # The server in pure TF, on these uploads.
    uploads, label_counts = _uploads(results, c.clients_per_round,
                                     self.hparams.aggregation)
    validation = dafkd_tf.Validation(self.val_x, self.val_y, label_counts,
                                     self.hparams.holder_share)
    server = self.server_settings
    pool_seed = dafkd_tf.pool_seed(c.seed, tf.constant(r))
    diagnose = dafkd_tff.diagnostics_round(self.hparams.diagnostics_every, r)
    server_result, row['server_round'] = _timed(
        lambda: dafkd_tf.server_round(
            self.server_models, self.optimizers.distill, weights, uploads,
            server, pool_seed, validation=validation, diagnose=diagnose))
    new_generator = ModelWeights(
        [g + d for g, d in zip(weights[1].trainable,
                               uploads.generator_mean.trainable)],
        list(uploads.generator_mean.non_trainable))
    (pool, pool_labels), row['server_pool'] = _timed(
        lambda: _pool_part(self.server_models.generator,
                           weights[1] if server.pool_from_broadcast
                           else new_generator, server, pool_seed))
    (logits, scores, target, _), row['server_teachers'] = _timed(
        lambda: _teacher_part(self.server_models, weights[0], uploads, pool,
                              pool_labels, server))
    row['server_diagnose'] = 0.0
    if diagnose is None or bool(diagnose):
      _, row['server_diagnose'] = _timed(
          lambda: _diagnose_part(self.server_models, weights[0], uploads,
                                 logits, scores, target, validation, server,
                                 pool_labels))
    new_classifier = dafkd_tf.mean_update(
        weights[0], uploads.classifier_deltas, uploads.valid,
        uploads.example_weights)
    _, row['server_distill'] = _timed(
        lambda: _distill_part(self.server_models.classifier,
                              self.optimizers.distill, new_classifier, pool,
                              target, self.distill_config,
                              (self.val_x, self.val_y)))
    row['server_parts_sum'] = sum(row[k] for k in (
        'server_pool', 'server_teachers', 'server_diagnose',
        'server_distill'))
    row['client_parts_sum'] = sum(row[k] for k in (
        'client_ce_steps', 'client_joint_steps', 'client_generator_steps'))
    row['pure_tf_round'] = row['client_client_round'] + row['server_round']
    row['max_abs_diff_vs_runtime'] = _max_abs_diff(
        server_result.classifier, end.global_model_weights[0])
    row['max_abs_diff_generator_vs_runtime'] = _max_abs_diff(
        server_result.generator, end.global_model_weights[1])
    return row


def _median(values: list) -> Optional[float]:
  return statistics.median(values) if values else None


def _summary(rows: list[dict]) -> dict:
  keys = [k for k, v in rows[0].items() if isinstance(v, float)]
  return {k: dict(first=rows[0][k],
                  median_rest=_median([row[k] for row in rows[1:]]))
          for k in keys}


_ROWS = (
    ('DaFKD `process.next` (runtime)', 'dafkd_process_next'),
    ('FedAvg `process.next` (runtime, same clients)', 'fedavg_process_next'),
    ('**DaFKD / FedAvg, per round**', 'ratio_process_next'),
    ('DaFKD `process.next` with the runtime defaults (one client per core, '
     'one thread per op)', 'dafkd_default_runtime_process_next'),
    ('DaFKD with the runtime defaults / FedAvg, per round',
     'ratio_default_runtime'),
    ('DaFKD pure TF: client rounds (8 clients, `client_round`) + server '
     'round (`server_round`)', 'pure_tf_round'),
    ('runtime overhead (`process.next` - pure TF)', 'runtime_overhead'),
    ('clients: `client_round`, 8 clients, whole', 'client_client_round'),
    ('&nbsp;&nbsp;data pipeline alone (iterate the batches)',
     'client_data_only'),
    ('&nbsp;&nbsp;plain CE steps', 'client_ce_steps'),
    ('&nbsp;&nbsp;GAN steps: joint step (eq. 9, with its pseudo batch)',
     'client_joint_steps'),
    ('&nbsp;&nbsp;GAN steps: generator step (eq. 3)',
     'client_generator_steps'),
    ('&nbsp;&nbsp;parts sum (CE + joint + generator)', 'client_parts_sum'),
    ('&nbsp;&nbsp;FedAvg local work, same datasets, pure TF',
     'client_fedavg_local'),
    ('server: `server_round`, whole', 'server_round'),
    ('&nbsp;&nbsp;pool generation', 'server_pool'),
    ('&nbsp;&nbsp;teachers + discriminators on the pool (`teacher_outputs`, '
     'eq. 7-8)', 'server_teachers'),
    ('&nbsp;&nbsp;diagnostics on the labeled validation set (`_diagnose`)',
     'server_diagnose'),
    ('&nbsp;&nbsp;distillation (+ agreement before / after)',
     'server_distill'),
    ('&nbsp;&nbsp;parts sum', 'server_parts_sum'),
)


def _f(v: Optional[float]) -> str:
  return '-' if v is None else f'{v:.3f}'


def markdown(result: dict) -> str:
  """The result as a Markdown report."""
  s = result['summary']
  counts = result.get('counts_per_round')
  lines = [
      f"# Where a DaFKD round goes: `{result['variant']}` on compare_mnist",
      '', 'Command:', '', f"    {result['command']}", '',
      f"Machine: {result['machine']}. {result['note']}", '',
      f"DaFKD overrides: `{result['overrides']}`. Runtime settings "
      f"(each process in its own context): `{result['runtime']}`; the pure-TF "
      'parts run in this process, one client after the other, with '
      'TensorFlow\'s default threads.', '',
  ] + ([result['extra_note'], ''] if result.get('extra_note') else [])
  if counts:
    lines += [
        f"Per round (8 clients, round {len(result['rounds'])} of the run): "
        f"{counts['steps']} local steps, {counts['ce_steps']} plain CE "
        f"steps, {counts['gan_steps']} GAN steps (each: one joint step + "
        f"{result['generator_steps']} generator step(s)).", '']
  lines += ['| part | round 1 | median, rounds 2..N |', '|---|---|---|']
  for label, key in _ROWS:
    if key in s:
      lines.append(f"| {label} | {_f(s[key]['first'])} | "
                   f"{_f(s[key]['median_rest'])} |")
  lines += ['', 'DaFKD / FedAvg over rounds 2..N, summed seconds: ' + ', '.join(
      f'{k} {v:.2f}' for k, v in result['ratio_of_sums'].items()) + '.', '']
  if not counts:
    return '\n'.join(lines) + '\n'
  per_step = result['per_step_ms']
  lines += [
      'Per step (ms, median rounds): ' + ', '.join(
          f'{k} {v:.2f}' for k, v in per_step.items()) + '.', '',
      'The pure-TF round against `process.next`\'s, max abs difference '
      'of the new models: classifier '
      f"{result['max_abs_diff_vs_runtime']:.2e}, generator "
      f"{result['max_abs_diff_generator_vs_runtime']:.2e}. The two run the "
      'same ops, but TFF\'s worker runs its own copy of TensorFlow, whose '
      'round-off differs; Adam and the GAN amplify it over a round\'s '
      'hundreds of local steps (after 2 local steps and 1 distillation step '
      'the differences were 1.3e-5 and 4.9e-4).', '']
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  variant = _VARIANT.value
  if compare_methods.VARIANTS.get(variant, ('',))[0] != 'dafkd':
    raise app.UsageError(f'--variant={variant!r} is not a DaFKD variant of '
                         'benchmarks/compare_methods.py')
  with tempfile.TemporaryDirectory(prefix='dafkd_breakdown_') as root:
    runner = _Runner(variant, _SEED.value, root)
    rows = []
    try:
      for r in range(_TIMED_ROUNDS.value):
        row = runner.round(r)
        rows.append(row)
        print(f'round {r + 1}: ' + ', '.join(
            f'{k}={v:.3f}' if isinstance(v, float) else f'{k}={v}'
            for k, v in row.items()), flush=True)
    finally:
      context.shutdown()
  summary = _summary(rows)
  rest = rows[1:] or rows

  def per_step(key, count):
    return 1e3 * statistics.median(
        row[key] / max(row['counts'][count], 1) for row in rest)

  fedavg_sum = sum(row['fedavg_process_next'] for row in rest)
  ratio_of_sums = {
      name: sum(row[key] for row in rest) / fedavg_sum
      for name, key in (('dafkd', 'dafkd_process_next'),
                        ('dafkd with the runtime defaults',
                         'dafkd_default_runtime_process_next'))
      if key in rest[0]}
  parts = {}
  if _PARTS.value:
    parts = dict(
        counts_per_round=rows[-1]['counts'],
        per_step_ms=dict(
            ce=per_step('client_ce_steps', 'ce_steps'),
            joint=per_step('client_joint_steps', 'gan_steps'),
            generator=per_step('client_generator_steps', 'gan_steps'),
            fedavg=per_step('client_fedavg_local', 'steps')),
        max_abs_diff_vs_runtime=max(r['max_abs_diff_vs_runtime']
                                    for r in rows),
        max_abs_diff_generator_vs_runtime=max(
            r['max_abs_diff_generator_vs_runtime'] for r in rows))
  result = dict(
      command=benchmark_common.command('dafkd_breakdown'),
      machine=benchmark_common.machine(),
      note=('A shared 2-core machine (other benchmarks and tests ran at the '
            'same time): absolute numbers are noisy; the parts of a round '
            'ran one after the other in that round, so their ratios are '
            'comparable.'),
      variant=variant,
      overrides=dict(compare_methods.VARIANTS[variant][1],
                     extra=list(_EXTRA.value)),
      runtime={name: exp.config.runtime.to_dict() for name, exp in (
          ('dafkd', runner.exp), ('fedavg', runner.fedavg))},
      generator_steps=runner.spec.settings.generator_steps,
      ratio_of_sums=ratio_of_sums, **parts,
      summary=summary, rounds=rows, extra_note=_NOTE.value,
      tff_kd_path=os.path.dirname(os.path.dirname(os.path.abspath(
          dafkd_tf.__file__))))
  out = _RESULT.value or f'benchmarks/results/dafkd_breakdown_{variant}'
  print(benchmark_common.write_result(out, result, markdown, indent=1))


if __name__ == '__main__':
  app.run(main)
