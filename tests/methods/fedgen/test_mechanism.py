"""The mechanism against its switched-off twin (tests/methods/mechanisms.py).

FedGen vs `local_alpha = local_beta = 0`: identical in round 1 (the
regulariser starts in round 2), different after it. The program hands
FedGen the run's labeled server set: its link table is reported every
round.

The clients draw their generated labels over every class, as the
reference does (`fedgen_tff.generated_label_probs`), so a head also learns
the labels its client lacks; the label-weighted agreement of the heads
with the generator (`distill/teacher_accuracy`), which weights each label
by its holders only, no longer rises with the regulariser on this toy
(it did while the clients drew their own labels). The direction of the
mechanism, a client learning a label it lacks through the generator, is
`test_fedgen.test_the_regulariser_teaches_a_client_the_labels_it_lacks`.
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
  # From round 2 the regularised clients send other heads.
  change = np.abs(_metric(method, 'distill/teacher_loss')[1:] -
                  _metric(twin, 'distill/teacher_loss')[1:])
  assert np.all(change > 1e-3), change
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
