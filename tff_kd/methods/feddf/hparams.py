"""FedDF's hyper-parameters: the `config.feddf` section.

Defaults, documentation and checks in one place (`tff_kd.hparams`).
"""

import dataclasses
from typing import ClassVar

import ml_collections

from tff_kd import errors
from tff_kd import hparams as hp


@dataclasses.dataclass(frozen=True)
class FedDFHparams(hp.Hparams):
  """FedDF (Lin et al., NeurIPS 2020), `config.feddf`.

  The distillation itself uses `config.distill`.

  Attributes:
    drop_worst: Drop teachers at or below random-guess accuracy on the
      server's labeled validation set (needs server_data.val_size > 0).
    prototypes: '' = homogeneous (model.name / model.norm). Otherwise a
      comma list of prototypes `name[:norm]`, e.g. 'cnn,resnet11'; client
      i trains prototype i % P.
  """

  SECTION: ClassVar[str] = 'feddf'

  drop_worst: bool = hp.field(False, hp.boolean)
  prototypes: str = hp.field('', hp.model_list)

  def check_config(self, config: ml_collections.ConfigDict) -> None:
    if self.drop_worst and config.server_data.val_size < 1:
      raise errors.ConfigError(
          'feddf.drop_worst needs server_data.val_size >= 1 (a labeled '
          'validation set held out of the training set)')
