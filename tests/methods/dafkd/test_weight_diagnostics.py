"""Golden numbers of the teacher-weight diagnostics against plain numpy."""

import numpy as np
import pytest

from tff_kd.methods.dafkd import weight_diagnostics as wd

# Three teachers (row 2 is an empty stack slot), four samples, three classes.
COUNTS = np.array([[90, 10, 0], [0, 50, 50], [0, 0, 0]], np.float32)
VALID = np.array([True, True, False])
LABELS = np.array([0, 1, 2, 0], np.int32)
ALPHA = np.array([[0.9, 0.3, 0.2, 0.5],
                  [0.1, 0.7, 0.8, 0.5],
                  [0.0, 0.0, 0.0, 0.0]], np.float32)
LOGITS = np.random.default_rng(0).normal(size=(3, 4, 3)).astype(np.float32)


def _softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_holders_follow_label_shares():
  shares = wd.label_shares(COUNTS).numpy()
  np.testing.assert_allclose(shares[0], [0.9, 0.1, 0.0], rtol=1e-6)
  np.testing.assert_allclose(shares[2], [0, 0, 0])
  h = wd.holders(shares, LABELS, VALID, share=0.2).numpy()
  # Teacher 0 holds label 0 only (10% of label 1 is below 0.2); teacher 1
  # holds labels 1 and 2; the empty slot holds nothing.
  np.testing.assert_array_equal(h, [[1, 0, 0, 1], [0, 1, 1, 0], [0, 0, 0, 0]])


def test_weight_diagnostics_match_numpy():
  h = wd.holders(wd.label_shares(COUNTS), LABELS, VALID, 0.2)
  d = wd.weight_diagnostics(ALPHA, LOGITS, LABELS, h, VALID)
  holder = h.numpy().astype(float)
  # Every sample has exactly one holder of the two teachers: informative.
  mass = (ALPHA * holder).sum(0)
  assert float(d.holder_mass) == pytest.approx(mass.mean())
  assert float(d.uniform_holder_mass) == pytest.approx(0.5)
  assert float(d.holder_ratio) == pytest.approx(mass.mean() / 0.5)
  assert float(d.informative_fraction) == 1.0
  probs = _softmax(LOGITS)[:2]
  weighted = np.einsum('kn,knc->nc', ALPHA[:2], probs)
  uniform = probs.mean(0)
  oracle = np.einsum('kn,knc->nc', holder[:2], probs)  # One holder each.
  for got, ens in ((d.accuracy_weighted, weighted),
                   (d.accuracy_uniform, uniform),
                   (d.accuracy_oracle, oracle)):
    assert float(got) == pytest.approx(np.mean(ens.argmax(-1) == LABELS))
  for got, ens in ((d.label_mass_weighted, weighted),
                   (d.label_mass_uniform, uniform)):
    assert float(got) == pytest.approx(ens[np.arange(4), LABELS].mean(),
                                       rel=1e-5)


def test_uniform_weights_have_ratio_one_and_samples_without_holders_drop():
  h = wd.holders(wd.label_shares(COUNTS), np.array([0, 1, 2, 1]), VALID, 0.6)
  uniform = np.array([[0.5] * 4, [0.5] * 4, [0.0] * 4], np.float32)
  d = wd.weight_diagnostics(uniform, LOGITS, np.array([0, 1, 2, 1]), h, VALID)
  # share 0.6: only teacher 0 holds label 0; labels 1 and 2 have no holder.
  assert float(d.informative_fraction) == 0.25
  assert float(d.holder_ratio) == pytest.approx(1.0)


def test_pool_quality_matches_numpy():
  target = _softmax(LOGITS[:2]).mean(0)
  q = wd.pool_quality(LOGITS, VALID, target)
  probs = _softmax(LOGITS[:2])
  assert float(q.max_prob) == pytest.approx(probs.max(-1).mean(), rel=1e-5)
  entropy = -(probs * np.log(probs)).sum(-1).mean()
  assert float(q.entropy) == pytest.approx(entropy, rel=1e-5)
  hist = np.bincount(target.argmax(-1), minlength=3) / 4
  nz = hist[hist > 0]
  assert float(q.class_entropy) == pytest.approx(-(nz * np.log(nz)).sum(),
                                                 rel=1e-5)
  assert float(q.top_class_share) == pytest.approx(hist.max())
