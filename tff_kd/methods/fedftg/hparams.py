"""FedFTG's hyper-parameters: the `config.fedftg` section.

Defaults, documentation and checks in one place (`tff_kd.hparams`).
"""

import dataclasses
from typing import ClassVar

from tff_kd import hparams as hp
from tff_kd.core import distillation
from tff_kd.methods.fedftg import fedftg_tf
from tff_kd.models import generators


@dataclasses.dataclass(frozen=True)
class FedFTGHparams(hp.Hparams):
  """FedFTG (Zhang et al., CVPR 2022), `config.fedftg`.

  Defaults: the reference's values where known.

  Attributes:
    iterations: Generator step(s) + student steps, per round.
    student_steps: Student steps per iteration (through
      `distillation.distill`).
    batch_size: Generated samples per generator step and student batch.
    generator_learning_rate: The generator's Adam learning rate.
    student_learning_rate: The student's SGD learning rate (0 leaves the
      student unchanged: the switched-off twin of the mechanism test).
    lr_decay: Per-round factor of both learning rates, in (0, 1].
    temperature: Distillation temperature (also the transfer term's).
    student_training: False: the student's BatchNorm statistics are
      frozen; True: they move towards the generated data's.
    noise: 'gaussian' | 'uniform'.
    noise_dim: The generator's noise size.
    transfer_weight: beta_tran (the hard-sample term).
    diversity_weight: beta_div.
    mask: 'agree' (push only samples the student still agrees on) | 'none'.
    ensemble: Class-level ensemble of 'logits' | 'probs'.
    generator_steps: Generator steps per iteration (0: one per teacher,
      the reference's).
    kl_reduction: The student KD loss over batch x classes: 'mean' (the
      reference's: SGD's step is C times smaller) | 'batchmean'.
  """

  SECTION: ClassVar[str] = 'fedftg'

  iterations: int = hp.field(10, hp.positive_int)
  student_steps: int = hp.field(5, hp.positive_int)
  batch_size: int = hp.field(64, hp.positive_int)
  generator_learning_rate: float = hp.field(0.01, hp.positive_number)
  student_learning_rate: float = hp.field(0.1, hp.non_negative_number)
  lr_decay: float = hp.field(0.998, hp.unit_interval)
  temperature: float = hp.field(1.0, hp.positive_number)
  student_training: bool = hp.field(False, hp.boolean)
  noise: str = hp.field('gaussian', hp.one_of(*generators.NOISE_KINDS))
  noise_dim: int = hp.field(100, hp.positive_int)
  transfer_weight: float = hp.field(1.0, hp.non_negative_number)
  diversity_weight: float = hp.field(1.0, hp.non_negative_number)
  mask: str = hp.field('agree', hp.one_of(*fedftg_tf.MASKS))
  ensemble: str = hp.field('logits', hp.one_of('logits', 'probs'))
  generator_steps: int = hp.field(0, hp.non_negative_int)
  kl_reduction: str = hp.field('mean', hp.one_of(*distillation.KL_REDUCTIONS))
