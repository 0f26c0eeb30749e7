"""FedD3A's hyper-parameters: the `config.fedd3a` section.

Defaults, documentation and checks in one place (`tff_kd.hparams`).
"""

import dataclasses
import types
from typing import Any, ClassVar, Mapping

from tff_kd import hparams as hp
from tff_kd.models import names as model_names

# The teacher weightings of eq. 6 and Table 1's ablations (`weighting`;
# `projection_tf.teacher_weights`).
WEIGHTINGS = ('soft', 'onehot', 'avg', 'random')
# How the weighted teachers combine (`ensemble`).
ENSEMBLES = ('probs', 'logits')
# Whose backbone computes the server samples' features f of eq. 6
# (`score_backbone`).
SCORE_BACKBONES = ('broadcast', 'aggregated')


# The presets of `fedd3a.variant` (docs/variants.md); the first is the
# default. Chosen on the server's 500 labeled images in DaFKD's drift regime
# (configs/dafkd_paper_cpu.py, seeds 0-2, after the last round): logits
# .707 / .873 at Dir(0.05) / Dir(0.1), probabilities .525 / .645.
VARIANTS: Mapping[str, hp.Variant] = types.MappingProxyType({
    'logits': hp.Variant(
        summary='Eq. 6\'s weights on the teachers\' logits, as FedDF '
        'averages them (AVGLOGITS); the preset that works in the drift '
        'regime.',
        differs='The weighted mean of logits, not eq. 7\'s mean of '
        'probabilities: at Dir(0.05) the probabilities\' target left the '
        'student at .525 on the labeled images, the logits\' at .707.',
        keys={'fedd3a.ensemble': 'logits'}),
    'paper': hp.Variant(
        summary='Eq. 7: the weighted mean of the teachers\' probabilities.',
        differs='',
        keys={'fedd3a.ensemble': 'probs'}),
})


@dataclasses.dataclass(frozen=True)
class FedD3AHparams(hp.Hparams):
  """FedD3A (Su, Li, Xue, AAAI 2023), `config.fedd3a`.

  The distillation itself uses `config.distill`.

  Attributes:
    variant: The preset (`VARIANTS`, docs/variants.md): 'logits' (the
      default) | 'paper'.
    alpha: Ridge of eq. 5, > 0, in squared feature units.
    weighting: 'soft' (eq. 6) | 'onehot' | 'avg' | 'random' (Table 1's
      ablations).
    ensemble: 'probs' (eq. 7: weighted mean of probabilities) | 'logits'.
      Set by the preset.
    projection_batches: Local batches P is built from; 0 = all of the
      round's batches.
    score_backbone: Backbone of the server samples' features in eq. 6:
      'broadcast' (w_t, the space the clients' P_k were built in) |
      'aggregated' (the averaged model after local training).
    client_models: Heterogeneous clients: '' = every client trains
      `model`. Otherwise a comma list `name[:norm]` (e.g. 'cnn,resnet11');
      client i keeps its own model of entry i % A across rounds, trained
      with CE + kd_weight * KD (temperature kd_temperature) from the
      received global model. `keras:<Application>` and
      `py:<module>:<function>` (your own model, docs/own_model.md) entries
      take no norm.
    client_weights: The initial weights of each `client_models` entry: ''
      (all seeded random) or a comma list parallel to `client_models`, each
      entry '' (seeded), 'imagenet' (`keras:` entries) or a weights path
      (as `model.weights`; paths with commas are not supported).
    kd_weight: Heterogeneous clients' weight of the KD term (>= 0).
    kd_temperature: Its temperature (> 0).
  """

  SECTION: ClassVar[str] = 'fedd3a'
  VARIANTS: ClassVar[Mapping[str, hp.Variant]] = VARIANTS

  variant: str = hp.field('', hp.one_of('', *VARIANTS))

  alpha: float = hp.field(1.0, hp.positive_number)
  weighting: str = hp.field('soft', hp.one_of(*WEIGHTINGS))
  ensemble: str = hp.field('probs', hp.one_of(*ENSEMBLES))
  projection_batches: int = hp.field(0, hp.non_negative_int)
  score_backbone: str = hp.field('broadcast',
                               hp.one_of(*SCORE_BACKBONES))
  client_models: str = hp.field('', hp.model_list)
  client_weights: str = hp.field('', model_names.check_weights_list)
  kd_weight: float = hp.field(1.0, hp.non_negative_number)
  kd_temperature: float = hp.field(1.0, hp.positive_number)

  def _check_combinations(self) -> None:
    model_names.parse_weights_list(self.client_weights, self.client_models,
                                   key=self.key('client_weights'))

  def check_settings(self, settings: Any) -> None:
    if self.client_models:
      model_names.check_ungrouped(HETERO_UNGROUPED, settings.runtime)


# Why heterogeneous FedD3A's clients are not grouped (`check_ungrouped`).
HETERO_UNGROUPED = 'fedd3a with client_models keeps each client its own model'

