"""Exact resume: 2 + 2 rounds equal 4 straight rounds, bit for bit.

For every registered method (`registry.METHODS`, each from its `smoke`
config) and heterogeneous FedD3A, a run stopped after 2 rounds and resumed
to 4 must hold exactly the state of an uninterrupted 4-round run: every leaf
of the process state (global weights; client-work, aggregator and finalizer
state such as DaFKD's generator and per-client discriminator store, FedGen's
and FedFTG's generators, their Adam state and round counters, heterogeneous
FedD3A's per-client model store) and every logged per-round training loss.

The straight run and the first two rounds share one prepared experiment
(`experiment.run_experiment`; a build is most of a short run's cost); the
resume builds its own, as a restarted run does.
"""

import csv
import os

import numpy as np
import pytest

from tests import helpers
from tff_kd.program import experiment

pytestmark = pytest.mark.slow

# Every method, and the variant with state of its own.
CASES = helpers.smoke_cases(variants=('fedd3a_hetero',))


def logged_losses(root: str) -> dict[int, list[float]]:
  """Every logged train loss per round (each round should appear once)."""
  out = {}
  with open(os.path.join(root, 'metrics.csv')) as f:
    for row in csv.DictReader(f):
      out.setdefault(int(row['round']), []).append(float(row['train/loss']))
  return out


@pytest.mark.parametrize('case', CASES)
def test_two_plus_two_rounds_equal_four(tmp_path, case):
  straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
  four = experiment.prepare(helpers.smoke_config(case, rounds=4), straight)
  settings = four.settings
  two = four._replace(settings=settings.replace(
      run=settings.run.replace(rounds=2)))
  experiment.run_experiment(four, straight, progress=False)
  experiment.run_experiment(two, resumed, progress=False)
  experiment.run(helpers.smoke_config(case, rounds=4), resumed,
                 progress=False)
  # The saved states, read without building the process a fourth time.
  round_a, leaves_a = helpers.saved_leaves(straight)
  round_b, leaves_b = helpers.saved_leaves(resumed)
  assert round_a == round_b == 4
  assert len(leaves_a) == len(leaves_b)
  for i, (a, b) in enumerate(zip(leaves_a, leaves_b)):
    np.testing.assert_array_equal(a, b, err_msg=i)
  losses_a, losses_b = logged_losses(straight), logged_losses(resumed)
  assert sorted(losses_b) == [1, 2, 3, 4]
  for r, values in losses_b.items():
    assert values == [losses_a[r][0]] * len(values), r
