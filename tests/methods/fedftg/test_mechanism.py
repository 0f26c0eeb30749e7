"""The mechanism against its switched-off twin (tests/methods/mechanisms.py).

FedFTG vs student lr 0: the student's agreement with the class-level
teacher on generated samples rises.
"""

import numpy as np
import pytest

from tests.methods.mechanisms import _metric
from tests.methods.mechanisms import run

pytestmark = pytest.mark.slow


def test_fedftg_fine_tuning_moves_the_student_to_the_teacher(run):
  # 10 student steps per iteration instead of 5: FedFTG's adversarial
  # fine-tuning amplifies float round-off (BUILD_NOTES, "Server step outside
  # the runtime"), and with 5 the rise per round moved with the process's
  # threading between +0.215/-0.008/+0.129 and +0.031/0/+0.078 (4 and 10 of
  # 128 samples). With 10: +0.184/+0.059/+0.074 in the suite,
  # +0.117/+0.020/+0.113 alone.
  # At the reference's student rate (the default is 0.01, chosen for the
  # drift regime): the mechanism, not the recipe.
  steps = {'fedftg.student_steps': 10, 'fedftg.student_learning_rate': 0.1}
  method = run(method='fedftg', **steps)
  twin = run(method='fedftg', **{**steps, 'fedftg.student_learning_rate': 0.0})
  rise = (_metric(method, 'distill/agreement_after') -
          _metric(method, 'distill/agreement_before'))
  np.testing.assert_array_equal(_metric(twin, 'distill/agreement_after'),
                                _metric(twin, 'distill/agreement_before'))
  # The mechanism is the mean rise and a rise in most rounds.
  assert rise.mean() > 0.05 and np.sum(rise > 0) >= 2, rise
