"""FedDF's hyper-parameters: the `config.feddf` section.

Defaults, documentation and checks in one place (`tff_kd.hparams`).
"""

import dataclasses
import types
from typing import Any, ClassVar, Mapping

from tff_kd import errors
from tff_kd import hparams as hp
from tff_kd.models import names as model_names


@dataclasses.dataclass(frozen=True)
class FedDFHparams(hp.Hparams):
  """FedDF (Lin et al., NeurIPS 2020), `config.feddf`.

  The distillation itself uses `config.distill`.

  Attributes:
    drop_worst: Drop teachers at or below random-guess accuracy on the
      server's labeled validation set (needs server_data.val_size > 0).
    client_models: '' = homogeneous (model.name / model.norm). Otherwise a
      comma list of architecture prototypes `name[:norm]`, e.g.
      'cnn,resnet11'; client i trains prototype i % P, and the server keeps
      one global model per prototype. The same key as FedD3A's. Old name:
      `prototypes`, read until the next release. `keras:<Application>`
      and `py:<module>:<function>` (your own model, docs/own_model.md)
      entries take no norm.
    client_weights: The initial weights of each `client_models` prototype
      (`model.weights` must then be ''): '' (all seeded random) or a comma
      list parallel to `client_models`, each entry '' (seeded), 'imagenet'
      (`keras:` entries) or a weights path (as `model.weights`; paths with
      commas are not supported).
  """

  SECTION: ClassVar[str] = 'feddf'
  ALIASES: ClassVar[Mapping[str, hp.Alias]] = {
      'prototypes': hp.Alias('client_models')}

  drop_worst: bool = hp.field(False, hp.boolean)
  client_models: str = hp.field('', hp.model_list)
  client_weights: str = hp.field('', model_names.check_weights_list)

  def _check_combinations(self) -> None:
    model_names.parse_weights_list(self.client_weights, self.client_models,
                                   key=self.key('client_weights'))

  def check_settings(self, settings: Any) -> None:
    prototypes = model_names.model_count(self.client_models)
    if prototypes > 1:
      model_names.check_ungrouped(
          f'feddf trains {prototypes} prototypes', settings.runtime)
    if self.drop_worst and settings.server_data.val_size < 1:
      raise errors.ConfigError(
          'feddf.drop_worst needs server_data.val_size >= 1 (a labeled '
          'validation set held out of the training set)')


# FedDF's recipe of the shared `distill` keys (Lin et al., NeurIPS 2020,
# Sec. 4 and its code): AVGLOGITS at T = 1 and Adam 1e-3 are the section's
# defaults; FedDF early-stops on validation data (here the server's labeled
# images where it has them, `validation='auto'`, checked every 20 of the
# CPU-sized 200 steps) and trains the student in training mode, so that
# BatchNorm re-estimates its statistics on the real pool. Chosen on the
# server's labeled images in DaFKD's drift regime (configs/dafkd_paper_cpu.py,
# Dir(0.05), seeds 0-2): studies/table1/README.md.
DISTILL_DEFAULTS: Mapping[str, Any] = types.MappingProxyType({
    'validation': 'auto', 'eval_every': 20, 'student_training': True})
