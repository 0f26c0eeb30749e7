"""FedGen as a TFF learning process: its stages, builder and registry entry.

Zhu, Hong and Zhou, "Data-Free Knowledge Distillation for Heterogeneous
Federated Learning", ICML 2021 (Algorithm 1; generator objective eq. 4 with
the supplement's label-count weighting, Sec. 9; client objective eq. 5).
The maths is `tff_kd.methods.fedgen.fedgen_tf`. The global model is a pair
(classifier `ModelWeights`, feature-generator `ModelWeights`). One round:

1. distributor: broadcast both (a client needs G for its regulariser);
2. client work (`build_client_work`, on `label_counts.build_client_work`):
   the client builds this round's dataset from its key
   `"<id>|<seed>|<round>"`, caches it and counts its labels n_{k,y} over the
   batches it will train on (the reference counts the same batches), then
   trains with `local_training.train_locally` whose regulariser is
   `fedgen_tf.regularized_local_loss` (the paper's eq. 5 plus the
   reference's latent term), with the reference's coefficients
   max(1e-4, c0 * 0.98^t) (t read from the key) and the regulariser off
   before `start_round` (reference: round 0, untrained G). Generated labels
   are drawn uniformly over every class (`generated_label_probs`: the
   reference's `available_labels`, the labels of the whole federation, not
   of the client). It uploads its classifier delta and its label counts,
   weighted by its number of examples;
3. aggregator: `tff_kd.federated.stacking.build_stacking_aggregator`, so the
   server receives every client's update as an [M, ...] stack;
4. finalizer (`build_generator_finalizer`): the example-weighted mean delta
   of the classifiers is applied with the server optimiser (FedAvg), and the
   generator takes `steps` Adam steps (`fedgen_tf.train_generator`) against
   the received client heads (global head + each client's head delta; the
   classifier's last layer is linear) with the label-count-weighted teacher
   loss (eq. 4) and the diversity loss. The generator's optimiser state,
   like its weights, lives in the server state across rounds (the reference
   keeps one Adam optimiser for the whole run). With a labeled server
   validation set (`server_data.val_size > 0`), the round's link table
   (`tff_kd.core.links.LinkHook`) is then measured on it, after the
   result is fixed (`link_table`).

State: `tff.learning.templates.LearningAlgorithmState` whose
`global_model_weights` is `(classifier ModelWeights, generator
ModelWeights)`; `get_model_weights` / `set_model_weights` see the
classifier (`composer.first_model_view`); `generator_weights` reads the
generator. The label counting and the upload are shared with FedFTG's
clients (`tff_kd.federated.label_counts`).
"""

import collections
from typing import Callable, NamedTuple, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.core import diagnostics as core_diagnostics
from tff_kd.core import fused
from tff_kd.core import links
from tff_kd.core import local_training
from tff_kd.core import stacking as stacking_tf
from tff_kd.core import teachers as teachers_tf
from tff_kd.federated import composer
from tff_kd.federated import execution
from tff_kd.federated import finalizers
from tff_kd.federated import learning
from tff_kd.federated import label_counts
from tff_kd.federated import schedules
from tff_kd.federated import server_data as server_data_lib
from tff_kd.federated import stacking
from tff_kd.federated import tff_types
from tff_kd.methods import common
from tff_kd.methods.fedgen import fedgen_tf
from tff_kd.methods.fedgen import hparams as hparams_lib
from tff_kd.models import classifiers
from tff_kd.models import generators

ClassifierFn = Callable[[], classifiers.Classifier]
GeneratorFn = Callable[[], tf.keras.Model]


class LocalRegularizer(NamedTuple):
  """FedGen's client regulariser settings (`fedgen_tf.regularized_local_loss`).

  Attributes:
    generator_fn: Builds the feature generator (same as the server's).
    hparams: `config.fedgen`: `noise_dim`, `noise`, the coefficients' c0
      `local_alpha` (generated-feature CE, reference: 10 on MNIST) and
      `local_beta` (latent KL term, reference: 10; the paper: 0), their
      per-round `coefficient_decay` (reference 0.98), B' =
      `local_gen_batch_size` (reference: 32, = B), `start_round` (first
      round with the regulariser on, reference: 1) and `reference_steps`:
      the local steps the coefficients were tuned for (the reference: 20
      steps of batch 32). A client round of S > that many steps scales both
      coefficients by reference_steps / S, so the regulariser's total pull
      over a round stays the reference's however long the local work is
      (10 local epochs on compare_mnist are ~290 steps: unscaled, the round
      after it switches on drove the 3-seed mean accuracy to 0.10). 0:
      never scale.
    batch_size: B, the local batch size (alpha is scaled by B'/B).
    floor: Lower bound of the decayed coefficients (reference 1e-4).
  """

  generator_fn: GeneratorFn
  hparams: hparams_lib.FedGenHparams
  batch_size: int
  floor: float = 1e-4


def initial_weights_fn(classifier_fn: ClassifierFn,
                       generator_fn: GeneratorFn) -> tff.Computation:
  """No-arg TFF computation: (classifier weights, generator weights)."""

  @tff.tensorflow.computation
  def initial_weights():
    return (local_training.model_weights(classifier_fn().model),
            local_training.model_weights(generator_fn()))

  return initial_weights


def build_client_work(
    classifier_fn: ClassifierFn,
    element_spec: collections.OrderedDict,
    client_optimizer: tff.learning.optimizers.Optimizer,
    *,
    num_classes: int,
    learning_rate: float,
    regularizer: LocalRegularizer,
    learning_rate_decay: float = 1.0,
    dataset_fn: Optional[tff_types.DatasetFn] = None,
    seed: int = 0,
    client_execution: execution.ClientExecution = execution.ONE_BY_ONE,
) -> tff.templates.MeasuredProcess:
  """FedGen's clients: label counts, and local training regularised by G.

  `label_counts.build_client_work` with FedGen's objective: clients receive
  (classifier weights, generator weights) and train the regularised loss
  of `_regularized_training`. Without `dataset_fn`, clients take
  `OrderedDict(client_id, data)`: each draws its own generator noise,
  seeded by its id and the round (`tff_types.client_data_type`).

  Args:
    classifier_fn: Builds the `Classifier` (model, features, head).
    element_spec: Batch structure of the client datasets.
    client_optimizer: A `tff.learning.optimizers` optimizer.
    num_classes: C.
    learning_rate: Client learning rate at round 0.
    regularizer: FedGen's regulariser settings.
    learning_rate_decay: Multiplicative decay per round.
    dataset_fn: Key -> dataset function (the fast path), or None.
    seed: The process seed, which seeds the dataset path's noise (the keys
      carry it on the keyed path).
    client_execution: How each TFF client call runs its clients: one, G
      in turn, or G fused (keyed clients; fused, the regulariser runs in
      lockstep, `fedgen_tf.fused_regularizer`).

  Returns:
    A `tff.templates.MeasuredProcess`. The round number (which decays the
    regulariser) comes from its state.
  """
  return label_counts.build_client_work(
      classifier_fn, element_spec, client_optimizer, num_classes=num_classes,
      learning_rate=learning_rate, learning_rate_decay=learning_rate_decay,
      dataset_fn=dataset_fn, seed=seed, client_execution=client_execution,
      objective=label_counts.LocalObjective(
          regularizer.generator_fn, _regularized_training(regularizer),
          _fused_term(regularizer)))


def generated_label_probs(counts: tf.Tensor) -> tf.Tensor:
  """The weights of the labels a client draws for its generated features.

  Uniform over every class, whatever the client holds: the reference draws
  them from `available_labels` (zhuangdizhu/FedGen, userpFedGen.py:60),
  which its server computes once over every user's training data
  (serverpFedGen.py:41, `aggregate_user_data`), i.e. the labels of the
  federation (all C for MNIST), and the paper from the global p_hat(y).
  The generated features are how a client learns the labels it lacks;
  drawing only its own labels (this code before, `counts > 0`) teaches
  its head nothing new and, with Dir(0.05) clients of 1-3 labels, cost
  FedGen 5.7 points of final accuracy (studies/parity/FEDGEN_NOTES.md).

  Args:
    counts: [C] (or [G, C] for fused clients) the client's label counts.

  Returns:
    Ones of the same shape, float32.
  """
  return tf.ones_like(tf.cast(counts, tf.float32))


def _coefficients(reg: LocalRegularizer, round_num: tf.Tensor,
                  steps: tf.Tensor) -> fedgen_tf.Coefficients:
  """This round's alpha_t and beta_t of a client that takes `steps` local
  steps (a scalar, or [G] for fused clients; negative: unknown, no
  scaling)."""
  h = reg.hparams
  active = tf.cast(round_num >= h.start_round, tf.float32)
  alpha = active * fedgen_tf.decayed_coefficient(
      h.local_alpha, round_num, decay=h.coefficient_decay,
      floor=reg.floor) * (h.local_gen_batch_size / reg.batch_size)
  beta = 0.0 if h.local_beta == 0 else (
      active * fedgen_tf.decayed_coefficient(
          h.local_beta, round_num, decay=h.coefficient_decay,
          floor=reg.floor))
  if h.reference_steps:
    scale = tf.where(steps > h.reference_steps,
                     h.reference_steps / tf.maximum(steps, 1.0), 1.0)
    alpha *= scale
    # A Python 0 keeps the latent term out of the graph.
    if h.local_beta != 0:
      beta *= scale
  return fedgen_tf.Coefficients(alpha, beta)


def _regularized_training(
    reg: LocalRegularizer) -> Callable[..., local_training.LocalResult]:
  """FedGen's local round with `reg`: `label_counts.LocalObjective.train`."""

  @tf.function(autograph=False)
  def train(classifier, generator, optimizer, classifier_weights,
            generator_weights, dataset, lr, counts, round_num, key_hash):
    """G's weights set, then regularised local SGD."""
    tf.nest.map_structure(lambda v, t: v.assign(t),
                          local_training.model_weights(generator),
                          generator_weights)
    # Unknown (-2) or infinite (-1) cardinality: no scaling.
    coefficients = _coefficients(
        reg, round_num, tf.cast(dataset.cardinality(), tf.float32))
    available = generated_label_probs(counts)

    def regularizer(batch, logits, step):
      terms = fedgen_tf.regularized_local_loss(
          classifier, generator, batch, logits=logits, label_probs=available,
          seed=tf.stack([key_hash, tf.cast(step, tf.int64)]),
          coefficients=coefficients, hparams=reg.hparams)
      return terms.teacher + terms.latent

    return local_training.train_locally(
        classifier.model, optimizer, classifier_weights, dataset, lr,
        regularizer=regularizer)

  return train


def _fused_term(reg: LocalRegularizer) -> Callable[..., fused.Term]:
  """FedGen's regulariser for fused clients:
  `label_counts.LocalObjective.fused_term`."""

  def term(classifier, generator, generator_weights, batches, key_hashes,
           counts, round_num):
    """G's weights loaded, then `fedgen_tf.fused_regularizer` each step,
    with each client's own seeds, labels and coefficients."""
    loads = tf.nest.flatten(tf.nest.map_structure(
        lambda v, t: v.assign(t), local_training.model_weights(generator),
        generator_weights))
    steps = tf.reduce_sum(
        tf.reduce_max(batches.schedule.mask, axis=2), axis=0)
    coefficients = _coefficients(reg, round_num, steps)
    available = generated_label_probs(counts)
    kernel, bias = head_variables(classifier)

    def loss(trainable, logits, labels, mask, step):
      def heads(features):
        return (tf.einsum('gnd,gdc->gnc', features, trainable[kernel]) +
                trainable[bias][:, tf.newaxis, :])

      seeds = tf.stack([key_hashes, tf.fill(tf.shape(key_hashes),
                                            tf.cast(step, tf.int64))], 1)
      return fedgen_tf.fused_regularizer(
          heads, generator, logits, labels, mask, label_probs=available,
          seeds=seeds, coefficients=coefficients, hparams=reg.hparams)

    return fused.Term(loss, loads)

  return term


def head_variables(classifier: classifiers.Classifier) -> tuple[int, int]:
  """Indices of the linear head's kernel and bias in the trainable weights.

  Raises:
    ValueError: the head is not one Dense layer at the end of
      `classifier.model.trainable_weights` (FedGen's heads are linear).
  """
  head = classifier.head.trainable_weights
  weights = classifier.model.trainable_weights
  if (len(head) != 2 or len(weights) < 2 or weights[-2] is not head[0] or
      weights[-1] is not head[1] or head[0].shape.rank != 2):
    raise ValueError(
        'FedGen needs a classifier whose head is one Dense layer (kernel and '
        'bias, the last trainable weights of the model)')
  return len(weights) - 2, len(weights) - 1


class GeneratorTraining(NamedTuple):
  """Server generator settings (`fedgen_tf.train_generator`).

  Attributes:
    generator_fn: Builds the feature generator.
    optimizer: Generator optimiser (reference: Adam, 3e-4 on MNIST).
    hparams: `config.fedgen`: `generator_steps` per round (reference 50),
      `generator_batch_size` generated features per step (reference 32),
      `noise_dim`, `noise`, `teacher_weight` and `diversity_weight` (the
      reference's ensemble_alpha and ensemble_eta, 1 each) and
      `ensemble` ('per_head', the reference, or 'logits', the
      paper).
    seed: Seed of the generated labels and noise (with the round number).
  """

  generator_fn: GeneratorFn
  optimizer: tff.learning.optimizers.Optimizer
  hparams: hparams_lib.FedGenHparams
  seed: int


def build_generator_finalizer(
    classifier_fn: ClassifierFn,
    stack_type: tff.Type,
    server_optimizer: tff.learning.optimizers.Optimizer,
    training: GeneratorTraining,
    server_data: Optional[server_data_lib.ServerData] = None,
) -> tff.templates.MeasuredProcess:
  """FedAvg of the classifiers, then FedGen's generator round.

  State: `{'server': server-optimiser state, 'generator': generator
  optimiser state, 'round': int32}`. Measurements: `num_teachers`,
  `generator_loss`, `teacher_loss`, `diversity_loss`, `teacher_accuracy`
  (means over the round's generator steps; the accuracy is the
  label-weighted ensemble of the heads on the generated features), then
  the round's link table (`tff_kd.core.links.NAMES`, `link_table`) on the
  server's labeled validation images: `teacher_labeled_accuracy` (the
  received client models), `ensemble_labeled_accuracy` (FedGen's
  label-weighted ensemble of them, `fedgen_tf.label_weighted_ensemble`,
  weighted by each image's true label), `ensemble_labeled_accuracy_logits`
  / `_probs` (the uniform averages), `labeled_accuracy_before` (the
  averaged classifier) and `labeled_accuracy_after` (the same: FedGen's
  server distils nothing into the classifier). `target_entropy` is always
  -1 (no distillation target). Without a labeled set (`server_data` None
  or `val_size == 0`) every link reads -1, so the measurement type does
  not depend on the data.

  Args:
    classifier_fn: Builds the `Classifier`.
    stack_type: Unplaced type of the aggregator's `Stack`.
    server_optimizer: Applies the mean classifier delta (SGD lr 1: FedAvg).
    training: Generator settings.
    server_data: The server's data; only its labeled validation set is
      read (inside the computation, each round), for the link table. None:
      no labeled set.

  Returns:
    A `tff.templates.MeasuredProcess` with the finalizer signature.

  Raises:
    DataError: labeled images whose shape is not the classifier's input.
  """
  classifier = local_training.structure_of(classifier_fn)
  labeled = links.labeled_set(server_data, classifier.model.input_shape[1:])
  kernel_idx, bias_idx = head_variables(classifier)
  clf_weights = local_training.model_weights(classifier.model)
  gen_weights = local_training.model_weights(
      local_training.structure_of(training.generator_fn))
  weights_type = tff_types.spec_to_type((clf_weights, gen_weights))
  clf_specs = tff_types.trainable_specs(clf_weights)
  gen_specs = tff_types.trainable_specs(gen_weights)

  @tff.tensorflow.computation
  def init_tf():
    return collections.OrderedDict(
        server=server_optimizer.initialize(clf_specs),
        generator=training.optimizer.initialize(gen_specs),
        round=tf.constant(0, tf.int32))

  state_type = init_tf.type_signature.result

  @finalizers.server_computation(state_type, weights_type, stack_type)
  def finalize_tf(state, weights, stack):
    stack = stacking_tf.Stack(*stack)
    g, gen = weights
    num_slots = int(stack.weights.shape[0])
    filled = tf.range(num_slots) < stack.count
    deltas = stack.values['delta']
    server_state, new_classifier = stacking_tf.server_update(
        server_optimizer, state['server'], g, deltas,
        stacking_tf.example_weights(stack.weights, filled))
    # Each received client's head: the broadcast head plus its delta.
    kernels = (g.trainable[kernel_idx][tf.newaxis] +
               deltas.trainable[kernel_idx])[:stack.count]
    biases = (g.trainable[bias_idx][tf.newaxis] +
              deltas.trainable[bias_idx])[:stack.count]
    counts = stack.values['label_counts'][:stack.count]
    result, new_gen = _generator_round(
        training.generator_fn(), gen, kernels, biases, counts,
        state['generator'], state['round'], training)
    new_state = collections.OrderedDict(
        server=server_state, generator=result.optimizer_state,
        round=state['round'] + 1)
    metrics = collections.OrderedDict(
        num_teachers=tf.cast(stack.count, tf.float32),
        generator_loss=result.loss,
        teacher_loss=result.teacher_loss,
        diversity_loss=result.diversity,
        teacher_accuracy=result.teacher_accuracy)
    if labeled:
      # After the round's result is fixed: the hook runs on models of its
      # own (the results are tensors, none aliases their variables).
      with tf.control_dependencies(tf.nest.flatten(
          (new_state, new_classifier, new_gen))):
        metrics.update(link_table(
            classifier_fn(), classifier_fn().model, g, deltas, filled,
            stack.values['label_counts'], new_classifier,
            server_data.read_validation()))
    else:
      metrics.update(links.link_metrics(None, filled, None))
    return new_state, (new_classifier, new_gen), metrics

  return finalizers.build_server_finalizer(init_tf, finalize_tf)


def generator_round(generator: tf.keras.Model, kernels: tf.Tensor,
                    biases: tf.Tensor, label_counts: tf.Tensor,
                    optimizer_state, round_num,
                    training: GeneratorTraining
                    ) -> fedgen_tf.GeneratorTrainingResult:
  """One server generator round on an already-built generator.

  The round's seed is (training.seed, round_num). Shared by the finalizer
  and by tests that check it eagerly.
  """
  return fedgen_tf.train_generator(
      generator,
      lambda z: fedgen_tf.linear_heads_logits(z, kernels, biases),
      label_counts, training.optimizer, optimizer_state,
      seed=tf.stack([tf.constant(training.seed, tf.int64),
                     tf.cast(round_num, tf.int64)]),
      hparams=training.hparams)


@tf.function(autograph=False)
def _generator_round(generator, weights, kernels, biases, counts,
                     optimizer_state, round_num, training):
  """Sets the generator's weights, trains it; returns (result, weights)."""
  variables = local_training.model_weights(generator)
  tf.nest.map_structure(lambda v, t: v.assign(t), variables, weights)
  result = generator_round(generator, kernels, biases, counts,
                           optimizer_state, round_num, training)
  return result, tf.nest.map_structure(tf.identity, variables)


@tf.function(autograph=False)
def link_table(student: classifiers.Classifier, teacher: tf.keras.Model,
               global_weights: tff.learning.models.ModelWeights,
               deltas: tff.learning.models.ModelWeights, valid: tf.Tensor,
               label_counts: tf.Tensor,
               averaged: tff.learning.models.ModelWeights,
               labeled: tuple[tf.Tensor, tf.Tensor]
               ) -> collections.OrderedDict:
  """FedGen's round through the link hook (`tff_kd.core.links.LinkHook`).

  FedGen's generator learns from the clients' heads on generated features;
  on real images the teachers are the full client models (broadcast model
  plus each client's delta, with its own non-trainable values: the stack
  holds whole updates), and FedGen's own ensemble is the one the generator
  trains against (`fedgen_tf.label_weighted_ensemble`): each client's
  logits weighted per sample by its share n_{k,y} / sum_j n_{j,y} of the
  sample's label, here the image's true label (an ensemble that reads the
  label: what the clients' combined knowledge holds about an image of
  known label, not a predictor for unlabeled images). The student is the
  averaged classifier; the server distils nothing into it (`after=None`:
  `labeled_accuracy_after` equals `labeled_accuracy_before`), and there is
  no pool or target (`target_entropy` is -1).

  Writes only `student`'s and `teacher`'s variables; a `tf.function`, so
  that their assignments keep program order inside a TFF computation.

  Args:
    student: A built `Classifier` (overwritten).
    teacher: A built Keras model of the same architecture (overwritten).
    global_weights: The broadcast classifier's `ModelWeights`.
    deltas: The stacked client updates (`Stack.values['delta']`).
    valid: [M] bool, the rows holding a client of this round.
    label_counts: [M, C] the clients' label counts n_{k,y}.
    averaged: The round's averaged classifier (FedAvg's result).
    labeled: (images [V, ...], int labels [V]).

  Returns:
    The link table, an OrderedDict over `links.NAMES`.
  """

  def own_ensemble(logits, mask, labels):
    return fedgen_tf.label_weighted_ensemble(
        tf.boolean_mask(logits, mask), labels,
        tf.boolean_mask(label_counts, mask))

  teachers = links.Teachers(
      logits_fn=lambda x: teachers_tf.stacked_logits(
          teacher, global_weights, deltas, valid, x),
      valid=valid, ensemble_fn=own_ensemble)
  return core_diagnostics.run(links.LinkHook(), core_diagnostics.ServerRound(
      teachers=teachers, weights=None, pool=None, target=None,
      student=student.model,
      student_variables=local_training.model_weights(student.model),
      before=averaged, after=None, labeled=labeled))


def build_fedgen_process(
    classifier_fn: ClassifierFn,
    element_spec: collections.OrderedDict,
    *,
    clients_per_round: int,
    training: learning.Training,
    generator_optimizer: tff.learning.optimizers.Optimizer,
    dataset_fn: Optional[tff_types.DatasetFn],
    local_batch_size: int,
    hparams: hparams_lib.FedGenHparams = hparams_lib.FedGenHparams(),
    seed: int = 0,
    server_data: Optional[server_data_lib.ServerData] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds FedGen (defaults: the reference's MNIST settings).

  Args:
    classifier_fn: Builds the `tff_kd.models.Classifier`; its head must be
      one Dense layer (FedGen's generator imitates the head's input).
    element_spec: Batch structure of the client datasets.
    clients_per_round: M, the most clients per round (stack slots).
    training: The client optimiser (reference: SGD) and learning-rate
      schedule, and the server optimiser that applies the mean classifier
      delta (SGD lr 1: FedAvg).
    generator_optimizer: Reference: Adam, lr 3e-4 (MNIST; the registry
      builds it from `hparams.generator_learning_rate`).
    dataset_fn: Key -> dataset function (the fast path), or None: clients
      then take `OrderedDict(client_id=int32, data=<dataset>)`, the id
      seeding their own generator noise (`tff_types.client_input`).
    local_batch_size: B, the clients' batch size (scales alpha by B'/B).
    hparams: `config.fedgen` (`hparams_lib.FedGenHparams`; defaults: the
      reference's MNIST settings). `reference_steps` scales the
      regulariser's coefficients (`LocalRegularizer`).
    seed: Seed of the generator's initial weights and of its noise.
    server_data: The server's data, or None. FedGen needs no server data;
      a labeled validation set (`val_size > 0`) is read for the round's
      link table (`build_generator_finalizer`), nothing else.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ConfigError: A bad setting, or a classifier whose head is not linear.
    DataError: Labeled images whose shape is not the classifier's input.
  """
  _check(learning_rate=training.learning_rate,
         learning_rate_decay=training.learning_rate_decay,
         clients_per_round=clients_per_round,
         local_batch_size=local_batch_size)
  h = hparams
  classifier = local_training.structure_of(classifier_fn)
  try:
    head_variables(classifier)
  except ValueError as e:
    raise errors.ConfigError(str(e)) from None
  feature_dim = classifier.feature_dim
  num_classes = int(classifier.model.output_shape[-1])

  def generator_fn():
    return generators.build_feature_generator(
        noise_dim=h.noise_dim, num_classes=num_classes,
        feature_dim=feature_dim, hidden=h.hidden,
        output_activation=h.output_activation or None, seed=seed)

  regularizer = LocalRegularizer(generator_fn, h, local_batch_size)
  client_work = build_client_work(
      classifier_fn, element_spec, training.client_optimizer,
      num_classes=num_classes, learning_rate=training.learning_rate,
      learning_rate_decay=training.learning_rate_decay,
      dataset_fn=dataset_fn, regularizer=regularizer, seed=seed,
      client_execution=training.client_execution)
  aggregator, stack_type = stacking.build_client_stack(
      client_work, clients_per_round, training.client_execution)
  finalizer = build_generator_finalizer(
      classifier_fn, stack_type, training.server_optimizer,
      GeneratorTraining(generator_fn, generator_optimizer, h, seed),
      server_data=server_data)
  initial = initial_weights_fn(classifier_fn, generator_fn)
  process = composer.compose_learning_process(
      initial,
      tff.learning.templates.build_broadcast_process(
          initial.type_signature.result),
      client_work, aggregator, finalizer)
  return composer.first_model_view(process)


def generator_weights(state) -> tff.learning.models.ModelWeights:
  """The global generator's `ModelWeights` from a FedGen process state."""
  return state.global_model_weights[1]


def _check(**v) -> None:
  """Checks the settings that are not `config.fedgen`'s."""
  def fail(message):
    raise errors.ConfigError(f'fedgen {message}')

  schedules.check_schedule(v['learning_rate'], v['learning_rate_decay'])
  for name in ('clients_per_round', 'local_batch_size'):
    if not isinstance(v[name], int) or isinstance(v[name], bool) or (
        v[name] < 1):
      fail(f'{name} must be an integer >= 1, got {v[name]!r}')


def build_from_settings(
    inputs: common.ProcessInputs, settings: common.Settings
) -> tff.learning.templates.LearningProcess:
  """The registry's builder: fedgen from the run's validated settings."""
  if inputs.classifier_fn is None:
    raise errors.ConfigError(
        'fedgen needs a classifier_fn (its generator feeds the head)')
  f = settings.hparams
  return build_fedgen_process(
      inputs.classifier_fn, inputs.element_spec,
      clients_per_round=settings.run.clients_per_round,
      generator_optimizer=tff.learning.optimizers.build_adam(
          learning_rate=f.generator_learning_rate),
      local_batch_size=settings.local.batch_size, hparams=f,
      seed=settings.run.seed, training=common.training(settings, inputs),
      dataset_fn=inputs.dataset_fn, server_data=inputs.server_data)


METHOD = common.Method(
    'fedgen', build_from_settings,
    'FedGen data-free feature-generator KD (Zhu et al., 2021)',
    hparams=hparams_lib.FedGenHparams, groups_clients=True, fuses_clients=True,
    smoke={'fedgen.generator_steps': 3, 'fedgen.hidden': 16})
