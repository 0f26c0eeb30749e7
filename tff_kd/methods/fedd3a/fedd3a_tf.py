"""Pure-TF client and server rounds of FedD3A.

FedD3A: Su, Li and Xue, "Domain Discrepancy Aware Distillation for Model
Aggregation in Federated Learning", AAAI 2023 (Sec. 3, Algorithm 1). The
subspace maths (eq. 5 and 6) is in `tff_kd.methods.fedd3a.projection_tf`;
this module
strings it together with local training and the shared server distillation.

Client (`client_round`, Algorithm 1 lines 4-5):

1. local training from the received global weights
   (`local_training.train_locally`) on the first pass over the round's
   batches, so the upload is FedAvg's delta (the same batches in the same
   order as FedAvg's and FedDF's clients) plus P;
2. copy the received global weights back into the client's classifier and
   run its backbone B (inference mode) over the round's local batches: one
   mean feature z_i per batch;
3. P = Z^T Z (alpha I + Z^T Z)^-1 by the recursion of eq. 5
   (`projection.recursive_projection`; on its normalised form see there and
   BUILD_NOTES.md).

P depends only on the received weights and the batches, so computing it
after training is the paper's step 1 (Algorithm 1 computes it "before"
training only in the listing's order). Which batches: a tf.data dataset
with `shuffle(reshuffle_each_iteration=True)` (the clients' datasets)
gives a *new* order on a second pass inside one graph, so the process gives
the projection its own dataset built from the client's key (the same
batches as training's). Clients that receive a dataset as a value (no key)
read it twice, and their P uses the second pass's batches (the same
examples in other batches).

Server (`server_round`, Algorithm 1 lines 7-10), given the stacked client
models and projections and the student's starting point (their average):

1. f = B(x) for every unlabeled server sample x, with the averaged model's
   backbone (inference mode);
2. r_k = cos(f, P_k f) (eq. 6, first line) for the clients of the round;
3. per-sample teacher weights (`masked_teacher_weights`): eq. 6's
   softmax((r - mean r) / std r) ('soft'), or the ablation's 'onehot',
   'avg', 'random' (Table 1), over this round's clients only;
4. the eq. 7 target y = sum_k alpha_k h_k(x) (`distillation.weighted_ensemble`
   with `ensemble='probs'`; h_k's outputs are probabilities), teachers
   evaluated by `tff_kd.core.teachers_tf.stacked_logits`;
5. eq. 8, KL between the student and y, minimised by the shared
   `distillation.distill` from the averaged model.

With a labeled server set the round's mechanism (the eq. 7 ensemble's and
the uniform ensemble's accuracy on it) and the link table every KD method
reports (`tff_kd.core.links`: teachers, ensembles, the student before and
after) are measured after the distillation by `ensemble_accuracies`, the
round's `tff_kd.core.diagnostics` hook; without one, only the target's
entropy.

Heterogeneous models (the paper's "Application to Heterogeneous Models",
Sec. 3): every client keeps its own model h_k, of its own architecture,
across rounds. `hetero_client_round` builds P exactly as above from the
received *global* backbone (so every P_k lives in the global feature
space), then trains h_k from its previous weights with cross-entropy plus
`kd_weight` * `distillation.kd_loss` towards the received global model's
tempered softmax (`global_kd_regularizer`); the upload is h_k's weights and
P. `hetero_server_round` scores and weights the server samples with the
previous global model's backbone (there is no average across
architectures), evaluates each h_k in its own architecture
(`stacked_logits` per architecture, whole weights), and distils the eq. 7
target into the previous global model. Both variants share
`client_projection` and the server's weighting and distillation
(`_weighted_distill`).

All rounds are `tf.function`s, so their variable assignments and reads run
in program order also inside a TFF computation's graph; everything runs
eagerly as well (tests compare the TFF process with these functions).
"""

from typing import Callable, Mapping, NamedTuple, Optional, Sequence, Union

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd import models
from tff_kd.core import diagnostics as core_diagnostics
from tff_kd.core import distill_hparams
from tff_kd.core import distillation
from tff_kd.core import links
from tff_kd.core import local_training
from tff_kd.core import loops
from tff_kd.core import teachers as teachers_tf
from tff_kd.methods.fedd3a import hparams as hparams_lib
from tff_kd.methods.fedd3a import projection_tf as projection

ModelWeights = tff.learning.models.ModelWeights
# The config's choices (`hparams` imports no TensorFlow).
WEIGHTINGS = hparams_lib.WEIGHTINGS
ENSEMBLES = hparams_lib.ENSEMBLES
# Whose backbone computes the server samples' features f of eq. 6.
SCORE_BACKBONES = hparams_lib.SCORE_BACKBONES


# ---------------------------------------------------------------------------
# Client.


class ClientRound(NamedTuple):
  """One client's FedD3A round.

  Attributes:
    local: The `local_training.LocalResult` (delta, counts, loss).
    projection: [d, d] float32 projection P of eq. 5, computed with the
      received global backbone before local training.
    num_batches: m, the batch means P was built from, int32.
  """

  local: local_training.LocalResult
  projection: tf.Tensor
  num_batches: tf.Tensor


@tf.function(autograph=False)
def client_round(classifier: models.Classifier,
                 optimizer: tff.learning.optimizers.Optimizer,
                 initial_weights: ModelWeights,
                 dataset: tf.data.Dataset,
                 learning_rate: tf.Tensor,
                 *,
                 alpha: float,
                 projection_batches: int = 0,
                 projection_dataset: Optional[tf.data.Dataset] = None
                 ) -> ClientRound:
  """Local training, and P from the received global backbone's features.

  Args:
    classifier: A built `Classifier` (its `features` share variables with
      `model`); its variables are overwritten.
    optimizer: Client `tff.learning.optimizers` optimizer.
    initial_weights: The received global `ModelWeights` of
      `classifier.model`.
    dataset: The round's local batches `{'x', 'y'}`, trained on in its
      first pass (so the training order is FedAvg's and FedDF's).
    learning_rate: This round's client learning rate.
    alpha: Ridge of eq. 5, > 0.
    projection_batches: Cap on the batches P is built from; 0 = all.
    projection_dataset: The batches P uses the means of (the first
      `projection_batches` if > 0): a second dataset built from the same key
      (so the same batches as training's), or None to read `dataset` a
      second time (see `PROJECTION_PASS`).

  Returns:
    A `ClientRound`.
  """
  local = local_training.train_locally(classifier.model, optimizer,
                                       initial_weights, dataset, learning_rate)
  p, num_batches = client_projection(
      classifier, initial_weights,
      dataset if projection_dataset is None else projection_dataset,
      alpha=alpha, projection_batches=projection_batches)
  return ClientRound(local, p, num_batches)


def client_projection(classifier: models.Classifier,
                      global_weights: ModelWeights,
                      dataset: tf.data.Dataset,
                      *,
                      alpha: float,
                      projection_batches: int = 0
                      ) -> tuple[tf.Tensor, tf.Tensor]:
  """(P of eq. 5, m) from the received global backbone's batch means.

  Loads `global_weights` into `classifier` (it stays loaded). Call inside a
  `tf.function` (the client rounds do) so the assignments come first.
  """
  tf.nest.map_structure(lambda v, w: v.assign(w),
                        local_training.model_weights(classifier.model),
                        global_weights)
  batches = dataset.take(projection_batches) if projection_batches else dataset
  means = projection.dataset_batch_means(
      classifier.features, batches, feature_dim=classifier.feature_dim)
  return projection.recursive_projection(means, alpha), tf.shape(means)[0]


def fused_projections(classifier: models.Classifier,
                      global_weights: ModelWeights, x: tf.Tensor,
                      indices: tf.Tensor, mask: tf.Tensor, *, alpha: float,
                      projection_batches: int = 0) -> tf.Tensor:
  """`client_projection` of G fused clients, from the batches they trained
  on (`tff_kd.federated.execution.FusedBatches`).

  Client g's batch at step s is `x[indices[s, g]]` where `mask[s, g]` is 1
  (`tff_kd.core.fused.fused_schedule`); its batches are the first steps.
  Every step's G batches go through the received backbone at once (it is
  the same for every client; BatchNorm in inference mode, as
  `projection.dataset_batch_means`); each client's batch means then give
  its P (eq. 5). Loads `global_weights` into `classifier`, as
  `client_projection` does.

  Args:
    classifier: A built `Classifier`.
    global_weights: The received global `ModelWeights`.
    x: The clients' examples plus the zero padding row.
    indices: [S, G, B] int32 rows of `x`.
    mask: [S, G, B] float32, 1 for a real example.
    alpha: Ridge of eq. 5, > 0.
    projection_batches: Cap on the batches P is built from; 0 = all.

  Returns:
    [G, d, d]: each client's P (zero for a client with no batch).
  """
  loads = tf.nest.flatten(tf.nest.map_structure(
      lambda v, w: v.assign(w),
      local_training.model_weights(classifier.model), global_weights))
  steps = tf.shape(indices)[0]
  if projection_batches:
    steps = tf.minimum(steps, projection_batches)
  g, b = int(indices.shape[1]), int(indices.shape[2])
  d = int(classifier.feature_dim)

  def step(means, s):
    features = projection.extract(
        classifier.features, tf.gather(x, tf.reshape(indices[s], [-1])))
    features = tf.reshape(tf.cast(features, tf.float32), [g, b, d])
    weight = mask[s][..., tf.newaxis]
    return means.write(s, tf.math.divide_no_nan(
        tf.reduce_sum(weight * features, axis=1),
        tf.reduce_sum(weight, axis=1)))

  with tf.control_dependencies(loads):  # Read what was loaded.
    means = loops.fold_range(steps, step, tf.TensorArray(
        tf.float32, steps, element_shape=[g, d])).stack()
  has_batch = tf.reduce_sum(mask[:steps], axis=2) > 0
  return tf.stack([
      projection.recursive_projection(
          tf.boolean_mask(means[:, k], has_batch[:, k]), alpha)
      for k in range(g)])


def global_kd_regularizer(teacher: tf.keras.Model, *, weight: float,
                          temperature: float) -> local_training.Regularizer:
  """`weight` * KD from `teacher` (inference mode) as a local-loss term.

  For `local_training.train_locally`: the step's loss becomes
  CE + weight * T^2 KL(softmax(g(x) / T) || softmax(h(x) / T)) with g the
  received global model and h the local model (the paper's heterogeneous
  local training, Sec. 3), through `distillation.kd_loss`.
  """

  def regularizer(batch, logits, step):
    del step
    target = tf.stop_gradient(tf.nn.softmax(
        teacher(batch['x'], training=False) / temperature, axis=-1))
    return weight * distillation.kd_loss(logits, target, temperature)

  return regularizer


class HeteroClientRound(NamedTuple):
  """One heterogeneous client's FedD3A round.

  Attributes:
    local: Summed `LocalResult` statistics (`weights_delta` None).
    weights: One `ModelWeights` per architecture: the trained local model
      for the client's own architecture, the given weights for the others.
    projection: [d, d] P of eq. 5 in the global feature space.
    num_batches: m, the batch means P was built from.
  """

  local: local_training.LocalResult
  weights: tuple
  projection: tf.Tensor
  num_batches: tf.Tensor


@tf.function(autograph=False)
def hetero_client_round(global_classifier: models.Classifier,
                        local_models: Sequence[tf.keras.Model],
                        optimizer: tff.learning.optimizers.Optimizer,
                        global_weights: ModelWeights,
                        local_weights: Sequence[ModelWeights],
                        dataset: tf.data.Dataset,
                        learning_rate: tf.Tensor,
                        *,
                        architecture: Union[int, tf.Tensor],
                        hparams: 'hparams_lib.FedD3AHparams',
                        projection_dataset: Optional[tf.data.Dataset] = None
                        ) -> HeteroClientRound:
  """CE + KD local training, and P with the received global backbone.

  Args:
    global_classifier: Built `Classifier` of the global architecture
      (overwritten with `global_weights`; the KD teacher).
    local_models: One built Keras model per client architecture
      (overwritten).
    optimizer: Client `tff.learning.optimizers` optimizer.
    global_weights: The received global `ModelWeights`.
    local_weights: The client's previous local `ModelWeights`, one per
      architecture (only `architecture`'s is used).
    dataset: The round's local batches `{'x', 'y'}`.
    learning_rate: This round's client learning rate.
    architecture: The client's architecture index (int32 scalar).
    hparams: `config.fedd3a`: the ridge `alpha` of eq. 5, the
      `projection_batches` P is built from (0: all), and the KD term's
      `kd_weight` (0: cross-entropy only) and `kd_temperature`.
    projection_dataset: As in `client_round`.

  Returns:
    A `HeteroClientRound`.
  """
  # The KD teacher is the received global model.
  tf.nest.map_structure(lambda v, w: v.assign(w),
                        local_training.model_weights(global_classifier.model),
                        global_weights)
  regularizer = global_kd_regularizer(
      global_classifier.model, weight=float(hparams.kd_weight),
      temperature=float(hparams.kd_temperature))
  results, weights = [], []
  for a, (model, start) in enumerate(zip(local_models, local_weights)):
    # take(-1) is the whole dataset, take(0) none (FedDF's prototypes).
    count = tf.where(tf.equal(architecture, a), tf.constant(-1, tf.int64),
                     tf.constant(0, tf.int64))
    results.append(local_training.train_locally(
        model, optimizer, start, dataset.take(count), learning_rate,
        regularizer=regularizer))
    weights.append(tf.nest.map_structure(
        tf.identity, local_training.model_weights(model)))
  local = local_training.LocalResult(
      weights_delta=None,
      num_examples=tf.add_n([r.num_examples for r in results]),
      loss_sum=tf.add_n([r.loss_sum for r in results]),
      num_steps=tf.add_n([r.num_steps for r in results]))
  p, num_batches = client_projection(
      global_classifier, global_weights,
      dataset if projection_dataset is None else projection_dataset,
      alpha=float(hparams.alpha),
      projection_batches=hparams.projection_batches)
  return HeteroClientRound(local, tuple(weights), p, num_batches)


# ---------------------------------------------------------------------------
# Server.


def masked_teacher_weights(scores: tf.Tensor, valid: tf.Tensor,
                           weighting: str, *,
                           seed: Optional[Union[int, tf.Tensor]] = None
                           ) -> tf.Tensor:
  """`projection.teacher_weights` over the rows that hold a client.

  The stack has a fixed number of rows M; eq. 6's mean and std (and the
  softmax) must only see this round's clients, so the valid rows are
  gathered, weighted and scattered back.

  Args:
    scores: [M, N] scores r.
    valid: [M] bool, rows holding a client model.
    weighting: One of `WEIGHTINGS`.
    seed: For 'random': a stateless seed (int, or int tensor [] or [2]).

  Returns:
    [M, N] float32 weights: each column sums to 1 over the valid rows;
    invalid rows (and every row, when no row is valid) are 0.
  """
  # Rank 2 statically: the softmax over axis 0 needs it.
  scores = tf.ensure_shape(tf.cast(tf.convert_to_tensor(scores), tf.float32),
                           [None, None])
  rows = tf.where(tf.convert_to_tensor(valid, tf.bool))
  if weighting == 'random' and seed is None:
    raise errors.ConfigError("weighting 'random' needs a seed")

  def weighted():
    w = projection.teacher_weights(tf.gather_nd(scores, rows), weighting,
                                   seed=seed if seed is not None else 0)
    return tf.scatter_nd(rows, w, tf.shape(scores, out_type=tf.int64))

  return tf.cond(tf.size(rows) > 0, weighted, lambda: tf.zeros_like(scores))


class ServerRound(NamedTuple):
  """What one FedD3A server round produces.

  Attributes:
    weights: The distilled student's `ModelWeights`.
    distill: The `distillation.DistillResult` (without optimiser state).
    scores: [M, N] r_k of every server sample (0 in invalid rows).
    teacher_weights: [M, N] per-sample teacher weights alpha.
    target: [N, C] the eq. 7 pseudo-labels.
    teacher_seconds: Wall time of features, scores and teachers.
    distill_seconds: Wall time of the distillation loop.
    ensemble_accuracy: Accuracy of the eq. 7 ensemble (this round's
      weighting) on the labeled validation set; -1 without one.
    uniform_accuracy: The same for uniform weights (FedDF's average).
    links: The link table (`tff_kd.core.links.NAMES` -> value, -1 where
      not measured).
  """

  weights: ModelWeights
  distill: distillation.DistillResult
  scores: tf.Tensor
  teacher_weights: tf.Tensor
  target: tf.Tensor
  teacher_seconds: tf.Tensor
  distill_seconds: tf.Tensor
  ensemble_accuracy: tf.Tensor | float = -1.0
  uniform_accuracy: tf.Tensor | float = -1.0
  links: Optional[Mapping[str, tf.Tensor]] = None


class ServerSettings(NamedTuple):
  """The server round's settings, fixed for a process.

  Attributes:
    hparams: `config.fedd3a`: its `weighting` ('soft', eq. 6, or Table 1's
      'onehot', 'avg', 'random'), `ensemble` ('probs', eq. 7, or 'logits':
      softmax of the weighted logits) and `score_backbone` (`server_round`).
    distill: A `distill_hparams.DistillConfig`; its temperature is also the
      teachers'.
    batch_size: Forward-pass batch size.
  """

  hparams: 'hparams_lib.FedD3AHparams'
  distill: distill_hparams.DistillConfig
  batch_size: int = 256


class Uploads(NamedTuple):
  """What the server received this round, stacked in [M, ...] rows.

  Attributes:
    models: Homogeneous clients: the stacked client deltas (see
      `tff_kd.core.stacking.average_update`). Heterogeneous ones: per
      architecture, the stacked whole client `ModelWeights` (rows of other
      architectures unused).
    projections: [M, d, d] client projections.
    valid: [M] bool, rows holding a client.
    architectures: Heterogeneous clients: [M] int32 architecture index of
      each row; None otherwise.
  """

  models: ModelWeights | Sequence[ModelWeights]
  projections: tf.Tensor
  valid: tf.Tensor
  architectures: Optional[tf.Tensor] = None


class ServerSamples(NamedTuple):
  """The server's data.

  Attributes:
    pool: Unlabeled server samples [N, ...].
    labeled: The server's labeled validation set (images, labels), or
      None: the ensembles' accuracies on it are reported, and
      `DistillConfig.validation` / `accept` may use it.
  """

  pool: tf.Tensor
  labeled: Optional[tuple[tf.Tensor, tf.Tensor]] = None


@tf.function(autograph=False)
def server_round(student: models.Classifier,
                 teacher: tf.keras.Model,
                 optimizer: tff.learning.optimizers.Optimizer,
                 *,
                 global_weights: ModelWeights,
                 start_weights: ModelWeights,
                 uploads: Uploads,
                 samples: ServerSamples,
                 settings: ServerSettings,
                 seed: Optional[Union[int, tf.Tensor]] = None
                 ) -> ServerRound:
  """FedD3A's server side of one round (eq. 6-8).

  Args:
    student: Built `Classifier` of the global architecture (overwritten).
    teacher: Built Keras model of the same architecture, reused for every
      client row (overwritten).
    optimizer: Distillation optimiser, fresh state.
    global_weights: This round's broadcast global `ModelWeights`.
    start_weights: The student's start, the clients' average (Algorithm 1
      line 7).
    uploads: `Uploads` with the stacked client deltas as `models`.
    samples: The server's `ServerSamples`.
    settings: `ServerSettings`. `hparams.score_backbone` says whose
      backbone gives the features f of eq. 6: 'broadcast' (w_t, the one
      every client built its P_k with: server and client features then
      live in the same space) or 'aggregated' (the averaged model after
      local training, the student's start).
    seed: Stateless seed of the 'random' weighting.

  Returns:
    A `ServerRound`.
  """
  feature_weights = (global_weights
                     if settings.hparams.score_backbone == 'broadcast' else
                     start_weights)
  return _weighted_distill(
      student, optimizer, start_weights=start_weights,
      feature_weights=feature_weights, uploads=uploads,
      teacher_logits_fn=lambda x: teachers_tf.stacked_logits(
          teacher, global_weights, uploads.models, uploads.valid, x,
          settings.batch_size),
      samples=samples, settings=settings, seed=seed)


@tf.function(autograph=False)
def hetero_server_round(student: models.Classifier,
                        teachers: Sequence[tf.keras.Model],
                        optimizer: tff.learning.optimizers.Optimizer,
                        *,
                        start_weights: ModelWeights,
                        uploads: Uploads,
                        samples: ServerSamples,
                        settings: ServerSettings,
                        seed: Optional[Union[int, tf.Tensor]] = None
                        ) -> ServerRound:
  """The server round with heterogeneous client models (eq. 6-8).

  The student starts from the previous global model (`start_weights`):
  client models of other architectures cannot be averaged. Its backbone
  gives the features of eq. 6 (`hparams.score_backbone` is unused); teacher
  k is client k's own model h_k.

  Args:
    student: Built `Classifier` of the global architecture (overwritten).
    teachers: One built Keras model per client architecture (overwritten).
    optimizer: Distillation optimiser, fresh state.
    start_weights: The previous global `ModelWeights`.
    uploads: `Uploads` with the per-architecture stacked whole client
      weights as `models` and their `architectures`.
    samples: As in `server_round`.
    settings: As in `server_round`.
    seed: Stateless seed of the 'random' weighting.

  Returns:
    A `ServerRound`.
  """
  architectures = tf.cast(uploads.architectures, tf.int32)
  valid = uploads.valid

  def teacher_logits(x):
    # Row k is valid for exactly one architecture; the others give zeros.
    return tf.add_n([
        teachers_tf.stacked_logits(
            model, None, weights,
            tf.logical_and(valid, tf.equal(architectures, a)), x,
            settings.batch_size)
        for a, (model, weights) in enumerate(zip(teachers, uploads.models))])

  # The previous global model is both the student's start and w_t.
  return _weighted_distill(
      student, optimizer, start_weights=start_weights,
      feature_weights=start_weights, uploads=uploads,
      teacher_logits_fn=teacher_logits, samples=samples, settings=settings,
      seed=seed)


def _weighted_distill(student: models.Classifier,
                      optimizer: tff.learning.optimizers.Optimizer,
                      *,
                      start_weights: ModelWeights,
                      feature_weights: ModelWeights,
                      uploads: Uploads,
                      teacher_logits_fn: Callable[[tf.Tensor], tf.Tensor],
                      samples: ServerSamples,
                      settings: ServerSettings,
                      seed: Optional[Union[int, tf.Tensor]]) -> ServerRound:
  """Eq. 6-8 from the student's start: features, weights, target, distill.

  Runs inside the calling round's `tf.function`; `teacher_logits_fn(x)`
  returns the [M, N, C] teacher logits on `x` (zeros in invalid rows). The
  features of eq. 6 come from the backbone of `feature_weights`.
  """
  projections, valid = uploads.projections, uploads.valid
  weighting = settings.hparams.weighting
  ensemble = settings.hparams.ensemble
  config, batch_size = settings.distill, settings.batch_size
  pool, labeled = samples.pool, samples.labeled
  t0 = tf.timestamp()
  variables = local_training.model_weights(student.model)
  with tf.control_dependencies([t0]):  # Timestamps follow no data flow.
    tf.nest.map_structure(lambda v, w: v.assign(w), variables,
                          feature_weights)

  def weights_on(x):
    features = tf.ensure_shape(
        distillation.teacher_logits([student.features], x, batch_size)[0],
        [None, student.feature_dim])
    scores = projection.projection_scores(features, projections)
    scores = scores * tf.cast(valid, tf.float32)[:, tf.newaxis]
    return scores, masked_teacher_weights(scores, valid, weighting,
                                          seed=seed)

  scores, alpha = weights_on(pool)
  logits = teacher_logits_fn(pool)
  target = tf.stop_gradient(distillation.weighted_ensemble(
      logits, alpha, temperature=config.temperature, ensemble=ensemble))
  t1, distill_pool = distillation.timed_pool([target], pool)
  with tf.control_dependencies([t1]):
    tf.nest.map_structure(lambda v, w: v.assign(w), variables, start_weights)
  result = distillation.distill(student.model, optimizer, distill_pool, target,
                                config, labeled=labeled)
  with tf.control_dependencies(tf.nest.flatten(result.weights)):
    t2 = tf.timestamp()
  metrics = dict.fromkeys(('ensemble_accuracy', 'uniform_accuracy'),
                          tf.constant(-1.0))
  table = links.link_metrics(None, valid, None, target=target)
  if labeled is not None:
    measured = core_diagnostics.run(
        ensemble_accuracies, core_diagnostics.ServerRound(
            teacher_logits_fn, alpha, pool, target, student.model, variables,
            start_weights, result.weights, labeled,
            WeightingTerms(feature_weights, weights_on, valid, ensemble)))
    metrics = {name: measured.pop(name) for name in metrics}
    table = measured
  return ServerRound(
      weights=result.weights, distill=result._replace(optimizer_state=()),
      scores=scores, teacher_weights=alpha, target=target,
      teacher_seconds=tf.cast(t1 - t0, tf.float32),
      distill_seconds=tf.cast(t2 - t1, tf.float32),
      links=table, **metrics)


class WeightingTerms(NamedTuple):
  """FedD3A's terms of a round (`core_diagnostics.ServerRound.terms`).

  Attributes:
    feature_weights: The backbone's weights for eq. 6's features.
    weights_on: Samples [N, ...] -> (scores r_k [M, N], alpha [M, N]),
      with `feature_weights` loaded into the student.
    valid: [M] bool, rows holding a client.
    ensemble: 'probs' (eq. 7) or 'logits'.
  """

  feature_weights: ModelWeights
  weights_on: Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]
  valid: tf.Tensor
  ensemble: str


def ensemble_accuracies(server_round: core_diagnostics.ServerRound
                        ) -> dict[str, tf.Tensor]:
  """FedD3A's `core_diagnostics.Hook`: its mechanism on the labeled images.

  The accuracy of the eq. 7 ensemble (this round's weighting, scored with
  the backbone of `WeightingTerms.feature_weights`) and of the uniform one
  (FedDF's average) on the labeled validation set, then the link table
  (`links.LinkHook` on the same teachers' logits, the eq. 7 ensemble as
  the method's own).

  Args:
    server_round: The round (with `labeled`; `teachers` is the teachers'
      logits function, `terms` the `WeightingTerms`).

  Returns:
    `ensemble_accuracy`, `uniform_accuracy` and the link table
    (`links.NAMES`).
  """
  r, terms = server_round, server_round.terms
  x, y = r.labeled
  core_diagnostics.load(r.student_variables, terms.feature_weights)
  _, val_alpha = terms.weights_on(x)
  val_logits = r.teachers(x)
  uniform = masked_teacher_weights(scores=tf.ones_like(val_alpha),
                                   valid=terms.valid, weighting='avg')
  own, average = [distillation.weighted_ensemble(
      val_logits, w, ensemble=terms.ensemble) for w in (val_alpha, uniform)]
  table = links.LinkHook()(r._replace(teachers=links.Teachers(
      logits_fn=lambda _: val_logits, valid=terms.valid,
      ensemble_fn=lambda *_: own)))
  return dict(ensemble_accuracy=teachers_tf.accuracy(own, y),
              uniform_accuracy=teachers_tf.accuracy(average, y), **table)


def per_client_mean(values: tf.Tensor, client_ids: tf.Tensor,
                    valid: tf.Tensor, num_clients: int) -> tf.Tensor:
  """[num_clients] mean over samples of each row, placed at its client id.

  Rows that hold no client, or whose id is outside [0, num_clients), are
  left out; clients not in the round get 0.
  """
  ids = tf.cast(client_ids, tf.int32)
  keep = tf.logical_and(tf.convert_to_tensor(valid, tf.bool),
                        tf.logical_and(ids >= 0, ids < num_clients))
  ids = tf.where(keep, ids, tf.fill(tf.shape(ids), num_clients))
  means = tf.reduce_mean(tf.cast(values, tf.float32), axis=1)
  return tf.math.unsorted_segment_sum(means, ids, num_clients + 1)[:-1]


def check_pool(pool_shape: Sequence[int], input_shape: Sequence[int]) -> None:
  """`errors.DataError` unless the server pool matches the model input."""
  teachers_tf.check_pool_shape(pool_shape, input_shape, 'server pool')
