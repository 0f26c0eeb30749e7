"""The mechanism against its switched-off twin (tests/methods/mechanisms.py).

FedDF vs distillation lr 0: the KD loss falls within every round.
"""

import numpy as np
import pytest

from tests.methods.mechanisms import _metric
from tests.methods.mechanisms import run

pytestmark = pytest.mark.slow


def test_feddf_distillation_lowers_the_kd_loss(run):
  method = run(method='feddf')
  # Switched off: lr 0, and the student in inference mode (FedDF's recipe
  # trains it in training mode, whose BatchNorm statistics move even at
  # lr 0).
  twin = run(method='feddf', **{'distill.learning_rate': 0.0,
                                'distill.student_training': False})
  ratio = _metric(method, 'distill/last_loss') / _metric(
      method, 'distill/first_loss')
  twin_ratio = _metric(twin, 'distill/last_loss') / _metric(
      twin, 'distill/first_loss')
  assert np.all(ratio < 0.6), ratio
  assert np.all(twin_ratio > 0.9), twin_ratio
  # lr 0 leaves the averaged model: its labeled accuracy is unchanged.
  np.testing.assert_array_equal(_metric(twin, 'distill/labeled_accuracy_after'),
                                _metric(twin, 'distill/labeled_accuracy_before'))
  assert np.any(_metric(method, 'distill/labeled_accuracy_after') !=
                _metric(method, 'distill/labeled_accuracy_before'))
