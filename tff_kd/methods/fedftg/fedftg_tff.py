"""FedFTG as a TFF learning process: its stages, builder and registry entry.

Zhang, Shen, Ding, Tao and Duan, "Fine-tuning Global Model via Data-Free
Knowledge Distillation for Non-IID Federated Learning", CVPR 2022: FedAvg,
then server-side data-free fine-tuning of the averaged model with a
conditional image generator (hard-sample mining, customised label sampling,
class-level ensemble; the maths is `tff_kd.methods.fedftg.fedftg_tf`). One
round:

1. distributor: broadcast the classifier's `ModelWeights`;
2. client work: plain local training plus label counts
   (`tff_kd.federated.label_counts.build_client_work`);
3. aggregator: `tff_kd.federated.stacking.build_stacking_aggregator`, so
   every client's model and label counts reach the server;
4. finalizer (`build_fine_tune_finalizer`): the example-weighted mean delta
   is applied with the server optimiser (FedAvg); then `fedftg_tf.fine_tune`
   runs `iterations` generator/student iterations on that averaged model,
   with each received client model as a teacher weighted per class by
   n_{k,c} / sum_j n_{j,c}. With a labeled server validation set
   (`server_data.val_size > 0`), the round's link table
   (`tff_kd.core.links.LinkHook`) is then measured on it, after the
   round's result is fixed (`link_table`).

State: `tff.learning.templates.LearningAlgorithmState` whose
`global_model_weights` is the classifier's `ModelWeights`. The conditional
image generator and its Adam state are server state: they live in the
finalizer's state across rounds (`state.finalizer`, read by
`generator_weights`; as in the paper, the generator keeps improving over
the rounds) and are never broadcast, so the global model stays a single
classifier. The student optimiser's state is fresh every round (the
reference's SGD has none); the student and generator learning rates decay
by `lr_decay` per round (reference 0.998).
"""

import collections
from typing import Callable, NamedTuple, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.core import diagnostics as core_diagnostics
from tff_kd.core import distill_hparams
from tff_kd.core import distillation as distillation_lib
from tff_kd.core import fused
from tff_kd.core import links
from tff_kd.core import local_training
from tff_kd.core import stacking as stacking_tf
from tff_kd.federated import composer
from tff_kd.federated import finalizers
from tff_kd.federated import label_counts
from tff_kd.federated import learning
from tff_kd.federated import schedules
from tff_kd.federated import server_data as server_data_lib
from tff_kd.federated import stacking
from tff_kd.federated import tff_types
from tff_kd.methods import common
from tff_kd.methods.fedftg import fedftg_tf
from tff_kd.methods.fedftg import hparams as hparams_lib
from tff_kd.models import generators


class FineTuning(NamedTuple):
  """Server fine-tuning settings (`fedftg_tf.fine_tune`).

  Attributes:
    generator_fn: Builds the conditional image generator.
    generator_optimizer: Reference: Adam, lr 0.01.
    student_optimizer: Reference: SGD, lr 0.1.
    distill_config: Student steps per iteration (`steps`, reference 5),
      generated batch size, temperature, student mode; val_fraction 0.
    iterations: Iterations per round (reference 10).
    noise_dim: Generator noise size.
    noise: 'gaussian' or 'uniform'.
    transfer_weight: beta_tran.
    diversity_weight: beta_div.
    mask: Hard-sample mask, 'agree' or 'none'.
    ensemble: Class-level ensemble, 'logits' or 'probs'.
    lr_decay: Per-round factor of both learning rates (reference 0.998).
    seed: Seed of the generated labels and noise (with the round number).
    generator_steps: Generator steps per iteration (0: one per teacher).
    teachers: 'models' (one Keras model per teacher slot) | 'stacked' (the
      slots' weights stacked and run as one model,
      `fedftg_tf.StackedTeachers`).
  """

  generator_fn: Callable[[], tf.keras.Model]
  generator_optimizer: tff.learning.optimizers.Optimizer
  student_optimizer: tff.learning.optimizers.Optimizer
  distill_config: distill_hparams.DistillConfig
  iterations: int
  noise_dim: int
  noise: str
  transfer_weight: float
  diversity_weight: float
  mask: str
  ensemble: str
  lr_decay: float
  seed: int
  generator_steps: int = 0
  teachers: str = 'models'

  @property
  def settings(self) -> fedftg_tf.FineTuneSettings:
    """The `fedftg_tf.fine_tune` settings among these."""
    return fedftg_tf.FineTuneSettings(
        self.distill_config, self.iterations, self.noise_dim, self.noise,
        self.transfer_weight, self.diversity_weight, self.mask,
        self.ensemble, self.generator_steps)


def build_fine_tune_finalizer(
    model_fn: tff_types.ModelFn,
    stack_type: tff.Type,
    server_optimizer: tff.learning.optimizers.Optimizer,
    tuning: FineTuning,
    server_data: Optional[server_data_lib.ServerData] = None,
) -> tff.templates.MeasuredProcess:
  """FedAvg of the client models, then FedFTG's server fine-tuning.

  State: `{'server': server-optimiser state, 'generator': generator
  ModelWeights, 'generator_optimizer': its Adam state, 'round': int32}`.
  Measurements (means over the round's iterations): `num_teachers`,
  `generator_loss`, `fidelity`, `transfer`, `diversity`,
  `teacher_accuracy` (class-level ensemble on the generator's labels),
  `distill_loss`, `distill_first_loss`, `distill_last_loss`,
  `student_learning_rate`, and `agreement_before` / `agreement_after` (the
  student's argmax agreement with the class-level teacher on a fixed
  generated batch, before and after the fine-tuning); then the round's
  link table (`tff_kd.core.links.NAMES`, `link_table`) on the server's
  labeled validation images: `teacher_labeled_accuracy` (the received
  client models), `ensemble_labeled_accuracy` (FedFTG's class-level
  ensemble of them, `fedftg_tf.class_weighted_teacher`, weighted by each
  image's true label), `ensemble_labeled_accuracy_logits` / `_probs` (the
  uniform averages), `labeled_accuracy_before` (the FedAvg average, the
  student's start) and `labeled_accuracy_after` (the fine-tuned student).
  `target_entropy` is always -1 (the student distils on generated
  batches, no fixed pool). Without a labeled set (`server_data` None or
  `val_size == 0`) every link reads -1, so the measurement type does not
  depend on the data.

  Args:
    model_fn: Builds the Keras classifier (logits).
    stack_type: Unplaced type of the aggregator's `Stack`.
    server_optimizer: Applies the mean delta (SGD lr 1: FedAvg).
    tuning: Fine-tuning settings.
    server_data: The server's data; only its labeled validation set is
      read (inside the computation, each round), for the link table. None:
      no labeled set.

  Returns:
    A `tff.templates.MeasuredProcess` with the finalizer signature.

  Raises:
    DataError: labeled images whose shape is not the classifier's input.
  """
  model = local_training.structure_of(model_fn)
  labeled = links.labeled_set(server_data, model.input_shape[1:])
  clf_weights = local_training.model_weights(model)
  gen_weights = local_training.model_weights(
      local_training.structure_of(tuning.generator_fn))
  weights_type = tff_types.spec_to_type(clf_weights)
  clf_specs = tff_types.trainable_specs(clf_weights)
  gen_specs = tff_types.trainable_specs(gen_weights)
  num_slots = int(stack_type[1].shape[0])

  @tff.tensorflow.computation
  def init_tf():
    return collections.OrderedDict(
        server=server_optimizer.initialize(clf_specs),
        generator=local_training.model_weights(tuning.generator_fn()),
        generator_optimizer=tuning.generator_optimizer.initialize(gen_specs),
        round=tf.constant(0, tf.int32))

  state_type = init_tf.type_signature.result

  # TFF's compilation: the worker's Grappler made FedFTG's rounds no faster
  # (3.09 / 160.5 s at K = 10 / 100 against 3.23 / 168.1 s) and its first
  # round up to 40 s longer (studies/speed/README.md, "The server step in
  # TFF's runtime").
  @finalizers.server_computation(state_type, weights_type, stack_type,
                                 leave_to_worker=False)
  def finalize_tf(state, g, stack):
    stack = stacking_tf.Stack(*stack)
    filled = tf.range(num_slots) < stack.count
    deltas = stack.values['delta']
    server_state, start = stacking_tf.server_update(
        server_optimizer, state['server'], g, deltas,
        stacking_tf.example_weights(stack.weights, filled))
    if tuning.teachers == 'stacked':
      teachers = fused.StackedModel(model_fn())
    else:
      teachers = [model_fn() for _ in range(num_slots)]
    result, student, generator, table = _server_round(
        fedftg_tf.FineTuneModels(model_fn(), teachers,
                                 tuning.generator_fn()),
        start, g, _Uploads(deltas, filled, stack.values['label_counts']),
        state['generator'], state['generator_optimizer'], state['round'],
        tuning,
        labeled=server_data.read_validation() if labeled else None)
    if not labeled:
      table = links.link_metrics(None, filled, None)
    new_state = collections.OrderedDict(
        server=server_state, generator=generator,
        generator_optimizer=result.generator_state,
        round=state['round'] + 1)
    metrics = collections.OrderedDict(
        num_teachers=tf.cast(stack.count, tf.float32),
        generator_loss=result.generator_loss,
        fidelity=result.fidelity,
        transfer=result.transfer,
        diversity=result.diversity,
        teacher_accuracy=result.teacher_accuracy,
        distill_loss=result.distill_loss,
        distill_first_loss=result.distill_first_loss,
        agreement_before=result.agreement_before,
        agreement_after=result.agreement_after,
        distill_last_loss=result.distill_last_loss,
        student_learning_rate=tuning.student_optimizer.get_hparams(
            result.student_state)['learning_rate'])
    metrics.update(table)
    return new_state, student, metrics

  return finalizers.build_server_finalizer(init_tf, finalize_tf)


@tf.autograph.experimental.do_not_convert
def round_fine_tune(student: tf.keras.Model, teachers, label_counts,
                    generator: tf.keras.Model, generator_state, round_num,
                    tuning: FineTuning, *, teacher_mask=None
                    ) -> fedftg_tf.FineTuneResult:
  """`fedftg_tf.fine_tune` with this round's learning rates and seed.

  Models must already hold their weights. Shared by the finalizer and by
  tests that check it eagerly.
  """
  decay = tf.pow(tf.constant(tuning.lr_decay, tf.float32),
                 tf.cast(round_num, tf.float32))
  gen_state = tf.nest.map_structure(tf.convert_to_tensor, generator_state)
  gen_hparams = tuning.generator_optimizer.get_hparams(gen_state)
  base_lr = tuning.generator_optimizer.get_hparams(
      tuning.generator_optimizer.initialize(()))['learning_rate']
  gen_hparams['learning_rate'] = tf.cast(base_lr, tf.float32) * decay
  gen_state = tuning.generator_optimizer.set_hparams(gen_state, gen_hparams)
  student_state = tuning.student_optimizer.initialize(
      tff_types.trainable_specs(local_training.model_weights(student)))
  student_lr = tf.cast(tuning.student_optimizer.get_hparams(student_state)[
      'learning_rate'], tf.float32) * decay
  return fedftg_tf.fine_tune(
      fedftg_tf.FineTuneModels(student, teachers, generator), label_counts,
      fedftg_tf.FineTuneOptimizers(tuning.generator_optimizer,
                                   tuning.student_optimizer),
      (gen_state, student_state), tuning.settings,
      tf.stack([tf.constant(tuning.seed, tf.int64),
                tf.cast(round_num, tf.int64)]),
      teacher_mask=teacher_mask, student_learning_rate=student_lr)


class _Uploads(NamedTuple):
  """The round's stacked client uploads, [M, ...] rows.

  Attributes:
    deltas: Stacked client model deltas.
    filled: [M] bool, rows that hold a client.
    label_counts: [M, C] the clients' label counts.
  """

  deltas: tff.learning.models.ModelWeights
  filled: tf.Tensor
  label_counts: tf.Tensor


@tf.function(autograph=False)
def _server_round(models: fedftg_tf.FineTuneModels,
                  start: tff.learning.models.ModelWeights,
                  global_weights: tff.learning.models.ModelWeights,
                  uploads: _Uploads,
                  generator_weights: tff.learning.models.ModelWeights,
                  generator_state,
                  round_num: tf.Tensor,
                  tuning: FineTuning,
                  labeled: Optional[tuple[tf.Tensor, tf.Tensor]] = None):
  """Sets every model's weights, fine-tunes; returns (result, student
  weights, generator weights, link table).

  `models` are built and overwritten: the student starts from `start` (the
  FedAvg average), teacher k is `global_weights` plus delta k, and the
  generator gets `generator_weights` (`generator_state` is its optimiser's
  state). `models.teachers` is a list of K Keras models, or one
  `fused.StackedModel` whose K rows are made here
  (`fedftg_tf.StackedTeachers`). With `labeled` (images, labels), the link
  table (`link_table`) is measured after the student's and the generator's
  weights are snapshotted (the hook overwrites the student), so the round's
  result is the same with it and without it; without, the table is empty.
  """
  student, teachers, generator = models
  deltas, filled = uploads.deltas, uploads.filled
  assign = lambda v, t: v.assign(t)
  tf.nest.map_structure(assign, local_training.model_weights(student), start)
  tf.nest.map_structure(assign, local_training.model_weights(generator),
                        generator_weights)
  # Teacher k: the global trainable weights plus delta k; an empty slot
  # keeps the global statistics (finite logits, masked out).
  def statistics(g, d):
    return tf.where(tf.reshape(filled, [-1] + [1] * g.shape.rank), d,
                    g[tf.newaxis])

  rows = tff.learning.models.ModelWeights(
      [g[tf.newaxis] + d for g, d in zip(global_weights.trainable,
                                         deltas.trainable)],
      [statistics(g, d) for g, d in zip(global_weights.non_trainable,
                                        deltas.non_trainable)])
  if isinstance(teachers, fused.StackedModel):
    teachers = fedftg_tf.StackedTeachers(teachers, rows.trainable,
                                         rows.non_trainable)
    models = models._replace(teachers=teachers)
  else:
    for k, teacher in enumerate(teachers):
      for v, row in zip(tf.nest.flatten(local_training.model_weights(teacher)),
                        tf.nest.flatten(rows)):
        v.assign(row[k])
  result = round_fine_tune(student, teachers, uploads.label_counts,
                           generator, generator_state, round_num, tuning,
                           teacher_mask=filled)
  student_weights = tf.nest.map_structure(
      tf.identity, local_training.model_weights(student))
  new_generator = tf.nest.map_structure(
      tf.identity, local_training.model_weights(generator))
  table = collections.OrderedDict()
  if labeled is not None:
    fixed = [t for t in tf.nest.flatten((result, student_weights,
                                         new_generator)) if tf.is_tensor(t)]
    with tf.control_dependencies(fixed):
      table = link_table(models, start, student_weights, filled,
                         uploads.label_counts, labeled,
                         ensemble=tuning.ensemble)
  return result, student_weights, new_generator, table


@tf.autograph.experimental.do_not_convert
def link_table(models: fedftg_tf.FineTuneModels,
               start: tff.learning.models.ModelWeights,
               tuned: tff.learning.models.ModelWeights,
               valid: tf.Tensor,
               label_counts: tf.Tensor,
               labeled: tuple[tf.Tensor, tf.Tensor],
               *,
               ensemble: str,
               batch_size: int = 256) -> collections.OrderedDict:
  """FedFTG's round through the link hook (`tff_kd.core.links.LinkHook`).

  The teachers are the round's received client models as the fine-tuning
  read them (`models.teachers`, already holding their weights; rows not
  in `valid` read 0, as in `fedftg_tf._ensemble_logits`). FedFTG's own
  ensemble is its class-level one (`fedftg_tf.class_weighted_teacher`):
  each teacher weighted by its share n_{k,c} / sum_j n_{j,c} of class c,
  where c is the label a generated sample was generated for; on the
  labeled images c is the image's true label. That is the target FedFTG
  distils toward, evaluated on real images (an ensemble that reads the
  label, so an upper bound of what the clients' knowledge can say, not a
  predictor). The student is scored at `start` (the FedAvg average) and
  at `tuned` (the fine-tuned student the round returns). FedFTG distils
  on generated batches, not on a fixed pool: no pool, no target
  (`target_entropy` is -1).

  Overwrites the student's variables (the round's result must already be
  snapshotted); reads the teachers. Call inside the round's `tf.function`
  (`_server_round`) or eagerly.

  Args:
    models: The round's `fedftg_tf.FineTuneModels` (the generator is not
      read).
    start: The student's start, the FedAvg average.
    tuned: The student's weights after fine-tuning.
    valid: [K] bool, the rows holding a client of this round.
    label_counts: [K, C] the clients' label counts n_{k,c} (0 in empty
      rows).
    labeled: (images [V, ...], int labels [V]).
    ensemble: FedFTG's ensemble setting, 'logits' or 'probs'.
    batch_size: Examples per forward pass.

  Returns:
    The link table, an OrderedDict over `links.NAMES`.
  """
  student, teachers, _ = models

  def own_ensemble(logits, unused_valid, labels):
    # Empty rows hold zero counts and zero logits, as in the fine-tuning.
    return fedftg_tf.class_weighted_teacher(logits, labels, label_counts,
                                            ensemble=ensemble)

  return core_diagnostics.run(
      links.LinkHook(batch_size), core_diagnostics.ServerRound(
          teachers=links.Teachers(
              logits_fn=lambda x: fedftg_tf.teacher_logits(
                  teachers, x, valid, batch_size),
              valid=valid, ensemble_fn=own_ensemble),
          weights=None, pool=None, target=None, student=student,
          student_variables=local_training.model_weights(student),
          before=start, after=tuned, labeled=labeled))


def build_fedftg_process(
    classifier_fn: label_counts.ClassifierFn,
    element_spec: collections.OrderedDict,
    *,
    clients_per_round: int,
    training: learning.Training,
    generator_optimizer: tff.learning.optimizers.Optimizer,
    distillation: distillation_lib.Distillation,
    dataset_fn: Optional[tff_types.DatasetFn],
    hparams: hparams_lib.FedFTGHparams = hparams_lib.FedFTGHparams(),
    seed: int = 0,
    server_data: Optional[server_data_lib.ServerData] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds FedFTG (defaults: the reference's settings where known).

  Args:
    classifier_fn: Builds the `tff_kd.models.Classifier`.
    element_spec: Batch structure of the client datasets.
    clients_per_round: M, the most clients per round (teacher slots).
    training: The client optimiser and learning-rate schedule, and the
      server optimiser that applies the mean delta (SGD lr 1: FedAvg).
    generator_optimizer: Reference: Adam, lr 0.01 (the registry builds it
      from `hparams.generator_learning_rate`).
    distillation: The student's fine-tuning. Its optimiser: reference SGD,
      lr 0.1 (from `hparams.student_learning_rate`). Of its config, the
      `batch_size`, `temperature`, `student_training`, `kl_reduction`
      (`distillation_lib.kd_loss`'s) and `lr_decay` are the student's
      (`hparams_lib.DISTILL_KEYS`; the reference's values:
      `hparams_lib.DISTILL_DEFAULTS`); its other keys are not read.
    dataset_fn: Key -> dataset function (the fast path), or None: clients
      then take plain `tf.data.Dataset`s, as TFF's own algorithms do.
    hparams: `config.fedftg` (`hparams_lib.FedFTGHparams`; defaults: the
      reference's settings where known). The student steps run through
      `distillation_lib.distill`.
    seed: Seed of the generator's initial weights and of its noise.
    server_data: The server's data, or None. FedFTG needs no server data;
      a labeled validation set (`val_size > 0`) is read for the round's
      link table (`build_fine_tune_finalizer`), nothing else.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ConfigError: A bad setting.
    DataError: Labeled images whose shape is not the classifier's input.
  """
  def fail(message):
    raise errors.ConfigError(f'fedftg {message}')
  h = hparams
  if (not isinstance(clients_per_round, int) or
      isinstance(clients_per_round, bool) or clients_per_round < 1):
    fail(f'clients_per_round must be an integer >= 1, got '
         f'{clients_per_round!r}')
  schedules.check_schedule(training.learning_rate,
                           training.learning_rate_decay)
  d = distillation.config
  config = distill_hparams.DistillConfig.plain(
      steps=h.student_steps, batch_size=d.batch_size,
      temperature=d.temperature, eval_every=h.student_steps, seed=seed,
      student_training=d.student_training, kl_reduction=d.kl_reduction)
  model = local_training.structure_of(classifier_fn).model
  unsupported = h.teachers == 'stacked' and fused.unsupported(model)
  if unsupported:
    fail(f"teachers='stacked' runs the teachers as one stacked model: "
         f"{unsupported}; use teachers='models'")
  image_shape = tuple(model.input_shape[1:])
  num_classes = int(model.output_shape[-1])

  def generator_fn():
    return generators.build_image_generator(
        noise_dim=h.noise_dim, num_classes=num_classes,
        image_shape=image_shape, seed=seed)

  def model_fn():
    return classifier_fn().model

  client_work = label_counts.build_client_work(
      classifier_fn, element_spec, training.client_optimizer,
      num_classes=num_classes, learning_rate=training.learning_rate,
      learning_rate_decay=training.learning_rate_decay, dataset_fn=dataset_fn,
      client_execution=training.client_execution)
  aggregator, stack_type = stacking.build_client_stack(
      client_work, clients_per_round, training.client_execution)
  finalizer = build_fine_tune_finalizer(
      model_fn, stack_type, training.server_optimizer,
      FineTuning(
          generator_fn=generator_fn, generator_optimizer=generator_optimizer,
          student_optimizer=distillation.optimizer, distill_config=config,
          iterations=h.iterations, noise_dim=h.noise_dim, noise=h.noise,
          transfer_weight=h.transfer_weight,
          diversity_weight=h.diversity_weight, mask=h.mask,
          ensemble=h.ensemble, lr_decay=d.lr_decay, seed=seed,
          generator_steps=h.generator_steps, teachers=h.teachers),
      server_data=server_data)
  initial = learning.build_initial_weights_fn(model_fn)
  return composer.compose_learning_process(
      initial,
      tff.learning.templates.build_broadcast_process(
          initial.type_signature.result),
      client_work, aggregator, finalizer)


def generator_weights(state) -> tff.learning.models.ModelWeights:
  """The server generator's `ModelWeights` from a FedFTG process state."""
  return state.finalizer['generator']


def build_from_settings(
    inputs: common.ProcessInputs, settings: common.Settings
) -> tff.learning.templates.LearningProcess:
  """The registry's builder: fedftg from the run's validated settings."""
  if inputs.classifier_fn is None:
    raise errors.ConfigError('fedftg needs a classifier_fn')
  f = settings.hparams
  return build_fedftg_process(
      inputs.classifier_fn, inputs.element_spec,
      clients_per_round=settings.run.clients_per_round,
      generator_optimizer=tff.learning.optimizers.build_adam(
          learning_rate=f.generator_learning_rate),
      distillation=distillation_lib.Distillation(
          optimizer=tff.learning.optimizers.build_sgdm(
              learning_rate=f.student_learning_rate),
          config=settings.distill),
      hparams=f, seed=settings.run.seed, training=common.training(settings, inputs),
      dataset_fn=inputs.dataset_fn, server_data=inputs.server_data)


METHOD = common.Method(
    'fedftg', build_from_settings,
    'FedFTG data-free server fine-tuning (Zhang et al., 2022)',
    hparams=hparams_lib.FedFTGHparams, uses_distill=True,
    groups_clients=True, fuses_clients=True,
    distill_keys=hparams_lib.DISTILL_KEYS,
    distill_defaults=hparams_lib.DISTILL_DEFAULTS,
    smoke={'fedftg.iterations': 2, 'distill.batch_size': 16,
           'fedftg.noise_dim': 8})
