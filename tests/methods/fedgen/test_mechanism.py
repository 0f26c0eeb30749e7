"""The mechanism against its switched-off twin (tests/methods/mechanisms.py).

FedGen vs `local_alpha = local_beta = 0`: the clients' heads agree more
with the generator (its teacher accuracy). The program hands FedGen the
run's labeled server set: its link table is reported every round.
"""

import numpy as np
import pytest

from tff_kd.core import links

from tests.methods import link_checks
from tests.methods.mechanisms import _metric
from tests.methods.mechanisms import run

pytestmark = pytest.mark.slow


def test_fedgen_clients_agree_with_the_generator(run):
  method = run(method='fedgen')
  twin = run(method='fedgen',
             **{'fedgen.local_alpha': 0.0, 'fedgen.local_beta': 0.0})
  # Round 1 is identical (the regulariser starts in round 2).
  np.testing.assert_allclose(_metric(method, 'distill/teacher_accuracy')[0],
                             _metric(twin, 'distill/teacher_accuracy')[0])
  gain = (_metric(method, 'distill/teacher_accuracy')[1:] -
          _metric(twin, 'distill/teacher_accuracy')[1:])
  assert np.all(gain > 0.05), gain
  # The link table on the run's 200 labeled images (`server_data.val_size`).
  for name in links.NAMES:
    values = _metric(method, f'distill/{name}')
    if name == 'target_entropy':
      np.testing.assert_array_equal(values, -1.0)
    else:
      assert np.all((values >= 0) & (values <= 1)), (name, values)
  np.testing.assert_array_equal(
      _metric(method, 'distill/labeled_accuracy_after'),
      _metric(method, 'distill/labeled_accuracy_before'))
  link_checks.assert_fills_the_link_table(method, 'fedgen')
