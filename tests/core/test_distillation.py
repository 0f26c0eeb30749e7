"""Golden numbers and behaviour of the shared server-side distillation."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.core import distill_hparams
from tff_kd.core import distillation


def _np_softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _dense(kernel, bias) -> tf.keras.Model:
  """A linear classifier with the given (fixed) initial weights."""
  inputs = tf.keras.Input((kernel.shape[0],))
  layer = tf.keras.layers.Dense(
      kernel.shape[1],
      kernel_initializer=tf.keras.initializers.Constant(kernel),
      bias_initializer=tf.keras.initializers.Constant(bias))
  return tf.keras.Model(inputs, layer(inputs))


def _global_norm(arrays):
  return float(np.sqrt(sum(np.sum(np.square(a)) for a in arrays)))


# K=2 teachers, N=2 samples, C=3 classes.
_LOGITS = np.array([[[1.0, 2.0, 0.0], [0.5, -1.0, 3.0]],
                    [[-2.0, 0.0, 1.0], [2.0, 2.0, -1.0]]], np.float32)
_WEIGHTS = np.array([[0.75, 0.1], [0.25, 0.9]], np.float32)


def test_weighted_ensemble_probs_matches_numpy():
  t = 2.0
  expected = np.zeros((2, 3))
  for k in range(2):
    for i in range(2):
      expected[i] += _WEIGHTS[k, i] * _np_softmax(_LOGITS[k, i] / t)
  got = distillation.weighted_ensemble(_LOGITS, _WEIGHTS, temperature=t)
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  np.testing.assert_allclose(np.sum(got, -1), [1.0, 1.0], rtol=1e-6)
  # Pinned by hand, sample 0 at T=1:
  # 0.75 * softmax(1, 2, 0) + 0.25 * softmax(-2, 0, 1).
  got_t1 = distillation.weighted_ensemble(_LOGITS, _WEIGHTS)
  np.testing.assert_allclose(
      got_t1[0],
      0.75 * np.array([0.24472847, 0.66524096, 0.09003057]) +
      0.25 * np.array([0.03511903, 0.25949646, 0.70538451]), rtol=1e-5)


def test_weighted_ensemble_logits_matches_numpy():
  t = 0.5
  expected = np.stack([
      _np_softmax((_WEIGHTS[0, i] * _LOGITS[0, i] +
                   _WEIGHTS[1, i] * _LOGITS[1, i]) / t) for i in range(2)
  ])
  got = distillation.weighted_ensemble(
      _LOGITS, _WEIGHTS, temperature=t, ensemble='logits')
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  # The two modes really differ on this input.
  probs = distillation.weighted_ensemble(_LOGITS, _WEIGHTS, temperature=t)
  assert np.abs(np.asarray(probs) - expected).max() > 0.05


def test_uniform_logits_ensemble_is_avglogits():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 5, 3)).astype(np.float32)
  uniform = np.full((4, 5), 0.25, np.float32)
  got = distillation.weighted_ensemble(logits, uniform, ensemble='logits')
  np.testing.assert_allclose(got, _np_softmax(logits.mean(0)), rtol=1e-5)


def test_weighted_ensemble_rejects_bad_input():
  with pytest.raises(ValueError, match=r'teacher count .* does not match '
                     r'weights \(3, 2\)'):
    distillation.weighted_ensemble(_LOGITS, np.ones((3, 2), np.float32))
  with pytest.raises(ValueError, match='pool size .* does not match weights'):
    distillation.weighted_ensemble(_LOGITS, np.ones((2, 5), np.float32))
  with pytest.raises(ValueError, match="unknown ensemble 'mean'"):
    distillation.weighted_ensemble(_LOGITS, _WEIGHTS, ensemble='mean')
  with pytest.raises(ValueError, match='temperature must be > 0'):
    distillation.weighted_ensemble(_LOGITS, _WEIGHTS, temperature=0.0)


def test_normalize_weights():
  raw = np.array([[1.0, 0.0, 3.0], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0]],
                 np.float32)
  got = distillation.normalize_weights(raw).numpy()
  np.testing.assert_allclose(got.sum(0), [1.0, 1.0, 1.0], rtol=1e-6)
  np.testing.assert_allclose(got[:, 0], [0.25, 0.75, 0.0], rtol=1e-6)
  np.testing.assert_allclose(got[:, 2], [0.75, 0.0, 0.25], rtol=1e-6)
  # An all-zero column is exactly uniform, and nothing is NaN/inf.
  np.testing.assert_array_equal(got[:, 1], np.full(3, 1 / 3, np.float32))
  assert np.all(np.isfinite(got))
  # Below eps also counts as zero.
  tiny = distillation.normalize_weights(np.full((2, 1), 1e-20, np.float32))
  np.testing.assert_array_equal(tiny, [[0.5], [0.5]])
  # A mask zeroes teachers; the fallback is uniform over the kept ones.
  masked = distillation.normalize_weights(raw, mask=[1, 0, 1]).numpy()
  np.testing.assert_allclose(masked[:, 0], [1.0, 0.0, 0.0])
  np.testing.assert_array_equal(masked[:, 1], [0.5, 0.0, 0.5])
  with pytest.raises(tf.errors.InvalidArgumentError, match='non-negative'):
    distillation.normalize_weights(np.array([[1.0], [-1.0]], np.float32))


def test_kd_loss_matches_numpy_kl_times_t_squared():
  t = 3.0
  student = np.array([[1.0, 0.0, -1.0], [0.2, 0.3, 2.0]], np.float32)
  target = np.array([[0.7, 0.3, 0.0], [0.1, 0.2, 0.7]], np.float32)
  q = _np_softmax(student / t)
  kl = [
      sum(p * np.log(p / qq) for p, qq in zip(pi, qi) if p > 0)
      for pi, qi in zip(target, q)
  ]
  expected = np.mean(kl) * t * t
  got = distillation.kd_loss(student, target, t)
  np.testing.assert_allclose(float(got), expected, rtol=1e-5)
  # Student == target gives zero loss.
  same = distillation.kd_loss(student, _np_softmax(student / t), t)
  assert abs(float(same)) < 1e-6
  # Zero target probabilities give finite gradients on both inputs.
  s = tf.constant(student)
  p = tf.constant(target)
  with tf.GradientTape() as tape:
    tape.watch([s, p])
    loss = distillation.kd_loss(s, p, t)
  for g in tape.gradient(loss, [s, p]):
    assert np.all(np.isfinite(g))


def test_drop_worst_drops_random_guessers():
  # C = 4 classes, M = 4 validation labels: random guessing is 1/4.
  labels = np.array([0, 1, 2, 3])
  good = np.eye(4, dtype=np.float32) * 5.0  # 4/4 correct.
  guesser = np.tile(np.eye(4, dtype=np.float32)[:1] * 5.0, (4, 1))  # 1/4.
  half = good.copy()
  half[2:] = np.roll(good[2:], 1, axis=1)  # 2/4 correct.
  raw = np.array([[1.0, 0.0], [1.0, 2.0], [3.0, 0.0]], np.float32)
  result = distillation.drop_worst(
      np.stack([good, guesser, half]), labels, raw)
  np.testing.assert_allclose(result.accuracies, [1.0, 0.25, 0.5])
  np.testing.assert_array_equal(result.kept, [True, False, True])
  # Column 0 renormalised without teacher 1; column 1 only had teacher 1's
  # score, so it falls back to uniform over the kept teachers.
  np.testing.assert_allclose(result.weights, [[0.25, 0.5], [0.0, 0.0],
                                              [0.75, 0.5]])
  # All at or below random guess: all are kept.
  everyone_bad = distillation.drop_worst(
      np.stack([guesser, guesser, guesser]), labels, raw)
  np.testing.assert_array_equal(everyone_bad.kept, [True, True, True])
  np.testing.assert_allclose(everyone_bad.weights,
                             distillation.normalize_weights(raw))


def test_student_converges_to_fixed_teacher():
  rng = np.random.default_rng(0)
  teacher = _dense(rng.normal(size=(4, 3)) * 2.0, rng.normal(size=3))
  student = _dense(np.zeros((4, 3)), np.zeros(3))
  x = rng.normal(size=(256, 4)).astype(np.float32)
  logits = distillation.teacher_logits([teacher, teacher], x, batch_size=100)
  np.testing.assert_allclose(logits[0], teacher(x), rtol=1e-6)
  targets = distillation.weighted_ensemble(logits, np.full((2, 256), 0.5))
  config = distill_hparams.DistillConfig.plain(
      steps=300, batch_size=32, eval_every=50, seed=1)
  result = distillation.distill(
      student, tff.learning.optimizers.build_adam(0.05), x, targets, config)
  assert int(result.steps_run) == 300
  assert float(result.best_val_loss) == distillation.NO_VALIDATION
  assert int(result.best_step) == -1
  assert float(result.last_loss) < 0.01 * float(result.first_loss)
  probs = tf.nn.softmax(student(x)).numpy()
  assert np.abs(probs - targets.numpy()).max() < 0.05
  # The returned weights are the student's.
  for w, v in zip(result.weights.trainable, student.trainable_weights):
    np.testing.assert_array_equal(w, v)


def test_callable_targets_match_precomputed_targets():
  rng = np.random.default_rng(1)
  teacher = _dense(rng.normal(size=(4, 3)), rng.normal(size=3))
  init = (rng.normal(size=(4, 3)) * 0.1, np.zeros(3))
  x = rng.normal(size=(40, 4)).astype(np.float32)
  config = distill_hparams.DistillConfig.plain(
      steps=12, batch_size=8, temperature=2.0, val_fraction=0.25,
      eval_every=4, patience=5, seed=3)
  opt = tff.learning.optimizers.build_sgdm(0.5)
  a, b = _dense(*init), _dense(*init)
  tensor_result = distillation.distill(
      a, opt, x, tf.nn.softmax(teacher(x) / 2.0), config)
  fn_result = distillation.distill(
      b, opt, x, lambda batch: tf.nn.softmax(teacher(batch) / 2.0), config)
  for u, v in zip(tensor_result.weights.trainable,
                  fn_result.weights.trainable):
    np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(tensor_result.best_val_loss,
                             fn_result.best_val_loss, rtol=1e-5)


def test_optimizer_state_continues_across_calls():
  rng = np.random.default_rng(6)
  x = rng.normal(size=(16, 4)).astype(np.float32)
  targets = _np_softmax(rng.normal(size=(16, 3))).astype(np.float32)
  student = _dense(np.zeros((4, 3)), np.zeros(3))
  opt = tff.learning.optimizers.build_adam(0.01)
  config = distill_hparams.DistillConfig.plain(steps=3, batch_size=4)
  first = distillation.distill(student, opt, x, targets, config)
  second = distillation.distill(student, opt, x, targets, config,
                                optimizer_state=first.optimizer_state)
  assert int(first.optimizer_state['step']) == 3
  assert int(second.optimizer_state['step']) == 6
  # The second call started from the first call's moments, not zeros.
  fresh = distillation.distill(_dense(*[w.numpy() for w in first.weights
                                        .trainable]), opt, x, targets, config)
  assert not np.allclose(fresh.weights.trainable[0],
                         second.weights.trainable[0])


def test_validation_split_is_seeded_and_disjoint():
  train, val = distillation.validation_split(20, 0.25, seed=7)
  assert len(val) == 5 and len(train) == 15
  np.testing.assert_array_equal(np.sort(np.concatenate([train, val])),
                                np.arange(20))
  again, _ = distillation.validation_split(20, 0.25, seed=7)
  np.testing.assert_array_equal(train, again)
  other, _ = distillation.validation_split(20, 0.25, seed=8)
  assert not np.array_equal(train, other)
  train, val = distillation.validation_split(20, 0.0, seed=7)
  np.testing.assert_array_equal(train, np.arange(20))
  assert len(val) == 0


def test_early_stopping_on_plateau():
  rng = np.random.default_rng(2)
  student = _dense(rng.normal(size=(4, 3)), np.zeros(3))
  x = rng.normal(size=(40, 4)).astype(np.float32)
  targets = _np_softmax(rng.normal(size=(40, 3))).astype(np.float32)
  config = distill_hparams.DistillConfig.plain(
      steps=1000, batch_size=8, val_fraction=0.25, eval_every=10,
      patience=4)
  # Learning rate 0 (overriding the optimiser's 1.0): the validation loss
  # never improves on the initial one.
  result = distillation.distill(
      student, tff.learning.optimizers.build_sgdm(1.0), x, targets, config,
      learning_rate=0.0)
  assert int(result.steps_run) == 40
  assert int(result.best_step) == 0
  assert float(result.best_val_loss) > 0
  assert float(result.optimizer_state['learning_rate']) == 0.0


@pytest.mark.parametrize('steps', [7, 23])  # < eval_every; not a multiple.
def test_the_steps_after_the_last_validation_are_kept_when_better(steps):
  rng = np.random.default_rng(4)
  init = (rng.normal(size=(4, 3)), np.zeros(3))
  x = rng.normal(size=(40, 4)).astype(np.float32)
  # Targets the student can fit: every step lowers the validation loss.
  targets = _np_softmax(x @ rng.normal(size=(4, 3))).astype(np.float32)
  config = distill_hparams.DistillConfig.plain(
      steps=steps, batch_size=8, val_fraction=0.25, eval_every=10,
      patience=4, seed=3, cosine_decay=False)
  optimizer = tff.learning.optimizers.build_sgdm(0.5)
  eager = distillation.distill(_dense(*init), optimizer, x, targets, config)

  @tff.tensorflow.computation(tff.TensorType(np.float32, [40, 4]),
                              tff.TensorType(np.float32, [40, 3]))
  def distill_in_tff(pool, probs):
    result = distillation.distill(_dense(*init), optimizer, pool, probs,
                                  config)
    return result.weights.trainable, result.best_step

  tff_weights, tff_best = distill_in_tff(x, targets)
  assert int(eager.steps_run) == steps
  assert int(eager.best_step) == steps == int(tff_best)
  assert not np.allclose(eager.weights.trainable[0], init[0])
  np.testing.assert_allclose(tff_weights[0], eager.weights.trainable[0],
                             rtol=1e-5, atol=1e-6)


def test_early_stopping_restores_best_weights():
  rng = np.random.default_rng(3)
  init = (rng.normal(size=(4, 3)), rng.normal(size=3))
  student = _dense(*init)
  x = rng.normal(size=(40, 4)).astype(np.float32)
  config = distill_hparams.DistillConfig.plain(
      steps=100, batch_size=10, val_fraction=0.25, eval_every=5, patience=3,
      seed=11)
  train_idx, val_idx = distillation.validation_split(40, 0.25, config.seed)
  # Validation targets are the initial student's own predictions (loss 0);
  # training targets pull it elsewhere, so every later validation is worse.
  targets = tf.nn.softmax(student(x)).numpy()
  targets[train_idx.numpy()] = np.eye(3, dtype=np.float32)[0]
  result = distillation.distill(
      student, tff.learning.optimizers.build_sgdm(0.5), x, targets, config)
  assert int(result.steps_run) == 15  # patience * eval_every < steps.
  assert int(result.best_step) == 0
  assert abs(float(result.best_val_loss)) < 1e-6
  # Training moved the student (the loss went down), yet it was restored.
  assert float(result.last_loss) < float(result.first_loss)
  np.testing.assert_allclose(student.trainable_weights[0], init[0],
                             rtol=1e-6)
  np.testing.assert_allclose(student.trainable_weights[1], init[1],
                             rtol=1e-6)
  np.testing.assert_allclose(result.weights.trainable[0], init[0], rtol=1e-6)


def test_gradient_clipping_bounds_the_step():
  rng = np.random.default_rng(4)
  x = rng.normal(size=(16, 4)).astype(np.float32) * 3.0
  targets = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 16)]
  deltas = {}
  for clip in (0.0, 1e-3):
    student = _dense(np.zeros((4, 3)), np.zeros(3))
    config = distill_hparams.DistillConfig.plain(steps=1, batch_size=16,
                                        clip_norm=clip)
    distillation.distill(student, tff.learning.optimizers.build_sgdm(1.0),
                         x, targets, config)
    deltas[clip] = [v.numpy() for v in student.trainable_weights]
  unclipped = _global_norm(deltas[0.0])
  assert unclipped > 0.1
  np.testing.assert_allclose(_global_norm(deltas[1e-3]), 1e-3, rtol=1e-4)
  # Clipping rescales the whole gradient: same direction.
  for c, u in zip(deltas[1e-3], deltas[0.0]):
    np.testing.assert_allclose(c, u * 1e-3 / unclipped, rtol=1e-4,
                               atol=1e-9)


@pytest.mark.parametrize('training', [True, False])
def test_batchnorm_mode(training):
  inputs = tf.keras.Input((2,))
  h = tf.keras.layers.BatchNormalization(momentum=0.0)(inputs)
  student = tf.keras.Model(inputs, tf.keras.layers.Dense(2)(h))
  x = np.array([[1.0, 3.0], [3.0, 5.0]], np.float32)
  config = distill_hparams.DistillConfig.plain(
      steps=1, batch_size=2, student_training=training)
  distillation.distill(student, tff.learning.optimizers.build_sgdm(0.0), x,
                       np.full((2, 2), 0.5, np.float32), config)
  moving_mean = student.non_trainable_weights[0].numpy()
  # momentum 0: training mode copies the batch mean; inference mode keeps 0.
  np.testing.assert_allclose(moving_mean, [2.0, 4.0] if training else [0, 0])


def test_default_mode_keeps_the_student_statistics_on_another_domain():
  """An out-of-domain pool must not replace the student's statistics.

  The default (student_training=False) trains the student in inference
  mode: its BatchNorm statistics stay the averaged model's; FedDF's code
  mode (True) would make them the pool's.
  """
  inputs = tf.keras.Input((2,))
  h = tf.keras.layers.BatchNormalization(momentum=0.5)(inputs)
  student = tf.keras.Model(inputs, tf.keras.layers.Dense(3)(h))
  mean, var = student.non_trainable_weights
  mean.assign([0.1, -0.2])  # The clients' domain.
  var.assign([1.0, 2.0])
  pool = np.random.default_rng(0).normal(5.0, 3.0, (64, 2)).astype(
      np.float32)  # Another domain.
  targets = np.full((64, 3), 1 / 3, np.float32)
  config = distill_hparams.DistillConfig.plain(steps=20, batch_size=16)
  assert not config.student_training
  result = distillation.distill(
      student, tff.learning.optimizers.build_adam(1e-2), pool, targets,
      config)
  np.testing.assert_array_equal(mean.numpy(),
                                np.float32([0.1, -0.2]))
  np.testing.assert_array_equal(var.numpy(), np.float32([1.0, 2.0]))
  np.testing.assert_array_equal(result.weights.non_trainable[0],
                                np.float32([0.1, -0.2]))


def test_mean_reduction_divides_by_the_number_of_classes():
  student = np.array([[1.0, 0.0, -1.0], [0.2, 0.3, 2.0]], np.float32)
  target = np.array([[0.7, 0.3, 0.0], [0.1, 0.2, 0.7]], np.float32)
  batchmean = float(distillation.kd_loss(student, target, 2.0))
  mean = float(distillation.kd_loss(student, target, 2.0, 'mean'))
  assert mean == pytest.approx(batchmean / 3, rel=1e-6)
  # With SGD the step is C times smaller (FedFTG's reference scaling).
  deltas = {}
  for reduction in ('batchmean', 'mean'):
    model = _dense(np.zeros((3, 3)), np.zeros(3))
    distillation.distill(
        model, tff.learning.optimizers.build_sgdm(0.1), student, target,
        distill_hparams.DistillConfig.plain(steps=1, batch_size=2,
                                   kl_reduction=reduction))
    deltas[reduction] = model.trainable_weights[0].numpy()
  np.testing.assert_allclose(deltas['mean'], deltas['batchmean'] / 3,
                             rtol=1e-5)


def _labeled_problem(seed):
  """A student, a pool whose targets contradict the labeled set."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(64, 4)).astype(np.float32)
  w = rng.normal(size=(4, 3)).astype(np.float32)
  labels = np.argmax(x @ w, -1).astype(np.int32)
  student = _dense(w, np.zeros(3))  # Starts right on the labeled set.
  wrong = np.eye(3, dtype=np.float32)[(labels + 1) % 3]
  return student, x, wrong, (x[:32], labels[:32]), w


def test_accept_no_worse_keeps_the_initial_student_when_accuracy_drops():
  student, x, wrong, labeled, w = _labeled_problem(0)
  config = distill_hparams.DistillConfig.plain(steps=30, batch_size=16,
                                      accept='no_worse')
  result = distillation.distill(
      student, tff.learning.optimizers.build_sgdm(1.0), x, wrong, config,
      labeled=labeled)
  assert float(result.labeled_accuracy_before) == 1.0
  assert float(result.accepted) == 0.0
  assert float(result.labeled_accuracy_after) == 1.0
  np.testing.assert_array_equal(student.trainable_weights[0].numpy(), w)
  # 'always' keeps the (worse) distilled student and reports the drop.
  student, x, wrong, labeled, _ = _labeled_problem(0)
  result = distillation.distill(
      student, tff.learning.optimizers.build_sgdm(1.0), x, wrong,
      config.replace(accept='always'), labeled=labeled)
  assert float(result.accepted) == 1.0
  assert float(result.labeled_accuracy_after) < 0.5


def test_labeled_early_stopping_restores_the_best_student():
  student, x, wrong, labeled, w = _labeled_problem(1)
  config = distill_hparams.DistillConfig.plain(steps=200, batch_size=16,
                                      validation='labeled', eval_every=5,
                                      patience=3)
  result = distillation.distill(
      student, tff.learning.optimizers.build_sgdm(1.0), x, wrong, config,
      labeled=labeled)
  # The labeled cross-entropy only rises: stop after 3 evaluations, keep
  # the initial student.
  assert int(result.steps_run) == 15 and int(result.best_step) == 0
  np.testing.assert_allclose(student.trainable_weights[0].numpy(), w,
                             rtol=1e-6)


@pytest.mark.parametrize('given', [True, False])
def test_auto_validation_is_labeled_where_given_else_the_pool(given):
  # FedDF's recipe: early stopping on the labeled images when the server
  # step has them, on the held-out pool otherwise.
  runs = {}
  for validation in ('auto', 'labeled' if given else 'pool'):
    student, x, wrong, labeled, _ = _labeled_problem(1)
    config = distill_hparams.DistillConfig.plain(
        steps=60, batch_size=16, validation=validation, eval_every=5,
        patience=3, val_fraction=0.25)
    result = distillation.distill(
        student, tff.learning.optimizers.build_sgdm(1.0), x, wrong, config,
        labeled=labeled if given else None)
    runs[validation] = (int(result.steps_run), int(result.best_step),
                        student.trainable_weights[0].numpy())
  (auto_steps, auto_best, auto_w), (steps, best, w) = runs.values()
  assert (auto_steps, auto_best) == (steps, best)
  np.testing.assert_array_equal(auto_w, w)
  if given:  # The labeled loss only rises: the initial student is kept.
    assert auto_best == 0


def test_labeled_modes_need_the_labeled_set():
  student, x, wrong, _, _ = _labeled_problem(2)
  for config in (distill_hparams.DistillConfig.plain(validation='labeled'),
                 distill_hparams.DistillConfig.plain(accept='no_worse')):
    with pytest.raises(errors.ConfigError, match='labeled server validation'):
      distillation.distill(student, tff.learning.optimizers.build_sgdm(1.0),
                           x, wrong, config)


def test_distill_inside_tff_computation_matches_eager():
  n, d, c = 32, 4, 3
  rng = np.random.default_rng(5)
  init = (rng.normal(size=(d, c)).astype(np.float32), np.zeros(c, np.float32))
  x = rng.normal(size=(n, d)).astype(np.float32)
  targets = _np_softmax(rng.normal(size=(n, c)) / 2.0).astype(np.float32)
  config = distill_hparams.DistillConfig.plain(
      steps=200, batch_size=8, temperature=2.0, clip_norm=1.0,
      val_fraction=0.25, eval_every=5, patience=2, seed=9, cosine_decay=True)
  optimizer = tff.learning.optimizers.build_adam(0.05)

  @tff.tensorflow.computation(tff.TensorType(np.float32, [n, d]),
                              tff.TensorType(np.float32, [n, c]))
  def distill_in_tff(pool, probs):
    result = distillation.distill(_dense(*init), optimizer, pool, probs,
                                  config)
    return (result.weights.trainable, result.steps_run, result.best_val_loss,
            result.best_step)

  tff_weights, tff_steps, tff_val, tff_best = distill_in_tff(x, targets)
  eager = distillation.distill(_dense(*init), optimizer, x, targets, config)
  # Early stopping fired (and so every branch of the loop ran) in both.
  assert 0 < int(tff_steps) < config.steps
  assert int(tff_steps) == int(eager.steps_run)
  assert int(tff_best) == int(eager.best_step) > 0
  np.testing.assert_allclose(tff_val, eager.best_val_loss, rtol=1e-5)
  for u, v in zip(tff_weights, eager.weights.trainable):
    np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)
  assert not np.allclose(tff_weights[0], init[0])


@pytest.mark.parametrize('field,value,message', [
    ('steps', 0, 'distill.steps must be an integer >= 1, got 0'),
    ('batch_size', -1, 'batch_size must be an integer >= 1, got -1'),
    ('temperature', 0.0, 'temperature must be a finite number > 0, got 0.0'),
    ('clip_norm', -5.0, 'clip_norm must be a finite number >= 0'),
    ('val_fraction', 1.0, r'val_fraction must be in \[0, 1\), got 1.0'),
    ('eval_every', 0, 'eval_every must be an integer >= 1, got 0'),
    ('patience', 0, 'patience must be an integer >= 1, got 0'),
    ('steps', 2.5, 'steps must be an integer >= 1, got 2.5'),
    ('validation', 'test', "validation 'test' is unknown"),
    ('accept', 'better', "accept 'better' is unknown"),
    ('kl_reduction', 'sum', "kl_reduction 'sum' is unknown"),
])
def test_config_validation(field, value, message):
  # A section is checked when it is made.
  with pytest.raises(errors.ConfigError, match=message):
    distill_hparams.DistillConfig().replace(**{field: value})
  distill_hparams.DistillConfig().validate()


def test_distill_rejects_bad_input_before_compute():
  student = _dense(np.ones((4, 3)), np.zeros(3))
  opt = tff.learning.optimizers.build_sgdm(1.0)
  x = np.ones((8, 4), np.float32)
  targets = np.full((8, 3), 1 / 3, np.float32)
  with pytest.raises(ValueError, match='steps must be an integer >= 1, got 0'):
    distillation.distill(student, opt, x, targets,
                         distill_hparams.DistillConfig.plain(steps=0))
  with pytest.raises(ValueError, match=r'per-example shape \(5,\) does not '
                     r"match the student's input shape \(4,\)"):
    distillation.distill(student, opt, np.ones((8, 5), np.float32), targets,
                         distill_hparams.DistillConfig.plain())
  with pytest.raises(ValueError, match='pool is empty'):
    distillation.distill(student, opt, np.ones((0, 4), np.float32),
                         targets[:0], distill_hparams.DistillConfig.plain())
  with pytest.raises(ValueError, match=r'targets \(7, 3\) do not match'):
    distillation.distill(student, opt, x, targets[:7],
                         distill_hparams.DistillConfig.plain())
  with pytest.raises(ValueError, match="student's 3 outputs"):
    distillation.distill(student, opt, x, np.ones((8, 4), np.float32),
                         distill_hparams.DistillConfig.plain())
  with pytest.raises(ValueError, match='does not match teacher 0'):
    distillation.teacher_logits([student], np.ones((8, 5), np.float32))
  np.testing.assert_array_equal(student.trainable_weights[0], np.ones((4, 3)))
