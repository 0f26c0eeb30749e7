"""FedFTG's hyper-parameters: the `config.fedftg` section.

Defaults, documentation and checks in one place (`tff_kd.hparams`). Its
student distils with the shared `distill` section's batch size,
temperature, BatchNorm mode, KL reduction and learning-rate decay
(`DISTILL_KEYS`), whose defaults for FedFTG are its reference's
(`DISTILL_DEFAULTS`); its old `fedftg.<key>` names are read until the next
release.
"""

import dataclasses
import types
from typing import Any, ClassVar, Mapping

from tff_kd import hparams as hp
from tff_kd.models import names as model_names

# Which generated samples the transfer term pushes (`mask`;
# `fedftg_tf.hard_sample_generator_loss`): 'agree' (those the student still
# agrees on) | 'none' (all).
MASKS = ('agree', 'none')
# How the server holds the round's teachers (`FedFTGHparams.teachers`).
TEACHERS = ('models', 'stacked')


# The presets of `fedftg.variant` (docs/variants.md).
VARIANTS: Mapping[str, hp.Variant] = types.MappingProxyType({
    'tuned': hp.Variant(
        summary='Its reference\'s server step with the student\'s SGD '
        'learning rate 0.001, chosen on the server\'s labeled images in '
        'the drift regime.',
        differs='Student lr 0.001, not the reference\'s 0.1: per round, '
        'the step moved the labeled accuracy by -.105 at 0.1, -.016 at '
        '0.01 and +.013 at 0.001 at Dir(0.05) (studies/table1/README.md).',
        keys={'fedftg.student_learning_rate': 1e-3}),
    'reference': hp.Variant(
        summary='Its reference code\'s settings, student lr 0.1.',
        differs='',
        keys={'fedftg.student_learning_rate': 0.1}),
})


@dataclasses.dataclass(frozen=True)
class FedFTGHparams(hp.Hparams):
  """FedFTG (Zhang et al., CVPR 2022), `config.fedftg`.

  Defaults: the reference's values where known. From `config.distill`
  (`DISTILL_KEYS`, FedFTG's defaults in `DISTILL_DEFAULTS`): `batch_size`
  (generated samples per generator step and student batch), `temperature`
  (the distillation's, also the transfer term's), `student_training`
  (False: the student's BatchNorm statistics are frozen; True: they move
  towards the generated data's), `kl_reduction` (the student KD loss over
  batch x classes: 'mean', the reference's, makes SGD's step C times
  smaller than 'batchmean') and `lr_decay` (the per-round factor of both
  learning rates).

  Attributes:
    variant: The preset (`VARIANTS`, docs/variants.md): 'tuned' (the
      default) | 'reference'.
    iterations: Generator step(s) + student steps, per round.
    student_steps: Student steps per iteration (through
      `distillation.distill`).
    generator_learning_rate: The generator's Adam learning rate.
    student_learning_rate: The student's SGD learning rate (0 leaves the
      student unchanged: the switched-off twin of the mechanism test).
      0.001, not the reference's 0.1: chosen on the server's labeled
      images in DaFKD's drift regime (studies/table1/README.md), where
      the step moved them by -.105 per round at 0.1, -.016 at 0.01 and
      +.013 at 0.001 at Dir(0.05) (-.026 and +.003 at 0.01 and 0.001 at
      Dir(0.1)); 0.1 is `variant='reference'`. Set by the preset.
    noise: 'gaussian' | 'uniform'.
    noise_dim: The generator's noise size.
    transfer_weight: beta_tran (the hard-sample term).
    diversity_weight: beta_div.
    mask: 'agree' (push only samples the student still agrees on) | 'none'.
    ensemble: Class-level ensemble of 'logits' | 'probs'.
    generator_steps: Generator steps per iteration (0: one per teacher,
      the reference's).
    teachers: How the server holds the round's K client models: 'models'
      (one Keras model per client slot, each called in turn) | 'stacked'
      (their weights stacked [K, ...] and run as one model of grouped
      convolutions and batched matmuls, `fedftg_tf.StackedTeachers`; the
      same logits up to float round-off, so another draw of the same
      rounds). 'stacked' builds one model, not K, and its graph does not
      grow with K: at K = 100, start-up 15 s and 1.2 GB against 63 s and
      2.9 GB, rounds as fast or faster (studies/scale/README.md, "FedFTG's
      teachers"); it needs an architecture that fused clients run
      (`runtime.client_execution`).
  """

  SECTION: ClassVar[str] = 'fedftg'
  ALIASES: ClassVar[Mapping[str, hp.Alias]] = {
      'batch_size': hp.Alias('distill.batch_size', field_type=int),
      'lr_decay': hp.Alias('distill.lr_decay', field_type=float),
      'temperature': hp.Alias('distill.temperature', field_type=float),
      'student_training': hp.Alias('distill.student_training',
                                   field_type=bool),
      'kl_reduction': hp.Alias('distill.kl_reduction', field_type=str),
  }

  VARIANTS: ClassVar[Mapping[str, hp.Variant]] = VARIANTS

  variant: str = hp.field('', hp.one_of('', *VARIANTS))
  iterations: int = hp.field(10, hp.positive_int)
  student_steps: int = hp.field(5, hp.positive_int)
  generator_learning_rate: float = hp.field(0.01, hp.positive_number)
  student_learning_rate: float = hp.field(1e-3, hp.non_negative_number)
  noise: str = hp.field('gaussian', hp.one_of(*model_names.NOISE_KINDS))
  noise_dim: int = hp.field(100, hp.positive_int)
  transfer_weight: float = hp.field(1.0, hp.non_negative_number)
  diversity_weight: float = hp.field(1.0, hp.non_negative_number)
  mask: str = hp.field('agree', hp.one_of(*MASKS))
  ensemble: str = hp.field('logits', hp.one_of('logits', 'probs'))
  generator_steps: int = hp.field(0, hp.non_negative_int)
  teachers: str = hp.field('models', hp.one_of(*TEACHERS))


# FedFTG's recipe of the shared `distill` keys it reads: the reference's
# batch of 64 generated samples, T = 1, frozen BatchNorm statistics, the
# KL's mean over batch x classes and a 0.998 decay of both learning rates.
DISTILL_DEFAULTS: Mapping[str, Any] = types.MappingProxyType({
    'batch_size': 64, 'temperature': 1.0, 'student_training': False,
    'kl_reduction': 'mean', 'lr_decay': 0.998})
DISTILL_KEYS = tuple(DISTILL_DEFAULTS)
