"""FedFTG's pure-TF pieces: class-wise teacher, label sampling, hard samples.

FedFTG (Zhang, Shen, Ding, Tao and Duan, "Fine-tuning Global Model via
Data-Free Knowledge Distillation for Non-IID Federated Learning", CVPR 2022).
After FedAvg, the server fine-tunes the averaged model (the student) without
data: a conditional generator G(z, y) (`models.generators.
build_image_generator`) and the student play a game against the ensemble of
the K uploaded client models. One server iteration (10 per round in the
reference): one generator step on `hard_sample_generator_loss`, then 5
student steps distilling the class-wise ensemble (`distillation.kd_loss` on
`class_weighted_teacher`).

No text of the paper is available in this repository; what follows is the
CVPR 2022 paper's method as this module's author understands it, and every
coefficient is configurable:

* Customized label sampling: y ~ p(y) with p(c) proportional to the global
  count n_c = sum_k n_{k,c} (`customized_label_sampling`), so the generator
  visits classes as often as the federation holds them.
* Class-level ensemble: client k's weight for a sample of conditional class
  c is alpha_{k,c} = n_{k,c} / sum_j n_{j,c} (`class_ensemble_weights`;
  uniform 1/K for a class nobody holds); the teacher is
      D_T(x) = softmax(sum_k alpha_{k,y} z_k(x))          (ensemble='logits')
  or sum_k alpha_{k,y} softmax(z_k(x)) (ensemble='probs').
* Generator objective, minimised over G:
      L_G = L_fid - beta_tran * L_tran + beta_div * L_div,
      L_fid  = 1/B sum_i -log D_T(x_i)[y_i]          (fidelity: the teacher
               recognises the conditional label),
      L_tran = 1/B sum_i w_i KL(D_T(x_i) || softmax(s(x_i) / T)) * T^2
               (hard-sample mining: make the student disagree with the
               teacher), w_i = 1[argmax s(x_i) = argmax D_T(x_i)] with
               `mask='agree'` (only samples the student still agrees on are
               pushed towards the decision boundary, as in the adversarial
               data-free KD FedFTG builds on) or w_i = 1 with `mask='none'`,
      L_div  = `fedgen.diversity_loss(z, x)` (exp(-mean pairwise l1 sample
               distance x squared noise distance), Mao et al., CVPR 2019).
  beta_tran = beta_div = 1 by default.
"""

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tff_kd.core import distillation
from tff_kd.core import fedgen

MASKS = ('agree', 'none')
_TINY = float(np.finfo(np.float32).tiny)


# FedFTG's class-level ensemble weights n_{k,c} / sum_j n_{j,c} (uniform 1/K
# where no client holds class c) are FedGen's label-count weights.
class_ensemble_weights = fedgen.label_weights


def customized_label_sampling(label_counts: tf.Tensor, batch_size,
                              seed) -> tf.Tensor:
  """[batch_size] int32 labels with p(c) = sum_k n_{k,c} / sum n.

  Uniform over classes if every count is 0. Stateless: the same seed gives
  the same labels.

  Args:
    label_counts: [K, C] (or [C]) non-negative counts.
    batch_size: Number of labels (int or scalar tensor).
    seed: int or shape-[2] stateless seed.
  """
  counts = tf.cast(label_counts, tf.float32)
  if counts.shape.rank == 2:
    counts = tf.reduce_sum(counts, axis=0)
  total = tf.reduce_sum(counts)
  probs = tf.where(total > 0, counts, tf.ones_like(counts))
  return fedgen.sample_labels(probs, batch_size, seed)


def class_weighted_teacher(teacher_logits: tf.Tensor,
                           labels: tf.Tensor,
                           label_counts: tf.Tensor,
                           *,
                           temperature: float = 1.0,
                           ensemble: str = 'logits') -> tf.Tensor:
  """The class-level ensemble D_T on samples generated for `labels`.

  Args:
    teacher_logits: [K, B, C] client logits on the generated batch.
    labels: [B] conditional labels of the batch.
    label_counts: [K, C] per-client label counts.
    temperature: Softmax temperature.
    ensemble: 'logits' (weighted logits, then softmax) or 'probs'.

  Returns:
    [B, C] teacher probabilities (`distillation.weighted_ensemble`).
  """
  alpha = tf.gather(class_ensemble_weights(label_counts),
                    tf.cast(labels, tf.int32), axis=1)
  return distillation.weighted_ensemble(
      teacher_logits, alpha, temperature=temperature, ensemble=ensemble)


class HardSampleLoss(NamedTuple):
  """`hard_sample_generator_loss` and its unweighted terms (float32)."""

  loss: tf.Tensor
  fidelity: tf.Tensor
  transfer: tf.Tensor
  diversity: tf.Tensor


def hard_sample_generator_loss(student_logits: tf.Tensor,
                               teacher_probs: tf.Tensor,
                               labels: tf.Tensor,
                               *,
                               noise: tf.Tensor | None = None,
                               samples: tf.Tensor | None = None,
                               transfer_weight: float = 1.0,
                               diversity_weight: float = 1.0,
                               temperature: float = 1.0,
                               mask: str = 'agree') -> HardSampleLoss:
  """FedFTG's generator loss L_G (see module docstring), minimised over G.

  loss = fidelity - transfer_weight * transfer + diversity_weight * diversity.

  Args:
    student_logits: [B, C] student (global model) logits on the samples.
    teacher_probs: [B, C] class-level ensemble D_T (e.g.
      `class_weighted_teacher` at temperature 1; gradients flow through it
      into the generator).
    labels: [B] conditional labels.
    noise: [B, noise_dim] the generator's noise (for the diversity term).
    samples: [B, ...] the generated samples (for the diversity term).
      Without `noise` and `samples` the diversity term is 0.
    transfer_weight: beta_tran.
    diversity_weight: beta_div.
    temperature: T of the KL in the transfer term.
    mask: 'agree' (only samples where student and teacher argmaxes agree)
      or 'none'.

  Returns:
    A `HardSampleLoss`.

  Raises:
    ValueError: Unknown `mask`, or only one of `noise` / `samples`.
  """
  if mask not in MASKS:
    raise ValueError(f"mask {mask!r} is unknown; choose one of {', '.join(MASKS)}")
  if (noise is None) != (samples is None):
    raise ValueError('the diversity term needs both noise and samples')
  student_logits = tf.cast(student_logits, tf.float32)
  teacher_probs = tf.cast(teacher_probs, tf.float32)
  labels = tf.cast(labels, tf.int32)
  picked = tf.gather(teacher_probs, labels, axis=1, batch_dims=1)
  fidelity = -tf.reduce_mean(tf.math.log(tf.maximum(picked, _TINY)))
  # Tempered teacher for the KL: re-normalised p^(1/T) equals softmax(z/T)
  # for the logit ensemble; T = 1 (the default) leaves it unchanged.
  if temperature == 1.0:
    tempered = teacher_probs
  else:
    tempered = tf.nn.softmax(
        tf.math.log(tf.maximum(teacher_probs, _TINY)) / temperature, axis=-1)
  # pylint: disable-next=protected-access
  kl = distillation.kl_per_example(student_logits, tempered, temperature)
  if mask == 'agree':
    weights = tf.cast(tf.equal(
        tf.argmax(student_logits, axis=-1), tf.argmax(teacher_probs, axis=-1)),
                      tf.float32)
  else:
    weights = tf.ones_like(kl)
  transfer = tf.reduce_mean(weights * kl) * temperature * temperature
  if noise is None:
    diversity = tf.constant(0.0)
  else:
    diversity = fedgen.diversity_loss(noise, samples)
  loss = fidelity - transfer_weight * transfer + diversity_weight * diversity
  return HardSampleLoss(loss, fidelity, transfer, diversity)
