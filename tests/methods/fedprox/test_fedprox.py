"""FedProx's process against its proximal numpy reference (FedAvg's toy).

FedProx: Li et al., MLSys 2020. The toy, its data and the reference client
update are FedAvg's (tests/methods/fedavg/test_fedavg.py).
"""

import numpy as np
import pytest

from tests.methods.fedavg.test_fedavg import _client_delta
from tests.methods.fedavg.test_fedavg import _model_fn
from tests.methods.fedavg.test_fedavg import _run_round
from tests.methods.fedavg.test_fedavg import _training
from tests.methods.fedavg.test_fedavg import data  # pylint: disable=unused-import
from tests.methods.fedavg.test_fedavg import PARTS
from tests.methods.fedavg.test_fedavg import W0
from tff_kd import errors
from tff_kd.methods.fedprox import fedprox_tff as fedprox
from tff_kd.methods.fedprox import hparams as fedprox_hparams


def test_fedprox_matches_proximal_reference(data):
  process = fedprox.build_fedprox_process(
      _model_fn, data.element_spec,
      hparams=fedprox_hparams.FedProxHparams(mu=0.5), training=_training())
  process, output = _run_round(process, data, steps=3)
  expected = W0 + (1 * _client_delta(PARTS[0], 0.1, 0.5, 3) +
                   3 * _client_delta(PARTS[1], 0.1, 0.5, 3)) / 4
  new = process.get_model_weights(output.state).trainable[0]
  np.testing.assert_allclose(new, expected, rtol=1e-5, atol=1e-6)
  # The proximal pull makes it differ from FedAvg with the same steps.
  plain = W0 + (1 * _client_delta(PARTS[0], 0.1, 0.0, 3) +
                3 * _client_delta(PARTS[1], 0.1, 0.0, 3)) / 4
  assert not np.allclose(new, plain, atol=1e-5)


@pytest.mark.parametrize('mu', [0.0, -1.0])
def test_fedprox_rejects_non_positive_mu(data, mu):
  with pytest.raises(errors.ConfigError, match=f'fedprox.mu .*{mu}'):
    fedprox.build_fedprox_process(_model_fn, data.element_spec,
                                 hparams=fedprox_hparams.FedProxHparams(mu=mu),
                                 training=_training())
