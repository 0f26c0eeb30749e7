"""Golden numbers for FedD3A's projections, scores and teacher weights."""

import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.methods.fedd3a import projection_tf as projection


def _random_z(m: int, d: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).normal(size=(m, d)).astype(np.float32)


def _np_projection(z: np.ndarray, alpha: float) -> np.ndarray:
  """The paper's definition, Z^T (Z Z^T + alpha I)^-1 Z, in float64."""
  z = z.astype(np.float64)
  return z.T @ np.linalg.solve(z @ z.T + alpha * np.eye(len(z)), z)


def _domain_features(rng, n, axes, d=6, noise=0.01):
  """Non-negative features on `axes` (ReLU-like) plus small noise."""
  f = noise * rng.normal(size=(n, d))
  f[:, axes] += rng.uniform(0.2, 1.5, size=(n, len(axes)))
  return f.astype(np.float32)


# --- Batch means -------------------------------------------------------------


def test_batch_mean_features_keeps_partial_last_batch():
  f = np.arange(10, dtype=np.float32).reshape(5, 2)
  means = projection.batch_mean_features(f, 2)
  np.testing.assert_allclose(means, [[1, 2], [5, 6], [8, 9]])


def test_batch_mean_features_with_unknown_length():
  fn = tf.function(lambda f: projection.batch_mean_features(f, 3),
                   input_signature=[tf.TensorSpec([None, 2], tf.float32)])
  np.testing.assert_allclose(fn(np.ones((7, 2), np.float32)), np.ones((3, 2)))
  assert fn(np.zeros((0, 2), np.float32)).shape == (0, 2)


@pytest.mark.parametrize('batch_size', [0, -2, 1.5])
def test_batch_mean_features_rejects_bad_batch_size(batch_size):
  with pytest.raises(ValueError, match=str(batch_size)):
    projection.batch_mean_features(np.ones((4, 2), np.float32), batch_size)


def test_dataset_batch_means_uses_inference_mode_and_every_batch():
  x = np.random.default_rng(1).normal(size=(10, 3)).astype(np.float32)
  inputs = tf.keras.Input((3,))
  hidden = tf.keras.layers.Dense(4, activation='relu')(inputs)
  model = tf.keras.Model(inputs, tf.keras.layers.Dropout(0.9)(hidden))
  ds = tf.data.Dataset.from_tensor_slices(
      {'x': x, 'y': np.zeros(10, np.int32)}).batch(4)
  expected = projection.batch_mean_features(model(x, training=False), 4)
  np.testing.assert_allclose(projection.dataset_batch_means(model, ds),
                             expected, rtol=1e-6, atol=1e-6)
  # Tuples and a plain callable; an empty dataset gives [0, d].
  tuples = tf.data.Dataset.from_tensor_slices((x, x)).batch(5)
  np.testing.assert_allclose(
      projection.dataset_batch_means(lambda b: 2.0 * b, tuples),
      2.0 * np.stack([x[:5].mean(0), x[5:].mean(0)]), rtol=1e-6)
  empty = tf.data.Dataset.from_tensor_slices(x).take(0).batch(4)
  assert projection.dataset_batch_means(model, empty).shape == (0, 4)
  assert projection.dataset_batch_means(
      tf.identity, empty, feature_dim=3).shape == (0, 3)


# --- Projection matrices -----------------------------------------------------


@pytest.mark.parametrize('alpha', [0.1, 1.0, 10.0])
@pytest.mark.parametrize('m,d', [(5, 8), (20, 6)])
def test_recursive_equals_closed_form_and_paper_definition(alpha, m, d):
  z = _random_z(m, d, seed=m + d)
  recursive = projection.recursive_projection(z, alpha)
  closed = projection.closed_form_projection(z, alpha)
  expected = _np_projection(z, alpha)
  assert recursive.dtype == tf.float32 and recursive.shape == (d, d)
  scale = np.abs(expected).max()
  np.testing.assert_allclose(recursive, expected, rtol=1e-5, atol=1e-5 * scale)
  np.testing.assert_allclose(closed, expected, rtol=1e-5, atol=1e-5 * scale)
  p64 = projection.recursive_projection(z.astype(np.float64), alpha)
  np.testing.assert_allclose(
      p64, projection.closed_form_projection(z.astype(np.float64), alpha),
      rtol=1e-10, atol=1e-10)


def test_literal_eq5_is_the_projection_only_when_alpha_is_one():
  z = _random_z(7, 5).astype(np.float64)
  eye = np.eye(5)
  inverse = projection.recursive_inverse_gram(z, 1.0)
  np.testing.assert_allclose(inverse, np.linalg.inv(eye + z.T @ z), atol=1e-12)
  np.testing.assert_allclose(eye - inverse, _np_projection(z, 1.0),
                             atol=1e-10)
  alpha = 10.0
  inverse = projection.recursive_inverse_gram(z, alpha)
  p = projection.recursive_projection(z, alpha)
  np.testing.assert_allclose(eye - alpha * inverse, p, atol=1e-10)
  # The literal I - P^ is far from the projection for alpha != 1.
  assert np.abs((eye - inverse) - p).max() > 0.5


def test_small_alpha_projects_onto_the_span_of_the_batch_means():
  rng = np.random.default_rng(3)
  basis = np.linalg.qr(rng.normal(size=(6, 6)))[0]
  span, orth = basis[:, :3], basis[:, 3:]
  z = (rng.normal(size=(8, 3)) @ span.T).astype(np.float32)
  p = projection.recursive_projection(z, 1e-4).numpy()
  np.testing.assert_array_equal(p, p.T)
  for v in (span @ rng.normal(size=3), span[:, 0]):
    assert np.linalg.norm(p @ v - v) < 1e-3 * np.linalg.norm(v)
  for w in (orth @ rng.normal(size=3), orth[:, 2]):
    assert np.linalg.norm(p @ w) < 1e-5 * np.linalg.norm(w)
  eigenvalues = np.linalg.eigvalsh(p.astype(np.float64))
  assert eigenvalues.min() > -1e-6 and eigenvalues.max() < 1.0


def test_no_batches_gives_the_zero_projection():
  z = np.zeros((0, 3), np.float32)
  np.testing.assert_array_equal(projection.recursive_projection(z, 0.5),
                                np.zeros((3, 3)))
  np.testing.assert_array_equal(projection.closed_form_projection(z, 0.5),
                                np.zeros((3, 3)))


def test_recursive_projection_in_tf_function_with_unknown_batch_count():
  calls = []

  @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32),
                                tf.TensorSpec([], tf.float32)])
  def fn(z, alpha):
    calls.append(1)
    return projection.recursive_projection(z, alpha)

  for m in (3, 9):
    z = _random_z(m, 4, seed=m)
    np.testing.assert_allclose(fn(z, 0.5), _np_projection(z, 0.5), atol=1e-5)
  assert len(calls) == 1
  assert fn.get_concrete_function().structured_outputs.shape == (4, 4)
  with pytest.raises(tf.errors.InvalidArgumentError, match='alpha'):
    fn(_random_z(2, 4), -1.0)


def test_client_projection_in_a_tff_computation():
  """Batch means of a TFF sequence, then eq. 5, with no AutoGraph from TFF."""
  @tff.tensorflow.computation(
      tff.SequenceType(tff.TensorType(np.float32, [None, 3])))
  def client_projection(dataset):
    batch_means = projection.dataset_batch_means(lambda x: 2.0 * x, dataset)
    return projection.recursive_projection(batch_means, 0.5)

  x = _random_z(10, 3)
  z = 2.0 * np.stack([x[:4].mean(0), x[4:8].mean(0), x[8:].mean(0)])
  np.testing.assert_allclose(client_projection([x[:4], x[4:8], x[8:]]),
                             _np_projection(z, 0.5), atol=1e-5)


@pytest.mark.parametrize('alpha', [0.0, -1.0, float('nan')])
@pytest.mark.parametrize('fn', [projection.recursive_projection,
                                projection.closed_form_projection,
                                projection.recursive_inverse_gram])
def test_non_positive_alpha_is_rejected(fn, alpha):
  with pytest.raises(ValueError, match=f'alpha must be > 0, got {alpha}'):
    fn(_random_z(3, 2), alpha)


# --- Scores and weights ------------------------------------------------------


def test_projection_scores_hand_computed():
  x_axis = np.diag([1.0, 0.0])
  diagonal = np.full((2, 2), 0.5)  # Projection onto (1, 1) / sqrt(2).
  features = np.array([[1, 1], [0, 1], [0, 0], [3, 1]], np.float32)
  r = projection.projection_scores(
      features, np.stack([x_axis, diagonal]).astype(np.float32))
  # (1, 1): x-axis -> (1, 0), cos = 1/sqrt(2); it lies on the diagonal.
  # (0, 1): annihilated by the x-axis projection, scores 0 (not NaN).
  # (3, 1): x-axis -> (3, 0), cos = 3/sqrt(10); diagonal -> (2, 2),
  # cos = 8 / (sqrt(10) * 2 sqrt(2)) = 2/sqrt(5).
  expected = [[1 / math.sqrt(2), 0.0, 0.0, 3 / math.sqrt(10)],
              [1.0, 1 / math.sqrt(2), 0.0, 2 / math.sqrt(5)]]
  np.testing.assert_allclose(r, expected, rtol=1e-5, atol=1e-7)


def test_feature_dimension_mismatch_names_both_shapes():
  with pytest.raises(ValueError, match=r'\(3, 4\).*\(2, 5, 5\)'):
    projection.projection_scores(np.ones((3, 4), np.float32),
                                 np.ones((2, 5, 5), np.float32))
  with pytest.raises(ValueError, match=r'\(3, 4\).*\(2, 5\)'):
    projection.classify_by_prototype(np.ones((3, 4), np.float32),
                                     np.ones((2, 5), np.float32))


SCORES = np.array([[0.9, 0.2, 0.3], [0.5, 0.2, 0.8], [0.1, 0.2, 0.4]],
                  np.float32)


def test_soft_weights_are_eq6_and_uniform_without_spread():
  w = projection.teacher_weights(SCORES, 'soft').numpy()
  s = SCORES.astype(np.float64)
  with np.errstate(invalid='ignore'):  # Column 1 has std 0.
    standardised = (s - s.mean(0)) / s.std(0)  # Population std over teachers.
  standardised[:, 1] = 0.0  # Identical scores: guarded, uniform.
  expected = np.exp(standardised) / np.exp(standardised).sum(0)
  np.testing.assert_allclose(w, expected, rtol=1e-5)
  # Column 0 standardises to (sqrt(3/2), 0, -sqrt(3/2)).
  a = math.exp(math.sqrt(1.5))
  np.testing.assert_allclose(w[:, 0], np.array([a, 1, 1 / a]) / (a + 1 + 1 / a),
                             rtol=1e-5)
  np.testing.assert_allclose(w[:, 1], [1 / 3] * 3, rtol=1e-6)
  assert np.isfinite(w).all()
  np.testing.assert_allclose(w.sum(0), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(
      projection.teacher_weights(SCORES[:1], 'soft'), np.ones((1, 3)))


def test_onehot_and_avg_weights():
  onehot = projection.teacher_weights(SCORES, 'onehot').numpy()
  np.testing.assert_array_equal(onehot, [[1, 1, 0], [0, 0, 1], [0, 0, 0]])
  np.testing.assert_allclose(projection.teacher_weights(SCORES, 'avg'),
                             np.full((3, 3), 1 / 3), rtol=1e-7)


def test_random_weights_are_seeded_and_not_uniform():
  w1 = projection.teacher_weights(SCORES, 'random', seed=7).numpy()
  w2 = projection.teacher_weights(SCORES, 'random', seed=(7, 0)).numpy()
  w3 = projection.teacher_weights(SCORES, 'random', seed=8).numpy()
  np.testing.assert_array_equal(w1, w2)
  assert np.abs(w1 - w3).max() > 1e-3
  assert np.abs(w1 - 1 / 3).max() > 1e-2
  np.testing.assert_allclose(w1.sum(0), 1.0, rtol=1e-6)
  traced = tf.function(lambda s, seed: projection.teacher_weights(
      s, 'random', seed=seed))
  np.testing.assert_array_equal(traced(SCORES, tf.constant([7, 0])), w1)
  with pytest.raises(ValueError, match='seed'):
    projection.teacher_weights(SCORES, 'random')


def test_unknown_strategy_lists_the_valid_ones():
  with pytest.raises(ValueError,
                     match="'median'.*soft, onehot, avg, random"):
    projection.teacher_weights(SCORES, 'median')


def test_each_domain_picks_its_own_teacher():
  rng = np.random.default_rng(5)
  batch_means = [
      projection.batch_mean_features(_domain_features(rng, 64, axes), 8)
      for axes in ([0, 1], [2, 3])]
  # alpha sits between the batch means' energy off their domain (noise,
  # ~1e-4) and on it (>= 0.1), so P is near 0 off the domain.
  projections = tf.stack(
      [projection.recursive_projection(z, 0.1) for z in batch_means])
  server = np.concatenate([_domain_features(rng, 20, [0, 1]),
                           _domain_features(rng, 20, [2, 3])])
  owner = np.repeat([0, 1], 20)
  r = projection.projection_scores(server, projections).numpy()
  assert (r[owner, np.arange(40)] > 0.9).all()
  assert (r[1 - owner, np.arange(40)] < 0.3).all()
  soft = projection.teacher_weights(r, 'soft').numpy()
  assert (soft[owner, np.arange(40)] > 0.5).all()
  # With two teachers the standardised scores are always +-1.
  np.testing.assert_allclose(soft[owner, np.arange(40)],
                             1 / (1 + math.exp(-2)), rtol=1e-5)
  onehot = projection.teacher_weights(r, 'onehot').numpy()
  np.testing.assert_array_equal(onehot[owner, np.arange(40)], 1.0)


# --- Table 2: classification by projection or prototype ----------------------


def test_classification_by_projection_and_prototype():
  rng = np.random.default_rng(11)
  axes = ([0, 1], [2, 3], [4, 5])
  train = [_domain_features(rng, 40, a) for a in axes]
  projections = tf.stack([
      projection.recursive_projection(
          projection.batch_mean_features(f, 5), 0.01) for f in train])
  prototypes = np.stack([f.mean(0) for f in train])
  test = np.concatenate([_domain_features(rng, 10, a) for a in axes])
  labels = np.repeat([0, 1, 2], 10)
  by_projection = projection.classify_by_projection(test, projections)
  assert by_projection.dtype == tf.int32
  np.testing.assert_array_equal(by_projection, labels)
  np.testing.assert_array_equal(
      projection.classify_by_prototype(test, prototypes), labels)
  np.testing.assert_array_equal(
      projection.classify_by_prototype(test, prototypes, metric='cosine'),
      labels)


def test_projection_is_scale_invariant_where_prototypes_are_not():
  # Class 0 along e1 with norm 1, class 1 along e2 with norm 10: a short e2
  # vector is nearer prototype 0 but lies in class 1's subspace.
  prototypes = np.array([[1.0, 0.0], [0.0, 10.0]], np.float32)
  projections = tf.stack([
      projection.closed_form_projection(p[np.newaxis], 1e-3)
      for p in prototypes])
  test = np.array([[0.0, 0.1], [5.0, 0.0], [0.1, 8.0]], np.float32)
  np.testing.assert_array_equal(
      projection.classify_by_prototype(test, prototypes), [0, 0, 1])
  np.testing.assert_array_equal(
      projection.classify_by_projection(test, projections), [1, 0, 1])
