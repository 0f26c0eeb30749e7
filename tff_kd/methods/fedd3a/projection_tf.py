"""Pure-TF subspace projections and teacher weights of FedD3A.

FedD3A (Su, Li and Xue, "Domain Discrepancy Aware Distillation for Model
Aggregation in Federated Learning", AAAI 2023, Section 3) weights each teacher
per server sample by how close the sample's feature lies to that teacher's
client domain. One round flows through this module as follows:

1. Client, before local training: the *global* backbone extracts features of
   the local data; `dataset_batch_means` (or `batch_mean_features`) reduces
   them to one mean feature z_i per batch, and `recursive_projection` (eq. 5)
   turns the m batch means Z = [z_1; ...; z_m] (m x d) into the d x d matrix

       P = Z^T (Z Z^T + alpha I)^-1 Z = Z^T Z (alpha I + Z^T Z)^-1,

   the regularised projection onto span(Z). The client uploads P with its
   model. `closed_form_projection` computes the same P with one d x d solve.
2. Server: for each unlabeled sample with feature f from the averaged model's
   backbone, `projection_scores` gives r_k = cos(f, P_k f) (a value in [0, 1]
   because every P_k is symmetric positive semi-definite), and
   `teacher_weights` turns r into the weights of eq. 6 ('soft') or of the
   paper's ablation ('onehot', 'avg', 'random'); eq. 7's teacher is then
   sum_k weights_k * h_k(x).
3. Table 2 ("classification ability of subspace projection") compares
   `classify_by_projection` with `classify_by_prototype`.

On eq. 5 and alpha. Read literally, eq. 5 starts from P^_0 = I / alpha and
applies Sherman-Morrison rank-one updates, so P^_m = (alpha I + G)^-1 with
G = Z^T Z, and the paper then sets P = I - P^_m. But

    I - alpha (alpha I + G)^-1 = (alpha I + G - alpha I) (alpha I + G)^-1
                               = G (alpha I + G)^-1
                               = Z^T (Z Z^T + alpha I)^-1 Z  (push-through),

so the projection the paper defines in the text just before eq. 5 is
I - alpha * P^_m; the literal I - P^_m agrees with it only when alpha = 1.
Otherwise the literal reading maps a direction orthogonal to every batch mean
to (1 - 1/alpha) times itself (negative for alpha < 1, nearly the identity for
large alpha), which is no projection at all. The cited recursion (Zeng et al.,
"Continual learning of context-dependent processing in neural networks",
Nature Machine Intelligence 2019, the orthogonal-weight-modification
projector) is the normalised one: Q_0 = I and
Q_i = Q_{i-1} - Q_{i-1} z_i z_i^T Q_{i-1} / (alpha + z_i^T Q_{i-1} z_i), which
is exactly Q_i = alpha * P^_i. `recursive_projection` runs that form and
returns I - Q_m; `recursive_inverse_gram` keeps the literal eq. 5 for
comparison (tests show both facts above).

Everything here is plain TensorFlow with no AutoGraph requirement
(`dataset_batch_means` is a `tf.function` whose loop is
`tff_kd.core.loops.fold_batches`), so it runs eagerly, inside `tf.function`
and inside `tff.tensorflow.computation` bodies.
"""

from typing import Callable, Optional, Union

import numpy as np
import tensorflow as tf

from tff_kd.core import loops
from tff_kd.methods.fedd3a import hparams as hparams_lib

# The teacher weightings (the config's `fedd3a.weighting` choices).
STRATEGIES = hparams_lib.WEIGHTINGS

_Seed = Union[int, tuple[int, int], tf.Tensor]


def _positive_alpha(alpha: Union[float, tf.Tensor]) -> tf.Tensor:
  """`alpha` as a float64 scalar, rejecting non-positive values.

  A statically known value is checked in Python (ValueError); a value only
  known at run time gets a graph assertion.
  """
  static = tf.get_static_value(alpha) if tf.is_tensor(alpha) else alpha
  if static is not None:
    value = float(np.asarray(static))
    if not value > 0:  # Also rejects NaN.
      raise ValueError(f'alpha must be > 0, got {value!r}.')
    return tf.constant(value, tf.float64)
  alpha = tf.cast(alpha, tf.float64)
  with tf.control_dependencies(
      [tf.debugging.assert_positive(alpha, message='alpha must be > 0')]):
    return tf.identity(alpha)


def _as_matrix(batch_means: tf.Tensor, name: str) -> tf.Tensor:
  batch_means = tf.convert_to_tensor(batch_means)
  if batch_means.shape.rank is not None and batch_means.shape.rank != 2:
    raise ValueError(
        f'{name} must have shape [m, d], got {batch_means.shape}.')
  return batch_means


def batch_mean_features(features: tf.Tensor, batch_size: int) -> tf.Tensor:
  """Means of consecutive batches of features (eq. 5's z-bar_i).

  Args:
    features: [n, d] features, n possibly unknown until run time.
    batch_size: Rows per batch; the last batch may be partial.

  Returns:
    [ceil(n / batch_size), d] batch means, in `features`' dtype.

  Raises:
    ValueError: If `batch_size` is not a positive integer or `features` is
      not of rank 2.
  """
  if isinstance(batch_size, bool) or int(batch_size) != batch_size or (
      batch_size <= 0):
    raise ValueError(f'batch_size must be a positive integer, got '
                     f'{batch_size!r}.')
  features = _as_matrix(features, 'features')
  n = tf.shape(features)[0]
  segment_ids = tf.range(n) // batch_size
  return tf.math.segment_mean(features, segment_ids)


def extract(extractor: Callable[..., tf.Tensor],
            images: tf.Tensor) -> tf.Tensor:
  """`extractor`'s features of `images`: a Keras layer or model in
  inference mode (`training=False`), any other callable as is."""
  if isinstance(extractor, tf.keras.layers.Layer):
    return extractor(images, training=False)
  return extractor(images)


def _static_feature_dim(extractor: Callable[..., tf.Tensor]) -> Optional[int]:
  try:
    shape = tf.TensorShape(extractor.output_shape)
  except (AttributeError, TypeError, ValueError, RuntimeError):
    return None
  return shape[-1] if shape.rank else None


@tf.function(autograph=False)
def dataset_batch_means(extractor: Callable[..., tf.Tensor],
                        dataset: tf.data.Dataset,
                        *,
                        feature_dim: Optional[int] = None,
                        dtype: tf.DType = tf.float32) -> tf.Tensor:
  """Mean feature of every batch of a dataset, in order.

  A `tf.function` whose loop over `dataset` is built without AutoGraph
  (`tff_kd.core.loops.fold_batches`); build `extractor` outside.
  The number of batches need not be known.

  Args:
    extractor: Maps a batch of images to [b, d] features. A Keras layer or
      model is called with `training=False` (BatchNorm in inference mode);
      any other callable is called with the images only.
    dataset: Batches of `{'x': images, ...}` dicts, `(images, labels)`
      tuples, or image tensors.
    feature_dim: d. Needed only to return a [0, d] tensor for an empty
      dataset when `extractor` has no static `output_shape`.
    dtype: Dtype of the returned means.

  Returns:
    [number of batches, d] per-batch mean features.
  """
  if feature_dim is None:
    feature_dim = _static_feature_dim(extractor)
  means = tf.TensorArray(dtype, size=0, dynamic_size=True,
                         element_shape=tf.TensorShape([feature_dim]))

  def add_batch(means, batch):
    if isinstance(batch, dict):
      images = batch['x']
    elif isinstance(batch, (tuple, list)):
      images = batch[0]
    else:
      images = batch
    features = extract(extractor, images)
    return means.write(means.size(),
                       tf.cast(tf.reduce_mean(features, axis=0), dtype))

  means = loops.fold_batches(dataset, add_batch, means)
  return means.stack()


def recursive_projection(batch_means: tf.Tensor,
                         alpha: Union[float, tf.Tensor]) -> tf.Tensor:
  """Eq. 5 projection P = Z^T Z (alpha I + Z^T Z)^-1 by rank-one updates.

  Runs the normalised (Zeng et al. 2019) form of eq. 5,

      Q_0 = I,  Q_i = Q_{i-1} - u u^T / (alpha + z_i^T u),  u = Q_{i-1} z_i,

  and returns P = I - Q_m. Q_i = alpha * P^_i where P^_i is eq. 5's literal
  iterate (started at I / alpha), so P = I - alpha * P^_m. This is the matrix
  the paper defines in words (Z^T (Z Z^T + alpha I)^-1 Z), which the paper's
  literal "P = I - P^" only reproduces when alpha = 1; see the module
  docstring for the algebra. As alpha -> 0, P tends to the orthogonal
  projection onto span(Z).

  Choosing alpha: P has eigenvalue lambda_j / (lambda_j + alpha) along each
  eigenvector of Z^T Z (eigenvalue lambda_j), and cos(f, P f) is invariant to
  scaling P, so only the *spread* of these eigenvalues discriminates domains.
  alpha should sit above the energy of the batch means in directions the
  domain does not use (noise) and below it in the directions it does; too
  small an alpha lifts noise directions towards 1 and raises every score.
  alpha is in squared feature units, so it scales with the features.

  The loop is a `tf.while_loop` over the rows of `batch_means`, so m may be
  unknown until run time (graph mode, `tf.function`, TFF). It runs in
  float64 and casts the result back: the normalised form is well behaved in
  float32 too (measured drift from float64 at most about 2e-6 of max |P| for
  d = 512, m = 50, alpha = 0.1, and about 4e-8 for d <= 128 with up to 600
  batches), but float64 costs little at these sizes and makes the loop and
  `closed_form_projection` agree to about 1e-10. Each update subtracts the
  exactly symmetric u u^T, so P stays exactly symmetric.

  Args:
    batch_means: [m, d] batch-mean features Z (m may be 0, giving P = 0).
    alpha: Ridge strength, > 0.

  Returns:
    [d, d] projection, in `batch_means`' dtype.

  Raises:
    ValueError: If `alpha` is statically known and not > 0, or `batch_means`
      is not of rank 2.
  """
  batch_means = _as_matrix(batch_means, 'batch_means')
  dtype = batch_means.dtype
  alpha = _positive_alpha(alpha)
  z = tf.cast(batch_means, tf.float64)
  num_batches = tf.shape(z)[0]
  d = tf.shape(z)[1]

  def body(i, q):
    zi = z[i][:, tf.newaxis]
    u = tf.matmul(q, zi)
    denominator = alpha + tf.reduce_sum(zi * u)
    return i + 1, q - tf.matmul(u, u, transpose_b=True) / denominator

  _, q = tf.while_loop(lambda i, q: i < num_batches, body,
                       (tf.constant(0), tf.eye(d, dtype=tf.float64)))
  q = tf.ensure_shape(q, [batch_means.shape[1], batch_means.shape[1]])
  return tf.cast(tf.eye(d, dtype=tf.float64) - q, dtype)


def recursive_inverse_gram(batch_means: tf.Tensor,
                           alpha: Union[float, tf.Tensor]) -> tf.Tensor:
  """Eq. 5 exactly as printed: P^_m = (alpha I + Z^T Z)^-1.

  P^_0 = I / alpha and
  P^_i = P^_{i-1} - P^_{i-1} z_i z_i^T P^_{i-1} / (1 + z_i^T P^_{i-1} z_i),
  i.e. Sherman-Morrison updates of (alpha I + sum_i z_i z_i^T)^-1. Kept to
  document the paper: I - P^_m is the projection only when alpha = 1, and
  I - alpha P^_m equals `recursive_projection` for every alpha. Use
  `recursive_projection` for FedD3A.

  Args:
    batch_means: [m, d] batch-mean features Z.
    alpha: Ridge strength, > 0.

  Returns:
    [d, d] matrix (alpha I + Z^T Z)^-1, in `batch_means`' dtype.
  """
  batch_means = _as_matrix(batch_means, 'batch_means')
  alpha = _positive_alpha(alpha)
  z = tf.cast(batch_means, tf.float64)
  num_batches = tf.shape(z)[0]

  def body(i, p):
    zi = z[i][:, tf.newaxis]
    u = tf.matmul(p, zi)
    return i + 1, p - tf.matmul(u, u, transpose_b=True) / (
        1.0 + tf.reduce_sum(zi * u))

  _, p = tf.while_loop(lambda i, p: i < num_batches, body,
                       (tf.constant(0),
                        tf.eye(tf.shape(z)[1], dtype=tf.float64) / alpha))
  return tf.cast(p, batch_means.dtype)


def closed_form_projection(batch_means: tf.Tensor,
                           alpha: Union[float, tf.Tensor]) -> tf.Tensor:
  """P = Z^T Z (alpha I + Z^T Z)^-1 with one d x d solve.

  Z^T Z and (alpha I + Z^T Z)^-1 commute, so this solves
  (alpha I + Z^T Z) P = Z^T Z by Cholesky (the system matrix is symmetric
  positive definite) and symmetrises the result. Runs in float64.

  Args:
    batch_means: [m, d] batch-mean features Z.
    alpha: Ridge strength, > 0.

  Returns:
    [d, d] projection, in `batch_means`' dtype.

  Raises:
    ValueError: As `recursive_projection`.
  """
  batch_means = _as_matrix(batch_means, 'batch_means')
  alpha = _positive_alpha(alpha)
  z = tf.cast(batch_means, tf.float64)
  gram = tf.matmul(z, z, transpose_a=True)
  system = gram + alpha * tf.eye(tf.shape(z)[1], dtype=tf.float64)
  p = tf.linalg.cholesky_solve(tf.linalg.cholesky(system), gram)
  return tf.cast(0.5 * (p + tf.transpose(p)), batch_means.dtype)


def _check_feature_dims(features: tf.Tensor, other: tf.Tensor,
                        other_name: str, other_rank: int) -> None:
  if features.shape.rank is not None and features.shape.rank != 2:
    raise ValueError(f'features must have shape [N, d], got {features.shape}.')
  if other.shape.rank is not None and other.shape.rank != other_rank:
    raise ValueError(f'{other_name} must have rank {other_rank}, got shape '
                     f'{other.shape}.')
  d = features.shape[-1] if features.shape.rank else None
  dims = other.shape[1:] if other.shape.rank else []
  if d is not None and any(e is not None and e != d for e in dims):
    raise ValueError(
        f'Feature dimension mismatch: features have shape {features.shape} '
        f'but {other_name} have shape {other.shape}.')


def projection_scores(features: tf.Tensor,
                      projections: tf.Tensor,
                      *,
                      epsilon: float = 1e-12) -> tf.Tensor:
  """r_{k,i} = cos(f_i, P_k f_i), the first line of eq. 6.

  Args:
    features: [N, d] server-sample features f_i.
    projections: [K, d, d] client projections P_k (cast to `features`'
      dtype).
    epsilon: Floor on ||f_i|| * ||P_k f_i||; a zero feature or a feature
      that P_k annihilates scores 0 instead of NaN.

  Returns:
    [K, N] cosines, in [0, 1] for symmetric positive semi-definite P_k.

  Raises:
    ValueError: If the static feature dimensions or ranks disagree.
  """
  features = tf.convert_to_tensor(features)
  projections = tf.convert_to_tensor(projections)
  _check_feature_dims(features, projections, 'projections', 3)
  projections = tf.cast(projections, features.dtype)
  projected = tf.einsum('kde,ne->knd', projections, features)
  dot = tf.einsum('nd,knd->kn', features, projected)
  norms = tf.norm(features, axis=-1) * tf.norm(projected, axis=-1)
  return dot / tf.maximum(norms, tf.cast(epsilon, features.dtype))


def _stateless_seed(seed: _Seed) -> tf.Tensor:
  seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
  if seed.shape.rank == 0:
    return tf.stack([seed, tf.constant(0, tf.int64)])
  return tf.ensure_shape(seed, [2])


def teacher_weights(scores: tf.Tensor,
                    strategy: str,
                    *,
                    seed: Optional[_Seed] = None,
                    epsilon: float = 1e-6) -> tf.Tensor:
  """Per-sample teacher weights from projection scores (eq. 6, Table 1).

  Every strategy returns weights that sum to 1 over the K teachers:

  * 'soft' (eq. 6): softmax over k of (r_k - mean_k r) / std_k r, where mean
    and std are taken over the K teachers of each sample and std is the
    population standard deviation (divide by K, as `var` in eq. 6). A sample
    whose scores have std <= `epsilon` (K = 1, or all teachers equally
    close) gets uniform weights rather than NaN. The standardisation makes
    the weights depend only on the ranks and relative gaps of the scores;
    with K = 2 the standardised scores are always +-1, so the weights are
    always 1 / (1 + e^-2) ~ 0.881 and 0.119 (or uniform).
  * 'onehot': 1 for the teacher with the largest score (the first on ties).
  * 'avg': 1/K each (FedDF's plain ensemble).
  * 'random': softmax over k of standard-normal noise drawn statelessly from
    `seed`, so the same seed gives the same weights.

  Args:
    scores: [K, N] scores r from `projection_scores`.
    strategy: One of 'soft', 'onehot', 'avg', 'random'.
    seed: 'random' only and required there: an int, a pair of ints, or an
      int tensor of shape [] or [2]; vary it per round or batch.
    epsilon: 'soft' only: std at or below which a sample is weighted
      uniformly. Scores are cosines in [0, 1], so this is absolute.

  Returns:
    [K, N] weights in `scores`' dtype.

  Raises:
    ValueError: If `strategy` is unknown, or 'random' has no seed.
  """
  if strategy not in STRATEGIES:
    raise ValueError(f'Unknown teacher weighting strategy {strategy!r}; '
                     f'valid strategies are {", ".join(STRATEGIES)}.')
  scores = tf.convert_to_tensor(scores)
  if scores.shape.rank is not None and scores.shape.rank != 2:
    raise ValueError(f'scores must have shape [K, N], got {scores.shape}.')
  dtype = scores.dtype
  num_teachers = tf.shape(scores)[0]
  if strategy == 'soft':
    mean, variance = tf.nn.moments(scores, axes=[0], keepdims=True)
    std = tf.sqrt(variance)
    spread = std > epsilon
    standardised = tf.where(
        spread, (scores - mean) / tf.where(spread, std, tf.ones_like(std)),
        tf.zeros_like(scores))
    return tf.nn.softmax(standardised, axis=0)
  if strategy == 'onehot':
    return tf.one_hot(tf.argmax(scores, axis=0), num_teachers, axis=0,
                      dtype=dtype)
  if strategy == 'avg':
    return tf.ones_like(scores) / tf.cast(num_teachers, dtype)
  if seed is None:
    raise ValueError("strategy 'random' needs a seed (int, pair of ints or "
                     'int tensor) for stateless, reproducible noise.')
  noise = tf.random.stateless_normal(tf.shape(scores), _stateless_seed(seed),
                                     dtype=dtype)
  return tf.nn.softmax(noise, axis=0)


def classify_by_projection(features: tf.Tensor,
                           projections: tf.Tensor) -> tf.Tensor:
  """Index of the projection each feature is closest to (Table 2).

  Args:
    features: [N, d] features.
    projections: [K, d, d] one projection per class (or domain).

  Returns:
    [N] int32 argmax_k cos(f_i, P_k f_i); the first index on ties.
  """
  return tf.argmax(projection_scores(features, projections), axis=0,
                   output_type=tf.int32)


def classify_by_prototype(features: tf.Tensor,
                          prototypes: tf.Tensor,
                          *,
                          metric: str = 'euclidean') -> tf.Tensor:
  """Index of the nearest prototype (Table 2's prototype-based baseline).

  The paper says only that the server picks the prototype (client mean
  feature) "most similar" to the test feature; the default is the nearest in
  Euclidean distance, and `metric='cosine'` picks the largest cosine instead.

  Args:
    features: [N, d] features.
    prototypes: [K, d] one mean feature per class (or domain), cast to
      `features`' dtype.
    metric: 'euclidean' or 'cosine'.

  Returns:
    [N] int32 index of the nearest prototype; the first index on ties.

  Raises:
    ValueError: If `metric` is unknown or the static feature dimensions
      disagree.
  """
  if metric not in ('euclidean', 'cosine'):
    raise ValueError(f"Unknown metric {metric!r}; valid metrics are "
                     f"euclidean, cosine.")
  features = tf.convert_to_tensor(features)
  prototypes = tf.convert_to_tensor(prototypes)
  _check_feature_dims(features, prototypes, 'prototypes', 2)
  prototypes = tf.cast(prototypes, features.dtype)
  if metric == 'cosine':
    similarity = tf.matmul(tf.math.l2_normalize(features, axis=-1),
                           tf.math.l2_normalize(prototypes, axis=-1),
                           transpose_b=True)
    return tf.argmax(similarity, axis=-1, output_type=tf.int32)
  # ||f - p||^2 up to the per-row constant ||f||^2.
  distance = (tf.reduce_sum(tf.square(prototypes), axis=-1)[tf.newaxis, :] -
              2.0 * tf.matmul(features, prototypes, transpose_b=True))
  return tf.argmin(distance, axis=-1, output_type=tf.int32)
