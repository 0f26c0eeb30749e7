"""Golden numbers and behaviour of FedGen's and FedFTG's pure-TF pieces."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import data_free
from tff_kd.core import distillation
from tff_kd.methods.fedftg import fedftg_tf as fedftg
from tff_kd.methods.fedgen import fedgen_tf as fedgen
from tff_kd.methods.fedgen import hparams as fedgen_hparams
from tff_kd.models import classifiers
from tff_kd.models import generators


def _np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


# K=2 clients, C=3 classes; nobody holds class 1.
_COUNTS = np.array([[3, 0, 0], [1, 0, 5]], np.float32)
_LABELS = np.array([0, 2, 1])
_LOGITS = np.array([[[2.0, 0.0, -1.0], [0.5, 0.5, 1.0], [0.0, 3.0, 0.0]],
                    [[-1.0, 1.0, 0.0], [0.0, -2.0, 2.0], [1.0, 1.0, 1.0]]],
                   np.float32)


def test_label_weights_guard_a_class_nobody_holds():
  w = data_free.label_weights(_COUNTS).numpy()
  np.testing.assert_allclose(w, [[0.75, 0.5, 0.0], [0.25, 0.5, 1.0]])
  np.testing.assert_array_equal(fedftg.class_ensemble_weights(_COUNTS), w)
  np.testing.assert_array_equal(data_free.qualified_labels(_COUNTS),
                                [True, False, True])
  np.testing.assert_array_equal(
      data_free.qualified_labels([[1, 0, 2]]), [False, False, True])


def test_teacher_loss_matches_hand_computation():
  ce = -np.take_along_axis(_np_log_softmax(_LOGITS),
                           np.broadcast_to(_LABELS[None, :, None], (2, 3, 1)),
                           -1)[..., 0]  # [K, B]
  # Sample 0 (class 0): .75 / .25; sample 1 (class 2): 0 / 1; sample 2
  # (class 1, no counts): uniform .5 / .5.
  expected = np.mean([.75 * ce[0, 0] + .25 * ce[1, 0], ce[1, 1],
                      .5 * ce[0, 2] + .5 * ce[1, 2]])
  got = fedgen.teacher_loss(_LOGITS, _LABELS, _COUNTS)
  assert float(got) == pytest.approx(expected, rel=1e-6)
  mixed = np.stack([.75 * _LOGITS[0, 0] + .25 * _LOGITS[1, 0], _LOGITS[1, 1],
                    .5 * _LOGITS[0, 2] + .5 * _LOGITS[1, 2]])
  expected_logits = -np.mean(_np_log_softmax(mixed)[np.arange(3), _LABELS])
  got_logits = fedgen.teacher_loss(_LOGITS, _LABELS, _COUNTS,
                                   ensemble='logits')
  assert float(got_logits) == pytest.approx(expected_logits, rel=1e-6)
  assert abs(expected - expected_logits) > 0.05
  with pytest.raises(ValueError, match='ensemble'):
    fedgen.teacher_loss(_LOGITS, _LABELS, _COUNTS, ensemble='max')


def test_diversity_loss_golden_on_three_points():
  noise = np.array([[0, 0], [1, 0], [0, 2]], np.float32)
  feats = np.array([[0, 0, 0], [1, 1, 1], [2, 0, 2]], np.float32)
  # Noise distances (mean squared) .5, 2, 2.5; feature distances (mean l1)
  # 1, 4/3, 1; exp(-2 (.5 + 8/3 + 2.5) / 9).
  expected = np.exp(-2 * (0.5 + 8 / 3 + 2.5) / 9)
  assert expected == pytest.approx(0.2838642184327271)
  assert float(data_free.diversity_loss(noise, feats)) == pytest.approx(
      expected, rel=1e-6)
  # Identical samples: no diversity, loss 1.
  assert float(data_free.diversity_loss(noise, np.ones((3, 3)))) == 1.0
  # Images are flattened.
  assert float(data_free.diversity_loss(
      noise, feats.reshape(3, 3, 1, 1))) == pytest.approx(expected, rel=1e-6)
  l2 = np.exp(-2 * (0.5 * 1 + 2 * (8 / 3) + 2.5 * 1) / 9)
  assert float(data_free.diversity_loss(noise, feats, metric='l2')) == (
      pytest.approx(l2, rel=1e-6))


def test_generator_step_learns_the_heads_labels():
  rng = np.random.default_rng(0)
  kernels = tf.constant(rng.normal(size=(2, 8, 3)), tf.float32)
  biases = tf.zeros([2, 3])
  counts = tf.constant([[5, 5, 0], [0, 5, 5]], tf.float32)
  gen = generators.build_feature_generator(
      noise_dim=4, num_classes=3, feature_dim=8, hidden=16, seed=0)
  adam = tff.learning.optimizers.build_adam(learning_rate=1e-2)
  state = adam.initialize(
      tuple(tf.TensorSpec(v.shape, v.dtype) for v in gen.trainable_weights))

  @tf.function
  def step(state, seed):
    return fedgen.generator_step(
        gen, lambda z: fedgen.linear_heads_logits(z, kernels, biases), counts,
        adam, state, seed=seed, hparams=fedgen_hparams.FedGenHparams(
            generator_batch_size=32, noise_dim=4))

  results = []
  for i in range(50):
    r = step(state, tf.constant([i, 0]))
    state = r.optimizer_state
    results.append(r)
  first = np.mean([float(r.teacher_loss) for r in results[:5]])
  last = np.mean([float(r.teacher_loss) for r in results[-5:]])
  assert last < 0.5 * first
  assert float(results[-1].teacher_accuracy) > float(
      results[0].teacher_accuracy)
  assert float(results[-1].teacher_accuracy) >= 0.9
  for r in results:
    assert float(r.loss) == pytest.approx(
        float(r.teacher_loss) + float(r.diversity), rel=1e-5)
    assert 0 < float(r.diversity) <= 1


def test_regularized_local_loss_terms():
  clf = classifiers.build_classifier('cnn', input_shape=(8, 8, 1),
                                     num_classes=3, seed=0)
  gen = generators.build_feature_generator(
      noise_dim=4, num_classes=3, feature_dim=clf.feature_dim, hidden=8,
      seed=1, output_activation='relu')
  x = tf.random.stateless_uniform([6, 8, 8, 1], [1, 1], minval=-1)
  y = tf.constant([0, 1, 2, 0, 1, 2])
  probs = tf.constant([1.0, 1.0, 0.0])
  kwargs = dict(label_probs=probs, seed=[3, 4], training=False,
                hparams=fedgen_hparams.FedGenHparams(noise_dim=4,
                                                     local_gen_batch_size=6))
  batch = {'x': x, 'y': y}
  with tf.GradientTape() as tape:
    terms = fedgen.regularized_local_loss(
        clf, gen, batch, coefficients=fedgen.Coefficients(1.0, 2.0), **kwargs)
  grads = tape.gradient(terms.total, gen.trainable_weights + [
      clf.head.trainable_weights[0]])
  assert all(g is None for g in grads[:-1])  # The generator is frozen.
  assert grads[-1] is not None
  ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=y, logits=clf.model(x, training=False)))
  assert float(terms.ce) == pytest.approx(float(ce), rel=1e-6)
  assert float(terms.total) == pytest.approx(
      float(terms.ce + terms.teacher + terms.latent), rel=1e-6)
  assert float(terms.teacher) > 0 and float(terms.latent) > 0
  double = fedgen.regularized_local_loss(
      clf, gen, batch, coefficients=fedgen.Coefficients(2.0, 0.0), **kwargs)
  assert float(double.teacher) == pytest.approx(2 * float(terms.teacher),
                                                rel=1e-6)
  assert float(double.latent) == 0.0
  assert float(fedgen.decayed_coefficient(10.0, 5)) == pytest.approx(
      9.039207968, rel=1e-6)
  assert float(fedgen.decayed_coefficient(10.0, 1000)) == pytest.approx(1e-4)


def test_fedftg_label_sampling_follows_global_counts():
  counts = np.array([[30, 0, 10, 0], [30, 0, 30, 0]], np.float32)
  labels = fedftg.customized_label_sampling(counts, 20000, seed=3).numpy()
  freq = np.bincount(labels, minlength=4) / 20000
  np.testing.assert_allclose(freq, [0.6, 0.0, 0.4, 0.0], atol=0.015)
  np.testing.assert_array_equal(
      labels[:50], fedftg.customized_label_sampling(counts, 50, seed=3))
  uniform = fedftg.customized_label_sampling(np.zeros((2, 4)), 8000, seed=1)
  np.testing.assert_allclose(np.bincount(uniform.numpy(), minlength=4) / 8000,
                             0.25, atol=0.03)


def test_fedftg_class_weighted_teacher():
  teacher = fedftg.class_weighted_teacher(_LOGITS, _LABELS, _COUNTS)
  alpha = np.array([[.75, 0.0, .5], [.25, 1.0, .5]], np.float32)
  expected = distillation.weighted_ensemble(_LOGITS, alpha, ensemble='logits')
  np.testing.assert_allclose(teacher, expected, rtol=1e-6)


def test_fedftg_hard_sample_loss_golden():
  student = np.array([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]], np.float32)
  teacher = np.array([[0.7, 0.2, 0.1], [0.5, 0.3, 0.2]], np.float32)
  labels = np.array([0, 2])
  fidelity = -(np.log(0.7) + np.log(0.2)) / 2
  log_q = _np_log_softmax(student)
  kl = np.sum(teacher * (np.log(teacher) - log_q), -1)
  # Sample 0: both argmax 0 (kept); sample 1: student 1, teacher 0 (masked).
  transfer = kl[0] / 2
  got = fedftg.hard_sample_generator_loss(student, teacher, labels,
                                          transfer_weight=0.5,
                                          diversity_weight=0.0)
  assert float(got.fidelity) == pytest.approx(fidelity, rel=1e-6)
  assert float(got.transfer) == pytest.approx(transfer, rel=1e-5)
  assert float(got.loss) == pytest.approx(fidelity - 0.5 * transfer, rel=1e-5)
  unmasked = fedftg.hard_sample_generator_loss(student, teacher, labels,
                                               mask='none')
  assert float(unmasked.transfer) == pytest.approx(kl.mean(), rel=1e-5)
  noise = np.array([[0.0], [1.0]], np.float32)
  samples = np.zeros((2, 2, 2, 1), np.float32)
  samples[1] = 1.0
  full = fedftg.hard_sample_generator_loss(student, teacher, labels,
                                           noise=noise, samples=samples)
  # Noise distance 1, sample distance 1 on the 2 off-diagonal pairs of 4.
  assert float(full.diversity) == pytest.approx(np.exp(-0.5), rel=1e-6)
  assert float(full.loss) == pytest.approx(
      fidelity - transfer + np.exp(-0.5), rel=1e-5)
  with pytest.raises(ValueError, match='noise and samples'):
    fedftg.hard_sample_generator_loss(student, teacher, labels, noise=noise)
