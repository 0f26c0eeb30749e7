"""Seeded per-round client sampling.

The sample of round r depends only on (seed, r), never on the history of
a random generator, so a run resumed from a checkpoint draws exactly the
clients the uninterrupted run would have drawn.
"""

import numpy as np

from tff_kd import errors


def check_sampling(num_clients: int, clients_per_round: int) -> None:
  """Raises `ConfigError` unless 1 <= clients_per_round <= num_clients."""
  if num_clients < 1:
    raise errors.ConfigError(f'partition.num_clients must be >= 1, got '
                             f'{num_clients}')
  if not 1 <= clients_per_round <= num_clients:
    raise errors.ConfigError(
        f'clients_per_round={clients_per_round} is impossible with '
        f'{num_clients} clients; it must be in [1, {num_clients}]')


def sample_clients(num_clients: int, clients_per_round: int, *, seed: int,
                   round_num: int) -> np.ndarray:
  """Sorted indices of the clients taking part in `round_num`."""
  check_sampling(num_clients, clients_per_round)
  rng = np.random.default_rng([seed, round_num])
  return np.sort(rng.choice(num_clients, clients_per_round, replace=False))
