"""FedDF's pure-TF fusion maths, eagerly (no TFF context involved).

The same functions run inside the TFF process; tests/methods/feddf/test_feddf.py
checks that the process reproduces them.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.core import distill_hparams
from tff_kd.core import distillation
from tff_kd.methods.feddf import feddf_tf as feddf
from tff_kd.core import teachers as teachers_tf

ModelWeights = tff.learning.models.ModelWeights


def _np_softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _spec(*shape, dtype=tf.float32):
  return tf.TensorSpec(shape, dtype)


def test_avg_logits_target_is_softmax_of_mean_kept_logits():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 4)).astype(np.float32)
  kept = np.array([True, False, True])
  target = feddf.avg_logits_target(logits, kept)
  np.testing.assert_allclose(
      target, _np_softmax(logits[kept].mean(0)), rtol=1e-5, atol=1e-6)
  hot = feddf.avg_logits_target(logits, kept, temperature=2.0)
  np.testing.assert_allclose(
      hot, _np_softmax(logits[kept].mean(0) / 2.0), rtol=1e-5, atol=1e-6)


def test_teacher_count_mismatch_is_a_clear_error():
  with pytest.raises(errors.ConfigError,
                     match="teacher count mismatch: 3 teachers' logits but 2"):
    feddf.avg_logits_target(np.zeros((3, 5, 4), np.float32), [True, True])


def test_drop_worst_drops_a_random_guess_teacher():
  labels = np.array([0, 1, 2, 0, 1, 2])
  good = np.eye(3)[labels] * 5.0  # 100% accurate.
  constant = np.tile([5.0, 0.0, 0.0], (6, 1))  # 1/3 = random guess.
  logits = np.stack([good, constant, good, constant]).astype(np.float32)
  # Row 2 is a good model but holds no client this round.
  valid = np.array([True, True, False, True])
  selection = feddf.select_teachers(valid, logits, labels, drop_worst=True)
  np.testing.assert_array_equal(selection.kept, [True, False, False, False])
  np.testing.assert_allclose(selection.val_accuracy, [1, 1 / 3, 0, 1 / 3],
                             rtol=1e-6)
  kept_all = feddf.select_teachers(valid, logits, labels, drop_worst=False)
  np.testing.assert_array_equal(kept_all.kept, valid)
  # Every valid teacher at random guess: all valid ones are kept.
  only_bad = feddf.select_teachers([False, True, False, True], logits,
                                   labels, drop_worst=True)
  np.testing.assert_array_equal(only_bad.kept, [False, True, False, True])
  with pytest.raises(errors.ConfigError, match='validation set'):
    feddf.select_teachers(valid, None, None, drop_worst=True)


def _linear(kernel) -> tf.keras.Model:
  inputs = tf.keras.Input((kernel.shape[0],))
  return tf.keras.Model(inputs, tf.keras.layers.Dense(
      kernel.shape[1], use_bias=False,
      kernel_initializer=tf.keras.initializers.Constant(kernel))(inputs))


def test_fuse_distills_the_avg_logits_of_valid_teachers():
  rng = np.random.default_rng(1)
  g = rng.normal(size=(3, 4)).astype(np.float32)
  d = rng.normal(size=(3, 3, 4)).astype(np.float32)
  d[2] = 0.0  # An empty slot.
  pool = rng.normal(size=(32, 3)).astype(np.float32)
  # Not the average: for linear teachers AVGLOGITS equals the averaged
  # model's logits, so distilling into the average would have zero loss.
  start = ModelWeights([g + 0.2 * d[0]], [])
  proto = feddf.Prototype(
      student=_linear(g), teacher=_linear(g),
      global_weights=ModelWeights([g], []),
      deltas=ModelWeights([d], []),
      valid=tf.constant([True, True, False]), start_weights=start)
  config = distill_hparams.DistillConfig.plain(steps=20, batch_size=8, seed=3,
                                      eval_every=5)
  optimizer = tff.learning.optimizers.build_adam(0.05)
  result = feddf.fuse([proto], optimizer, pool, config)
  # The same distillation done by hand with the numpy AVGLOGITS target.
  target = _np_softmax(np.mean([pool @ (g + d[k]) for k in (0, 1)], 0))
  student = _linear(start.trainable[0])
  expected = distillation.distill(student, optimizer, pool, target, config)
  np.testing.assert_allclose(result.weights[0].trainable[0],
                             expected.weights.trainable[0], rtol=1e-4,
                             atol=1e-5)
  assert int(result.num_teachers) == 2 and int(result.teachers_kept) == 2
  assert int(result.distill[0].steps_run) == 20
  assert float(result.distill[0].last_loss) < float(
      result.distill[0].first_loss)
  assert float(result.distill_seconds) > 0
  # No validation set: the labeled links are not measured.
  assert float(result.links[0]['ensemble_labeled_accuracy']) == -1.0
  assert float(result.links[0]['labeled_accuracy_after']) == -1.0
  assert float(result.links[0]['target_entropy']) > 0


def test_pool_shape_mismatch_is_a_data_error():
  with pytest.raises(errors.DataError,
                     match=r'proxy dataset images have shape \(16, 16, 1\) '
                     r'but the model expects \(28, 28, 1\)'):
    teachers_tf.check_pool_shape((16, 16, 1), (28, 28, 1))
