"""Pure-TF client and server rounds of FedD3A.

FedD3A: Su, Li and Xue, "Domain Discrepancy Aware Distillation for Model
Aggregation in Federated Learning", AAAI 2023 (Sec. 3, Algorithm 1). The
subspace maths (eq. 5 and 6) is in `tff_kd.core.projection`; this module
strings it together with local training and the shared server distillation.

Client (`client_round`, Algorithm 1 lines 4-5):

1. copy the received global weights into the client's classifier and run its
   backbone B (inference mode) over the round's local batches: one mean
   feature z_i per batch;
2. P = Z^T Z (alpha I + Z^T Z)^-1 by the recursion of eq. 5
   (`projection.recursive_projection`; on its normalised form see there and
   BUILD_NOTES.md);
3. local training from the same global weights
   (`local_training.train_locally`), so the upload is FedAvg's delta plus P.

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
   evaluated by `tff_kd.core.feddf.stacked_logits`;
5. eq. 8, KL between the student and y, minimised by the shared
   `distillation.distill` from the averaged model.

Both rounds are `tf.function`s, so their variable assignments and reads run
in program order also inside a TFF computation's graph; everything runs
eagerly as well (tests compare the TFF process with these functions).
"""

from typing import NamedTuple, Optional, Sequence, Union

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd import models
from tff_kd.core import distillation
from tff_kd.core import feddf as feddf_tf
from tff_kd.core import local_training
from tff_kd.core import projection

ModelWeights = tff.learning.models.ModelWeights
WEIGHTINGS = projection.STRATEGIES
ENSEMBLES = ('probs', 'logits')


def check_settings(*, alpha: float, weighting: str, ensemble: str = 'probs',
                   projection_batches: int = 0) -> None:
  """Raises `errors.ConfigError` for a bad FedD3A hyper-parameter."""
  if (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or
      not alpha > 0 or alpha == float('inf')):
    raise errors.ConfigError(
        f'fedd3a.alpha (the ridge of eq. 5) must be a finite number > 0, got '
        f'{alpha!r}')
  if weighting not in WEIGHTINGS:
    raise errors.ConfigError(
        f'fedd3a.weighting {weighting!r} is unknown; choose one of '
        f"{', '.join(WEIGHTINGS)}")
  if ensemble not in ENSEMBLES:
    raise errors.ConfigError(
        f'fedd3a.ensemble {ensemble!r} is unknown; choose one of '
        f"{', '.join(ENSEMBLES)}")
  if (isinstance(projection_batches, bool) or
      not isinstance(projection_batches, int) or projection_batches < 0):
    raise errors.ConfigError(
        'fedd3a.projection_batches must be an integer >= 0 (0: all of the '
        f"round's batches), got {projection_batches!r}")


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


@tf.function
def client_round(classifier: models.Classifier,
                 optimizer: tff.learning.optimizers.Optimizer,
                 initial_weights: ModelWeights,
                 dataset: tf.data.Dataset,
                 learning_rate: tf.Tensor,
                 *,
                 alpha: float,
                 projection_batches: int = 0) -> ClientRound:
  """P from the global backbone's features, then local training.

  Args:
    classifier: A built `Classifier` (its `features` share variables with
      `model`); its variables are overwritten.
    optimizer: Client `tff.learning.optimizers` optimizer.
    initial_weights: The received global `ModelWeights` of
      `classifier.model`.
    dataset: The round's local batches `{'x', 'y'}`; P uses their means (the
      first `projection_batches` of them if > 0), training all of them.
    learning_rate: This round's client learning rate.
    alpha: Ridge of eq. 5, > 0.
    projection_batches: Cap on the batches P is built from; 0 = all.

  Returns:
    A `ClientRound`.
  """
  tf.nest.map_structure(lambda v, w: v.assign(w),
                        local_training.model_weights(classifier.model),
                        initial_weights)
  batches = dataset.take(projection_batches) if projection_batches else dataset
  means = projection.dataset_batch_means(
      classifier.features, batches, feature_dim=classifier.feature_dim)
  p = projection.recursive_projection(means, alpha)
  local = local_training.train_locally(classifier.model, optimizer,
                                       initial_weights, dataset, learning_rate)
  return ClientRound(local, p, tf.shape(means)[0])


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


def weight_entropy(weights: tf.Tensor) -> tf.Tensor:
  """Mean over samples of -sum_k w log w (nats; 0 log 0 = 0)."""
  w = tf.convert_to_tensor(weights, tf.float32)
  logs = tf.math.log(tf.where(w > 0, w, tf.ones_like(w)))
  return tf.reduce_mean(-tf.reduce_sum(w * logs, axis=0))


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
  """

  weights: ModelWeights
  distill: distillation.DistillResult
  scores: tf.Tensor
  teacher_weights: tf.Tensor
  target: tf.Tensor
  teacher_seconds: tf.Tensor
  distill_seconds: tf.Tensor


@tf.function
def server_round(student: models.Classifier,
                 teacher: tf.keras.Model,
                 optimizer: tff.learning.optimizers.Optimizer,
                 *,
                 global_weights: ModelWeights,
                 deltas: ModelWeights,
                 projections: tf.Tensor,
                 valid: tf.Tensor,
                 start_weights: ModelWeights,
                 pool: tf.Tensor,
                 config: distillation.DistillConfig,
                 weighting: str = 'soft',
                 ensemble: str = 'probs',
                 seed: Optional[Union[int, tf.Tensor]] = None,
                 batch_size: int = 256) -> ServerRound:
  """FedD3A's server side of one round (eq. 6-8).

  Args:
    student: Built `Classifier` of the global architecture (overwritten).
    teacher: Built Keras model of the same architecture, reused for every
      client row (overwritten).
    optimizer: Distillation optimiser, fresh state.
    global_weights: This round's broadcast global `ModelWeights`.
    deltas: Stacked client results ([M, ...] leaves; see
      `tff_kd.core.feddf.average_update`).
    projections: [M, d, d] client projections.
    valid: [M] bool, rows holding a client.
    start_weights: The student's start, the clients' average (Algorithm 1
      line 7).
    pool: Unlabeled server samples [N, ...].
    config: A `DistillConfig`; its temperature is also the teachers'.
    weighting: 'soft' (eq. 6), 'onehot', 'avg' or 'random'.
    ensemble: 'probs' (eq. 7) or 'logits' (softmax of the weighted logits).
    seed: Stateless seed of the 'random' weighting.
    batch_size: Forward-pass batch size.

  Returns:
    A `ServerRound`.
  """
  t0 = tf.timestamp()
  tf.nest.map_structure(lambda v, w: v.assign(w),
                        local_training.model_weights(student.model),
                        start_weights)
  features = tf.ensure_shape(
      distillation.teacher_logits([student.features], pool, batch_size)[0],
      [None, student.feature_dim])
  scores = projection.projection_scores(features, projections)
  valid_f = tf.cast(valid, tf.float32)[:, tf.newaxis]
  scores = scores * valid_f
  alpha = masked_teacher_weights(scores, valid, weighting, seed=seed)
  logits = feddf_tf.stacked_logits(teacher, global_weights, deltas, valid,
                                   pool, batch_size)
  target = tf.stop_gradient(distillation.weighted_ensemble(
      logits, alpha, temperature=config.temperature, ensemble=ensemble))
  with tf.control_dependencies([target]):
    t1 = tf.timestamp()
  result = distillation.distill(student.model, optimizer, pool, target, config)
  with tf.control_dependencies(tf.nest.flatten(result.weights)):
    t2 = tf.timestamp()
  return ServerRound(
      weights=result.weights, distill=result._replace(optimizer_state=()),
      scores=scores, teacher_weights=alpha, target=target,
      teacher_seconds=tf.cast(t1 - t0, tf.float32),
      distill_seconds=tf.cast(t2 - t1, tf.float32))


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
  feddf_tf.check_pool_shape(pool_shape, input_shape, 'server pool')
