"""The mechanism against its switched-off twin (tests/methods/mechanisms.py).

DaFKD vs `weighting='uniform'`: eq. 7's weights leave uniform, and (oracle
pool) put more mass on the clients that hold a sample's label than uniform
weights do.
"""

import numpy as np
import pytest

from tests.methods.mechanisms import _metric
from tests.methods.mechanisms import DAFKD
from tests.methods.mechanisms import LOG3
from tests.methods.mechanisms import run

pytestmark = pytest.mark.slow


def test_dafkd_weights_leave_uniform(run):
  method = run(**DAFKD)
  twin = run(**DAFKD, **{'dafkd.weighting': 'uniform'})
  np.testing.assert_allclose(_metric(twin, 'distill/alpha_entropy'), LOG3,
                             rtol=1e-6)
  np.testing.assert_allclose(_metric(twin, 'distill/holder_ratio'), 1.0,
                             rtol=1e-6)
  assert np.all(_metric(method, 'distill/alpha_entropy') < LOG3 - 0.005)


def test_dafkd_oracle_pool_weights_the_holders(run):
  method = run(**DAFKD, **{'dafkd.pool': 'real'})
  twin = run(**DAFKD, **{'dafkd.pool': 'real', 'dafkd.weighting': 'uniform'})
  np.testing.assert_allclose(_metric(twin, 'distill/holder_ratio'), 1.0,
                             rtol=1e-6)
  ratio = _metric(method, 'distill/holder_ratio')
  assert ratio.mean() > 1.1 and ratio[-1] > 1.2, ratio
  # A real pool has no pseudo labels to be faithful to.
  np.testing.assert_array_equal(_metric(method, 'distill/label_fidelity'), -1)
