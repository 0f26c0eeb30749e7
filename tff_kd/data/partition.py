"""Seeded, pure-numpy partitions of a labelled training set over K clients.

* `dirichlet_partition`: label skew Dir(alpha), the recipe of FedDF (Lin et
  al., NeurIPS 2020, Sec. 4), FedGen (Zhu et al., ICML 2021) and DaFKD (Wang
  et al., CVPR 2023, Sec. 5.1): for every class, the class's samples are
  split over the clients in proportions drawn from Dir(alpha * 1_K). The whole
  training set is used, and the draw is repeated until every client holds at
  least `min_size` samples.
* `iid_partition`: a seeded random permutation cut into K near-equal parts.
* `fedgen_partition`: the FedGen reference's MNIST recipe (its README
  example): `per_class` samples of each class are split by a Dir(alpha) draw,
  and every user gets a disjoint test slice of floor(n_test(c) / K) samples
  of each class c it trains on.
* `domain_partition`: one domain per client (FedD3A's cross-silo setting), or
  each domain split over several clients IID or with Dir(beta) label skew
  (its cross-device setting).

Every function depends only on its arguments and seed, so a resumed run
rebuilds the exact same clients.
"""

from typing import Optional, Sequence

import numpy as np

from tff_kd import errors

_MAX_DRAWS = 1000


def _check_counts(num_samples: int, num_clients: int, min_size: int) -> None:
  if num_clients < 1:
    raise errors.ConfigError(
        f'partition.num_clients must be >= 1, got {num_clients}')
  if num_clients > num_samples:
    raise errors.ConfigError(
        f'partition.num_clients={num_clients} is more than the '
        f'{num_samples} training samples')
  if min_size * num_clients > num_samples:
    raise errors.ConfigError(
        f'partition.min_size={min_size} for {num_clients} clients needs '
        f'{min_size * num_clients} samples, but there are {num_samples}')


def _check_alpha(alpha: float) -> None:
  if not alpha > 0:
    raise errors.ConfigError(f'partition.alpha must be > 0, got {alpha}')


def _split_by_proportions(idx: np.ndarray, proportions: np.ndarray,
                          rng: np.random.Generator) -> list[np.ndarray]:
  idx = rng.permutation(idx)
  cuts = (np.cumsum(proportions)[:-1] * len(idx)).astype(int)
  return np.split(idx, cuts)


def dirichlet_partition(labels: np.ndarray, num_clients: int, alpha: float,
                        *, seed: int, min_size: int = 1) -> list[np.ndarray]:
  """Label-skewed Dir(alpha) split of all samples over `num_clients`.

  Args:
    labels: Integer labels of the training set, shape [n].
    num_clients: K >= 1.
    alpha: Dirichlet concentration, > 0 (smaller is more skewed).
    seed: Seed of the draw.
    min_size: Every client gets at least this many samples.

  Returns:
    K sorted index arrays that together cover `range(n)` exactly once.

  Raises:
    ConfigError: for alpha <= 0, more clients than samples, or a `min_size`
      that no draw reached in 1000 tries.
  """
  labels = np.asarray(labels)
  _check_alpha(alpha)
  _check_counts(len(labels), num_clients, min_size)
  rng = np.random.default_rng(seed)
  classes = np.unique(labels)
  for _ in range(_MAX_DRAWS):
    parts = [[] for _ in range(num_clients)]
    for c in classes:
      props = rng.dirichlet(np.full(num_clients, alpha))
      for client, chunk in enumerate(
          _split_by_proportions(np.flatnonzero(labels == c), props, rng)):
        parts[client].append(chunk)
    parts = [np.sort(np.concatenate(p)) for p in parts]
    if min(len(p) for p in parts) >= min_size:
      return parts
  raise errors.ConfigError(
      f'no Dir({alpha}) draw over {num_clients} clients gave every client '
      f'partition.min_size={min_size} samples in {_MAX_DRAWS} tries; lower '
      'min_size or num_clients, or raise alpha')


def iid_partition(num_samples: int, num_clients: int, *,
                  seed: int) -> list[np.ndarray]:
  """A seeded uniform split of `range(num_samples)` into K near-equal parts."""
  _check_counts(num_samples, num_clients, 1)
  perm = np.random.default_rng(seed).permutation(num_samples)
  return [np.sort(p) for p in np.array_split(perm, num_clients)]


def fedgen_partition(
    labels: np.ndarray, num_clients: int, alpha: float, *, per_class: int,
    seed: int, test_labels: np.ndarray, min_size: int = 1,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """The FedGen reference's split: per-class samples divided by Dir(alpha).

  Args:
    labels: Training labels, shape [n].
    num_clients: Number of users K.
    alpha: Dirichlet concentration, > 0.
    per_class: Training samples taken from each class (FedGen: 1,500 for its
      "ratio 0.5" MNIST example).
    seed: Seed of the draw.
    test_labels: Test labels, for the per-user test slices.
    min_size: Every user gets at least this many training samples.

  Returns:
    `(train_parts, test_slices)`: K training index arrays, and K disjoint test
    index arrays holding floor(n_test(c) / K) samples of each class c the user
    trains on.

  Raises:
    ConfigError: for bad counts, or a class with fewer than `per_class`
      samples.
  """
  labels, test_labels = np.asarray(labels), np.asarray(test_labels)
  _check_alpha(alpha)
  classes = np.unique(labels)
  _check_counts(per_class * len(classes), num_clients, min_size)
  rng = np.random.default_rng(seed)
  pools = {}
  for c in classes:
    idx = np.flatnonzero(labels == c)
    if len(idx) < per_class:
      raise errors.ConfigError(
          f'partition.per_class={per_class} but class {c} has only '
          f'{len(idx)} training samples')
    pools[c] = rng.permutation(idx)[:per_class]
  for _ in range(_MAX_DRAWS):
    parts = [[] for _ in range(num_clients)]
    for c in classes:
      props = rng.dirichlet(np.full(num_clients, alpha))
      for user, chunk in enumerate(_split_by_proportions(pools[c], props, rng)):
        parts[user].append(chunk)
    parts = [np.sort(np.concatenate(p)) for p in parts]
    if min(len(p) for p in parts) >= min_size:
      break
  else:
    raise errors.ConfigError(
        f'no Dir({alpha}) draw gave every user {min_size} samples')

  slices = [[] for _ in range(num_clients)]
  for c in classes:
    test_idx = np.flatnonzero(test_labels == c)
    share = len(test_idx) // num_clients
    for user in range(num_clients):
      if np.any(labels[parts[user]] == c):
        slices[user].append(test_idx[user * share:(user + 1) * share])
  slices = [np.sort(np.concatenate(s)) if s else np.zeros(0, np.int64)
            for s in slices]
  return parts, slices


def domain_partition(domains: np.ndarray, *, clients_per_domain: int = 1,
                     alpha: Optional[float] = None,
                     labels: Optional[np.ndarray] = None, seed: int,
                     min_size: int = 1) -> list[np.ndarray]:
  """Clients that each hold data of a single domain.

  Args:
    domains: Integer domain id of every training sample, shape [n].
    clients_per_domain: How many clients share one domain (1: one domain per
      client, FedD3A's cross-silo setting; 5: its cross-device setting).
    alpha: None splits a domain IID over its clients; a value > 0 splits it
      with Dir(alpha) label skew (needs `labels`).
    labels: Training labels, for the Dirichlet split.
    seed: Seed of the splits.
    min_size: Minimum samples per client (Dirichlet split).

  Returns:
    Index arrays ordered domain by domain (sorted domain ids), then client.
  """
  domains = np.asarray(domains)
  if clients_per_domain < 1:
    raise errors.ConfigError(
        f'clients_per_domain must be >= 1, got {clients_per_domain}')
  if alpha is not None and labels is None:
    raise ValueError('a Dirichlet domain split needs the labels')
  parts = []
  for i, d in enumerate(np.unique(domains)):
    idx = np.flatnonzero(domains == d)
    if alpha is None:
      local = iid_partition(len(idx), clients_per_domain, seed=seed + i)
    else:
      local = dirichlet_partition(np.asarray(labels)[idx], clients_per_domain,
                                  alpha, seed=seed + i, min_size=min_size)
    parts.extend(idx[p] for p in local)
  return parts


def label_counts(labels: np.ndarray, parts: Sequence[np.ndarray],
                 num_classes: int) -> np.ndarray:
  """[K, num_classes] label histogram of each client."""
  labels = np.asarray(labels)
  return np.stack([np.bincount(labels[p], minlength=num_classes)
                   for p in parts])
