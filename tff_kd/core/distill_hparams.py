"""The settings of one server distillation: the `config.distill` section.

Kept apart from `tff_kd.core.distillation` (the TensorFlow that runs it) so
that the config tree imports no TensorFlow. The distillation itself is
Hinton et al.'s (2015) tempered KL to an ensemble's targets, as FedDF (Lin
et al., NeurIPS 2020, Algorithm 1) runs it at the server.
"""

import dataclasses
from typing import ClassVar

from absl import logging
import numpy as np

from tff_kd import errors
from tff_kd import hparams as hp

VALIDATIONS = ('pool', 'labeled', 'auto')
KL_REDUCTIONS = ('batchmean', 'mean')
ACCEPTS = ('always', 'no_worse')


def _integer(key: str, value) -> None:
  """Any integer (a seed)."""
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
    raise errors.ConfigError(f'{key} must be an integer, got {value!r}')


@dataclasses.dataclass(frozen=True)
class DistillConfig(hp.Hparams):
  """Settings of one server distillation: the `config.distill` section.

  The defaults are the config's (CPU-sized: 200 steps per round). FedDF's
  reference settings are Adam 1e-3, batch 128, up to 10,000 steps with
  cosine decay, validation every 100 steps, patience 10 (1,000 steps) and
  clipping at 5.

  Attributes:
    steps: Maximum optimiser steps (>= 1). FedDF: 10,000; DaFKD: 1,600.
    batch_size: Minibatch size (>= 1); capped at the training part's size.
    learning_rate: The distillation optimiser's learning rate (Adam); 0
      leaves the student where it is (the mechanism tests' switched-off
      twin).
    temperature: T > 0 of the student's softmax and the T^2 scaling; build
      tensor targets with the same T.
    clip_norm: Global-norm gradient clipping threshold; 0 disables it. FedDF
      clips at 5.
    val_fraction: Fraction of the pool held out (seeded) for early stopping,
      in [0, 1); 0 disables early stopping.
    eval_every: Steps between validations (>= 1). Also the length of the
      windows over which `first_loss` and `last_loss` are averaged.
    patience: Validations without improvement before stopping (>= 1). FedDF
      validates every 100 steps and stops after 1,000 steps without
      improvement, i.e. eval_every=100, patience=10.
    cosine_decay: Whether to decay the learning rate to 0 over `steps` with a
      half cosine (FedDF's code); otherwise it is constant.
    student_training: Whether the student runs in training mode (BatchNorm
      uses and updates batch statistics, dropout is on), as FedDF's code
      does. Then the pool's statistics replace the averaged model's
      BatchNorm statistics, which costs accuracy when the pool is from
      another domain or generated. False (default) keeps the student in
      inference mode: it is trained with, and keeps, the averaged model's
      statistics, the ones it is evaluated with.
    validation: What early stopping watches: 'pool' (the KD loss on the
      held-out `val_fraction` of the pool; no early stopping when
      `val_fraction` is 0), 'labeled' (the cross-entropy on the server's
      labeled validation set, `distill(..., labeled=...)`; every
      `eval_every` steps, `patience` times without improvement) or 'auto'
      ('labeled' where the server step is given labeled images, else
      'pool': FedDF's recipe, which early-stops on validation data).
    accept: 'always', or 'no_worse': keep the distilled student only if its
      accuracy on the labeled validation set is at least the initial
      student's; otherwise return the initial student (a guard that no paper
      has; it needs `labeled`).
    seed: Seed of the validation split and of the batch order; set by the
      program (the experiment's seed), not a config key.
    kl_reduction: 'batchmean' (Hinton's loss, per example) or 'mean' (also
      divided by the number of classes, as DaFKD's and FedFTG's code
      reduce; with SGD the step is then C times smaller). See
      `tff_kd.core.distillation.kd_loss`.
    lr_decay: The server step's learning rates are multiplied by
      lr_decay**round (FedFTG: its generator's and its student's; reference
      0.998). 1: constant across rounds; the methods that do not read it
      (`Method.distill_keys`) refuse another value.

  A method may declare its own defaults of these keys
  (`Method.distill_defaults`: FedFTG's batch size, temperature, reduction
  and decay are its reference's); a config's explicit value applies to
  whichever method runs.
  """

  SECTION: ClassVar[str] = 'distill'

  steps: int = hp.field(200, hp.positive_int)
  batch_size: int = hp.field(128, hp.positive_int)
  learning_rate: float = hp.field(1e-3, hp.non_negative_number)
  temperature: float = hp.field(1.0, hp.positive_number)
  clip_norm: float = hp.field(5.0, hp.non_negative_number)
  val_fraction: float = hp.field(0.1, hp.unit_fraction)
  eval_every: int = hp.field(50, hp.positive_int)
  patience: int = hp.field(4, hp.positive_int)
  cosine_decay: bool = hp.field(True, hp.boolean)
  student_training: bool = hp.field(False, hp.boolean)
  validation: str = hp.field('pool', hp.one_of(*VALIDATIONS))
  accept: str = hp.field('always', hp.one_of(*ACCEPTS))
  seed: int = hp.field(0, _integer, config=False)
  kl_reduction: str = hp.field('batchmean', hp.one_of(*KL_REDUCTIONS))
  lr_decay: float = hp.field(1.0, hp.unit_interval)

  @classmethod
  def plain(cls, **changes) -> 'DistillConfig':
    """Plain minimisation: no clipping, no held-out split, a constant rate.

    Also loss windows (`eval_every`) of 100 steps and patience 10, so that
    `changes` of those two alone turn on nothing else.

    Args:
      **changes: Fields to set otherwise.
    """
    return cls(clip_norm=0.0, val_fraction=0.0, cosine_decay=False,
               eval_every=100, patience=10).replace(**changes)

  @property
  def needs_labeled(self) -> bool:
    """Whether `distill` needs the server's labeled validation set."""
    return self.validation == 'labeled' or self.accept == 'no_worse'

  def check_labeled(self, val_size: int) -> None:
    """`errors.ConfigError` if the config needs a labeled set of size 0."""
    if self.needs_labeled and val_size < 1:
      raise errors.ConfigError(
          f'distill.validation={self.validation!r} with '
          f'distill.accept={self.accept!r} needs a labeled server validation '
          'set (server_data.val_size > 0)')

  def check_settings(self, settings) -> None:
    reads = settings.method.distill_keys
    if not reads or {'validation', 'accept'} & set(reads):
      self.check_labeled(settings.server_data.val_size)
    if self.lr_decay != 1 and 'lr_decay' not in reads:
      raise errors.ConfigError(
          f'distill.lr_decay={self.lr_decay}: {settings.method.name} keeps '
          'its server learning rate across rounds; only methods whose '
          'server step decays it read this key (FedFTG). Use 1')
    if reads:
      generic = type(self)()
      ignored = [f'{f.name}={getattr(self, f.name)!r}'
                 for f in hp.config_fields(type(self))
                 if f.name not in reads and
                 getattr(self, f.name) != getattr(generic, f.name)]
      if ignored:
        # Not refused: a shared config may set them for another method.
        logging.warning(
            '%s ignores distill.%s: its server step reads only distill.%s',
            settings.method.name, ', distill.'.join(ignored),
            ', distill.'.join(reads))
