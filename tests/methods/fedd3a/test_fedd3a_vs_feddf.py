"""FedD3A with uniform weights is FedDF, up to its named differences.

FedD3A (Su, Li, Xue, AAAI 2023) replaces FedDF's (Lin et al., NeurIPS 2020)
uniform teacher average by per-sample weights (eq. 6) and averages the
teachers' probabilities (eq. 7) where FedDF averages their logits. With
`fedd3a.weighting='avg'` and `fedd3a.ensemble='logits'` nothing else may
differ: the same clients train on the same batches in the same order (the
projection P is built from its own pass over the client's batches,
`fedd3a_tf.client_round`), the same pool is distilled with the same
`distillation.distill` settings, seeds and labeled validation set. So two
rounds of each give bit-identical global models; the one documented
difference, the probability average, then gives a different model.
"""

import numpy as np
import pytest

from tests import helpers
from tests.helpers import digits_config
from tests.methods import link_checks
from tff_kd.program import experiment

_COMMON = {'rounds': 2, 'export': False, 'local.unit': 'steps',
           'local.amount': 4, 'server_data.proxy': 'split',
           'server_data.proxy_size': 100, 'server_data.val_size': 60,
           'distill.steps': 5, 'distill.batch_size': 16,
           'distill.val_fraction': 0.0}


def _global_model(tmp_path, name: str, **overrides) -> list[np.ndarray]:
  config = digits_config(**_COMMON, **overrides)
  root = str(tmp_path / name)
  experiment.run(config, root, progress=False)
  # Read from the checkpoint: no second build of the process.
  _, weights = helpers.saved_leaves(root, 'global_model_weights')
  return weights


@pytest.mark.slow
def test_fedd3a_with_avg_weights_and_logits_is_feddf(tmp_path):
  # FedDF in FedD3A's distillation settings (not FedDF's own recipe, whose
  # early stopping and training-mode student FedD3A does not share).
  feddf = _global_model(tmp_path, 'feddf', method='feddf', **{
      'distill.validation': 'pool', 'distill.eval_every': 50,
      'distill.student_training': False})
  avg = {'method': 'fedd3a', 'fedd3a.weighting': 'avg'}
  same = _global_model(tmp_path, 'logits', **avg,
                       **{'fedd3a.ensemble': 'logits'})
  for a, b in zip(feddf, same, strict=True):
    np.testing.assert_array_equal(a, b)
  # Eq. 7's probability average is the one difference left, and it shows.
  probs = _global_model(tmp_path, 'probs', **avg,
                        **{'fedd3a.ensemble': 'probs'})
  assert max(np.max(np.abs(a - b)) for a, b in zip(feddf, probs)) > 1e-4
  # FedD3A's row of `compare`'s link table, from its 60 labeled images; with
  # uniform weights on the probabilities its own ensemble is their average.
  link_checks.assert_fills_the_link_table(str(tmp_path / 'probs'), 'fedd3a')
  m = experiment.read_metrics(str(tmp_path / 'probs'))
  for name in ('distill/ensemble_accuracy', 'distill/uniform_accuracy',
               'distill/ensemble_labeled_accuracy_probs'):
    np.testing.assert_array_equal(m[name],
                                  m['distill/ensemble_labeled_accuracy'])
