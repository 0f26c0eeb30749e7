"""FedGen's hyper-parameters: the `config.fedgen` section.

Defaults, documentation and checks in one place (`tff_kd.hparams`).
"""

import dataclasses
from typing import ClassVar, Mapping

from tff_kd import hparams as hp
from tff_kd.models import names as model_names

# The teachers' ensembles in the generator's loss (`ensemble`;
# `fedgen_tf.teacher_loss`).
TEACHER_ENSEMBLES = ('per_head', 'logits')


@dataclasses.dataclass(frozen=True)
class FedGenHparams(hp.Hparams):
  """FedGen (Zhu, Hong, Zhou, ICML 2021), `config.fedgen`.

  Defaults: its reference code on MNIST.

  Attributes:
    generator_steps: Server Adam steps of the generator per round.
    generator_batch_size: Generated features per server step.
    generator_learning_rate: The generator's Adam learning rate.
    noise: 'gaussian' (the paper) | 'uniform' (the reference code).
    noise_dim: d_n, the generator's noise size.
    hidden: d_h, the generator's hidden width.
    output_activation: The generator's last activation: '' = linear (the
      reference) | a Keras activation name, e.g. 'relu'.
    ensemble: The teachers' ensemble in the generator's loss: 'per_head'
      (the reference: each head's loss, weighted) | 'logits' (the paper:
      the weighted logits inside one loss). Old name: `teacher_ensemble`,
      read until the next release.
    teacher_weight: Weight of the generator's teacher loss.
    diversity_weight: Weight of its diversity loss.
    local_alpha: c0 of the clients' generated-feature CE, x
      coefficient_decay^round.
    local_beta: c0 of the clients' latent KL term (0 = the paper's
      objective).
    coefficient_decay: Per-round decay of both, in (0, 1].
    local_gen_batch_size: B', generated labels per client step.
    start_round: The clients' regulariser is off before this round.
    reference_steps: Local steps the coefficients are for (reference: 20);
      longer client rounds scale them by reference_steps / steps (0:
      never).
  """

  SECTION: ClassVar[str] = 'fedgen'
  ALIASES: ClassVar[Mapping[str, hp.Alias]] = {
      'teacher_ensemble': hp.Alias('ensemble')}

  generator_steps: int = hp.field(50, hp.positive_int)
  generator_batch_size: int = hp.field(32, hp.positive_int)
  generator_learning_rate: float = hp.field(3e-4, hp.positive_number)
  noise: str = hp.field('gaussian', hp.one_of(*model_names.NOISE_KINDS))
  noise_dim: int = hp.field(32, hp.positive_int)
  hidden: int = hp.field(256, hp.positive_int)
  output_activation: str = hp.field('', hp.activation)
  ensemble: str = hp.field('per_head', hp.one_of(*TEACHER_ENSEMBLES))
  teacher_weight: float = hp.field(1.0, hp.non_negative_number)
  diversity_weight: float = hp.field(1.0, hp.non_negative_number)
  local_alpha: float = hp.field(10.0, hp.non_negative_number)
  local_beta: float = hp.field(10.0, hp.non_negative_number)
  coefficient_decay: float = hp.field(0.98, hp.unit_interval)
  local_gen_batch_size: int = hp.field(32, hp.positive_int)
  start_round: int = hp.field(1, hp.non_negative_int)
  reference_steps: int = hp.field(20, hp.non_negative_int)
