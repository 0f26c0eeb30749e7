"""Partitions: coverage, sizes, seeding, label skew and config errors."""

import numpy as np
import pytest

from tff_kd import errors
from tff_kd.data import partition

# 10 classes x 200 samples, shuffled so that class and index are unrelated.
LABELS = np.random.default_rng(123).permutation(np.repeat(np.arange(10), 200))


def _assert_covers_once(parts, n):
  joined = np.concatenate(parts)
  assert len(joined) == n
  np.testing.assert_array_equal(np.sort(joined), np.arange(n))


def _mean_entropy(labels, parts, num_classes):
  counts = partition.label_counts(labels, parts, num_classes)
  q = counts / counts.sum(1, keepdims=True)
  with np.errstate(divide='ignore', invalid='ignore'):
    h = -np.where(q > 0, q * np.log(q), 0.0).sum(1)
  return float(h.mean())


# ---------------------------------------------------------------- dirichlet


@pytest.mark.parametrize('alpha', [0.05, 0.5, 100.0])
def test_dirichlet_covers_every_index_once_with_min_size(alpha):
  parts = partition.dirichlet_partition(LABELS, 10, alpha, seed=3,
                                        min_size=20)
  assert len(parts) == 10
  _assert_covers_once(parts, len(LABELS))
  assert min(len(p) for p in parts) >= 20
  for p in parts:  # Documented: sorted index arrays.
    np.testing.assert_array_equal(p, np.sort(p))


def test_dirichlet_is_reproducible_and_seed_dependent():
  a = partition.dirichlet_partition(LABELS, 8, 0.5, seed=7)
  b = partition.dirichlet_partition(LABELS, 8, 0.5, seed=7)
  c = partition.dirichlet_partition(LABELS, 8, 0.5, seed=8)
  for pa, pb in zip(a, b):
    np.testing.assert_array_equal(pa, pb)
  assert any(len(pa) != len(pc) or np.any(pa != pc) for pa, pc in zip(a, c))


def test_smaller_alpha_gives_more_label_skew():
  for seed in range(3):
    skewed = partition.dirichlet_partition(LABELS, 10, 0.05, seed=seed)
    uniform = partition.dirichlet_partition(LABELS, 10, 100.0, seed=seed)
    c_skewed = partition.label_counts(LABELS, skewed, 10)
    c_uniform = partition.label_counts(LABELS, uniform, 10)
    # Dir(100) gives every client ~20 samples of every class.
    assert (c_uniform > 0).all()
    assert (c_skewed > 0).sum(1).mean() < 6
    # Entropy of the label distribution: log(10) = 2.303 is uniform.
    assert _mean_entropy(LABELS, uniform, 10) > 2.25
    assert _mean_entropy(LABELS, skewed, 10) < 1.3


def test_dirichlet_works_with_non_contiguous_labels():
  labels = np.array([3, 7, 7, 3, 9, 9, 9, 3] * 5)
  parts = partition.dirichlet_partition(labels, 4, 1.0, seed=0)
  _assert_covers_once(parts, len(labels))


@pytest.mark.parametrize('alpha', [0.0, -1.5, float('nan')])
def test_dirichlet_rejects_non_positive_alpha(alpha):
  with pytest.raises(errors.ConfigError, match='alpha') as e:
    partition.dirichlet_partition(LABELS, 4, alpha, seed=0)
  assert str(alpha) in str(e.value)


def test_dirichlet_rejects_more_clients_than_samples():
  with pytest.raises(errors.ConfigError, match='num_clients=11') as e:
    partition.dirichlet_partition(np.zeros(10, int), 11, 1.0, seed=0)
  assert '10 training samples' in str(e.value)


def test_dirichlet_rejects_zero_clients():
  with pytest.raises(errors.ConfigError, match='num_clients'):
    partition.dirichlet_partition(LABELS, 0, 1.0, seed=0)


def test_dirichlet_rejects_min_size_larger_than_data_allows():
  with pytest.raises(errors.ConfigError, match='min_size=300') as e:
    partition.dirichlet_partition(LABELS, 10, 1.0, seed=0, min_size=300)
  assert '3000' in str(e.value) and '2000' in str(e.value)


def test_dirichlet_gives_up_on_unreachable_min_size():
  # 20 samples over 5 clients with min_size 4 needs an exactly even split,
  # which a Dir(0.001) draw never gives.
  labels = np.repeat(np.arange(2), 10)
  with pytest.raises(errors.ConfigError, match='min_size=4') as e:
    partition.dirichlet_partition(labels, 5, 0.001, seed=0, min_size=4)
  assert '1000 tries' in str(e.value)
  assert '\n' not in str(e.value)


# ---------------------------------------------------------------------- iid


@pytest.mark.parametrize('n,k', [(103, 10), (100, 10), (7, 7), (5, 1)])
def test_iid_sizes_differ_by_at_most_one_and_cover_all(n, k):
  parts = partition.iid_partition(n, k, seed=0)
  sizes = [len(p) for p in parts]
  assert len(parts) == k
  assert max(sizes) - min(sizes) <= 1
  _assert_covers_once(parts, n)


def test_iid_is_seeded():
  a = partition.iid_partition(50, 4, seed=1)
  b = partition.iid_partition(50, 4, seed=1)
  c = partition.iid_partition(50, 4, seed=2)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))
  # A random split, not contiguous blocks.
  assert not np.array_equal(a[0], np.arange(len(a[0])))


def test_iid_rejects_more_clients_than_samples():
  with pytest.raises(errors.ConfigError, match='num_clients=6'):
    partition.iid_partition(5, 6, seed=0)


# ------------------------------------------------------------------- fedgen

TEST_LABELS = np.random.default_rng(5).permutation(
    np.repeat(np.arange(10), [23, 30, 21, 25, 20, 27, 22, 24, 26, 29]))


def test_fedgen_uses_per_class_samples_of_each_class():
  train, _ = partition.fedgen_partition(
      LABELS, 5, 0.5, per_class=50, seed=0, test_labels=TEST_LABELS)
  joined = np.concatenate(train)
  assert len(np.unique(joined)) == len(joined) == 500
  np.testing.assert_array_equal(np.bincount(LABELS[joined], minlength=10),
                                np.full(10, 50))


@pytest.mark.parametrize('alpha', [0.1, 1.0])
def test_fedgen_test_slices_are_disjoint_and_match_training_classes(alpha):
  k = 5
  train, test = partition.fedgen_partition(
      LABELS, k, alpha, per_class=50, seed=1, test_labels=TEST_LABELS)
  assert len(train) == len(test) == k
  joined = np.concatenate(test)
  assert len(np.unique(joined)) == len(joined)  # Disjoint.
  n_test = np.bincount(TEST_LABELS, minlength=10)
  for user in range(k):
    trained = set(np.unique(LABELS[train[user]]).tolist())
    counts = np.bincount(TEST_LABELS[test[user]], minlength=10)
    expected = np.array([n_test[c] // k if c in trained else 0
                         for c in range(10)])
    np.testing.assert_array_equal(counts, expected)


def test_fedgen_is_reproducible():
  a = partition.fedgen_partition(LABELS, 4, 0.5, per_class=30, seed=9,
                                 test_labels=TEST_LABELS)
  b = partition.fedgen_partition(LABELS, 4, 0.5, per_class=30, seed=9,
                                 test_labels=TEST_LABELS)
  for x, y in zip(a[0] + a[1], b[0] + b[1]):
    np.testing.assert_array_equal(x, y)


def test_fedgen_rejects_per_class_larger_than_a_class():
  labels = np.concatenate([np.zeros(100, int), np.ones(40, int)])
  with pytest.raises(errors.ConfigError, match='per_class=50') as e:
    partition.fedgen_partition(labels, 2, 1.0, per_class=50, seed=0,
                               test_labels=np.array([0, 1]))
  assert 'class 1 has only 40' in str(e.value)


def test_fedgen_rejects_bad_alpha():
  with pytest.raises(errors.ConfigError, match='-0.5'):
    partition.fedgen_partition(LABELS, 2, -0.5, per_class=5, seed=0,
                               test_labels=TEST_LABELS)


# ------------------------------------------------------------------- domain

# Domain ids deliberately unsorted and interleaved, with 2 missing ids.
DOMAINS = np.random.default_rng(2).permutation(
    np.repeat(np.array([4, 0, 7]), [300, 500, 400]))
DOMAIN_LABELS = np.random.default_rng(3).integers(0, 10, len(DOMAINS))


def test_one_client_per_domain_in_sorted_domain_order():
  parts = partition.domain_partition(DOMAINS, seed=0)
  assert len(parts) == 3
  for client, d in enumerate([0, 4, 7]):
    np.testing.assert_array_equal(np.sort(parts[client]),
                                  np.flatnonzero(DOMAINS == d))


def test_several_iid_clients_per_domain():
  parts = partition.domain_partition(DOMAINS, clients_per_domain=5, seed=0)
  assert len(parts) == 15
  _assert_covers_once(parts, len(DOMAINS))
  for client, p in enumerate(parts):
    assert len(np.unique(DOMAINS[p])) == 1
    assert DOMAINS[p[0]] == [0, 4, 7][client // 5]
  sizes = [len(p) for p in parts]
  assert sizes == [100] * 5 + [60] * 5 + [80] * 5


def test_dirichlet_clients_per_domain_cover_each_domain_once():
  parts = partition.domain_partition(DOMAINS, clients_per_domain=5, alpha=0.3,
                                     labels=DOMAIN_LABELS, seed=4,
                                     min_size=5)
  assert len(parts) == 15
  for i, d in enumerate([0, 4, 7]):
    group = parts[5 * i:5 * i + 5]
    assert all((DOMAINS[p] == d).all() for p in group)
    assert min(len(p) for p in group) >= 5
    np.testing.assert_array_equal(np.sort(np.concatenate(group)),
                                  np.flatnonzero(DOMAINS == d))
  again = partition.domain_partition(DOMAINS, clients_per_domain=5, alpha=0.3,
                                     labels=DOMAIN_LABELS, seed=4,
                                     min_size=5)
  assert all(np.array_equal(x, y) for x, y in zip(parts, again))


def test_domain_partition_rejects_bad_settings():
  with pytest.raises(errors.ConfigError, match='clients_per_domain.*0'):
    partition.domain_partition(DOMAINS, clients_per_domain=0, seed=0)
  with pytest.raises(ValueError, match='labels'):
    partition.domain_partition(DOMAINS, clients_per_domain=2, alpha=1.0,
                               seed=0)


# ------------------------------------------------------------- label_counts


def test_label_counts_golden():
  labels = np.array([0, 1, 1, 2, 2, 2, 3])
  parts = [np.array([0, 1]), np.array([2, 3, 4, 5]), np.zeros(0, np.int64),
           np.array([6, 3])]
  np.testing.assert_array_equal(
      partition.label_counts(labels, parts, 5),
      [[1, 1, 0, 0, 0],
       [0, 1, 3, 0, 0],
       [0, 0, 0, 0, 0],
       [0, 0, 1, 1, 0]])
