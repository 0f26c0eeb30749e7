"""FedProx's hyper-parameters: the `config.fedprox` section.

Defaults, documentation and checks in one place (`tff_kd.hparams`).
"""

import dataclasses
from typing import ClassVar

from tff_kd import hparams as hp


@dataclasses.dataclass(frozen=True)
class FedProxHparams(hp.Hparams):
  """FedProx (Li et al., MLSys 2020), `config.fedprox`.

  Attributes:
    mu: Proximal strength mu > 0 of the local objective's
      mu/2 ||w - w_global||^2 (eq. 2).
  """

  SECTION: ClassVar[str] = 'fedprox'

  mu: float = hp.field(0.01, hp.positive_number)
