"""Does a per-sample teacher weighting know who knows? Diagnostics, pure TF.

Domain-aware distillation (DaFKD, Wang et al., CVPR 2023, eqs. 7-8; FedD3A,
Su, Li, Xue, AAAI 2023, eqs. 6-7) rests on one claim: for a sample x the
weights alpha[k, x] put more mass on the teachers whose training data
covers x than uniform weights (FedDF's plain average) do, and the weighted
ensemble is therefore more accurate. These functions measure that claim on
a labeled set the server holds (real images, scored exactly as the server
scores its distillation pool), plus the quality of a generated pool.

In a simulation the partition is known, so "covers x" can be made concrete:
client k *holds* label c when at least `share` of its training examples
have label c (`holders`). With label shares s[k, c] and a sample of label y:

* holder mass: sum_{k holds y} alpha[k, x], against the uniform mass
  |holders| / K_t of the same teachers; their ratio is 1 for uninformed
  weights and up to K_t / |holders| for weights that find the holders.
  Samples whose label no teacher, or every teacher, holds carry no
  information about the weighting and are left out of both means.
* ensemble accuracies of the weighted target sum_k alpha[k, x] p_k(x), of the
  uniform one, and of the oracle one that averages only the holders (all
  teachers where nobody holds y): weighted > uniform is what the weighting
  is for; the oracle bounds it.

Pool quality (`pool_quality`): the teachers' mean max-probability and
prediction entropy on the pool, and the class histogram of the ensemble's
argmax, summarised by its entropy (log C when every class appears equally)
and its largest class share. A generator whose samples look like nothing
gets unconfident teachers and a histogram on a few classes.

These are simulation-only diagnostics (they read the partition's label
counts); they never feed back into training.
"""

from typing import NamedTuple

import numpy as np
import tensorflow as tf

_TINY = float(np.finfo(np.float32).tiny)


def label_shares(counts: tf.Tensor) -> tf.Tensor:
  """[M, C] label shares s[k, c] = n_{k,c} / n_k (zero rows stay zero)."""
  counts = tf.cast(counts, tf.float32)
  return counts / tf.maximum(tf.reduce_sum(counts, axis=1, keepdims=True),
                             1.0)


def holders(shares: tf.Tensor, labels: tf.Tensor, valid: tf.Tensor,
            share: float) -> tf.Tensor:
  """[M, N] bool: teacher k (a valid row) holds the label of sample i.

  Args:
    shares: [M, C] label shares of each teacher's training data.
    labels: [N] int labels of the samples.
    valid: [M] bool, rows that hold a teacher.
    share: A teacher holds label c when s[k, c] >= share (> 0).
  """
  per_sample = tf.gather(tf.cast(shares, tf.float32),
                         tf.cast(labels, tf.int32), axis=1)
  return tf.logical_and(per_sample >= share,
                        tf.cast(valid, tf.bool)[:, tf.newaxis])


class WeightDiagnostics(NamedTuple):
  """What `weight_diagnostics` reports (scalars, float32).

  Attributes:
    holder_mass: Mean over informative samples of the weight on holders.
    uniform_holder_mass: The same for uniform weights, |holders| / K_t.
    holder_ratio: holder_mass / uniform_holder_mass (1: uninformed).
    informative_fraction: Fraction of samples with 0 < |holders| < K_t.
    accuracy_weighted: Accuracy of sum_k alpha p_k.
    accuracy_uniform: Accuracy of the plain mean of p_k.
    accuracy_oracle: Accuracy of the holders' plain mean.
    label_mass_weighted: Mean over samples of the probability sum_k alpha
      p_k puts on the sample's label (teachers at T = 1): how much of the
      ensemble's mass a soft target would put on the right class.
    label_mass_uniform: The same for the plain mean of p_k.
  """

  holder_mass: tf.Tensor
  uniform_holder_mass: tf.Tensor
  holder_ratio: tf.Tensor
  informative_fraction: tf.Tensor
  accuracy_weighted: tf.Tensor
  accuracy_uniform: tf.Tensor
  accuracy_oracle: tf.Tensor
  label_mass_weighted: tf.Tensor
  label_mass_uniform: tf.Tensor


def _accuracy(probs: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
  return tf.reduce_mean(tf.cast(tf.equal(
      tf.argmax(probs, axis=-1, output_type=tf.int32),
      tf.cast(labels, tf.int32)), tf.float32))


def _label_mass(probs: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
  return tf.reduce_mean(tf.gather(probs, tf.cast(labels, tf.int32),
                                  axis=1, batch_dims=1))


def _mean_over(values: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
  mask = tf.cast(mask, tf.float32)
  return tf.reduce_sum(values * mask) / tf.maximum(tf.reduce_sum(mask), 1.0)


def weight_diagnostics(alpha: tf.Tensor, logits: tf.Tensor,
                       labels: tf.Tensor, holder: tf.Tensor,
                       valid: tf.Tensor) -> WeightDiagnostics:
  """Holder mass and ensemble accuracies of per-sample weights.

  Args:
    alpha: [M, N] weights, columns summing to 1 over the valid rows.
    logits: [M, N, C] teacher logits on the labeled samples.
    labels: [N] int labels.
    holder: [M, N] bool from `holders`.
    valid: [M] bool, rows that hold a teacher.

  Returns:
    A `WeightDiagnostics`.
  """
  alpha = tf.cast(alpha, tf.float32)
  valid_f = tf.cast(valid, tf.float32)[:, tf.newaxis]
  holder_f = tf.cast(holder, tf.float32)
  num_teachers = tf.maximum(tf.reduce_sum(valid_f), 1.0)
  num_holders = tf.reduce_sum(holder_f, axis=0)
  informative = tf.logical_and(num_holders > 0, num_holders < num_teachers)
  mass = tf.reduce_sum(alpha * holder_f, axis=0)
  holder_mass = _mean_over(mass, informative)
  uniform_mass = _mean_over(num_holders / num_teachers, informative)
  probs = tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1)
  uniform = valid_f / num_teachers
  oracle = tf.where(num_holders > 0,
                    holder_f / tf.maximum(num_holders, 1.0),
                    uniform + 0.0 * holder_f)

  def ensemble(weights):
    return tf.einsum('kn,knc->nc', weights * valid_f, probs)

  weighted = ensemble(alpha)
  plain = ensemble(uniform + 0.0 * holder_f)
  return WeightDiagnostics(
      holder_mass=holder_mass,
      uniform_holder_mass=uniform_mass,
      holder_ratio=holder_mass / tf.maximum(uniform_mass, _TINY),
      informative_fraction=tf.reduce_mean(tf.cast(informative, tf.float32)),
      accuracy_weighted=_accuracy(weighted, labels),
      accuracy_uniform=_accuracy(plain, labels),
      accuracy_oracle=_accuracy(ensemble(oracle), labels),
      label_mass_weighted=_label_mass(weighted, labels),
      label_mass_uniform=_label_mass(plain, labels))


class PoolQuality(NamedTuple):
  """What `pool_quality` reports (scalars, float32).

  Attributes:
    max_prob: Mean over valid teachers and pool samples of max_c p_k(c|x).
    entropy: The same for the prediction entropy (nats).
    class_entropy: Entropy (nats) of the class histogram of the target's
      argmax; log C when all classes appear equally often.
    top_class_share: The largest class share of that histogram.
  """

  max_prob: tf.Tensor
  entropy: tf.Tensor
  class_entropy: tf.Tensor
  top_class_share: tf.Tensor


def pool_quality(logits: tf.Tensor, valid: tf.Tensor,
                 target: tf.Tensor) -> PoolQuality:
  """How confident and how class-diverse the teachers are on a pool.

  Args:
    logits: [M, N, C] teacher logits on the pool.
    valid: [M] bool, rows that hold a teacher.
    target: [N, C] the ensemble target (its argmax gives the histogram).

  Returns:
    A `PoolQuality`.
  """
  probs = tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1)
  entropy = -tf.reduce_sum(probs * tf.math.log(tf.maximum(probs, _TINY)),
                           axis=-1)
  rows = tf.broadcast_to(tf.cast(valid, tf.bool)[:, tf.newaxis],
                         tf.shape(entropy))
  num_classes = tf.shape(target)[-1]
  histogram = tf.math.bincount(
      tf.argmax(target, axis=-1, output_type=tf.int32),
      minlength=num_classes, maxlength=num_classes, dtype=tf.float32)
  histogram /= tf.maximum(tf.reduce_sum(histogram), 1.0)
  return PoolQuality(
      max_prob=_mean_over(tf.reduce_max(probs, axis=-1), rows),
      entropy=_mean_over(entropy, rows),
      class_entropy=-tf.reduce_sum(
          histogram * tf.math.log(tf.maximum(histogram, _TINY))),
      top_class_share=tf.reduce_max(histogram))
