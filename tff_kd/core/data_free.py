"""Pure-TF pieces shared by the data-free KD methods' generators.

FedGen (Zhu, Hong and Zhou, ICML 2021) and FedFTG (Zhang et al., CVPR 2022)
train a conditional generator at the server against the clients' models.
Both draw the labels to generate from the clients' label counts and keep
the samples diverse with the same noise-weighted diversity loss:

* `label_weights`: w[k, y] = n_{k,y} / sum_j n_{j,y}, each client's share of
  a label (FedGen's eq. 4 weighting, supplement Sec. 9);
* `qualified_labels` / `sample_labels`: the labels some client holds, and
  labels drawn from them with a stateless seed;
* `diversity_loss`: exp(-mean_{i,j} d(f_i, f_j) * mean_d (eps_i - eps_j)^2).
"""

import numpy as np
import tensorflow as tf

from tff_kd.core import distillation
from tff_kd.models import generators

FEATURE_METRICS = ('l1', 'l2', 'cosine')
_TINY = float(np.finfo(np.float32).tiny)


@tf.autograph.experimental.do_not_convert
def label_weights(label_counts: tf.Tensor) -> tf.Tensor:
  """w[k, y] = n_{k,y} / sum_j n_{j,y}; 1/K for a class nobody holds.

  Args:
    label_counts: [K, C] non-negative per-client label counts.

  Returns:
    [K, C] float32, columns summing to 1.
  """
  return distillation.normalize_weights(tf.cast(label_counts, tf.float32))


@tf.autograph.experimental.do_not_convert
def qualified_labels(label_counts: tf.Tensor,
                     min_count: float = 1.0) -> tf.Tensor:
  """[C] bool: some client holds more than `min_count` samples of the label.

  The reference's `MIN_SAMPLES_PER_LABEL = 1`; the server's generator only
  trains on these labels.
  """
  counts = tf.cast(label_counts, tf.float32)
  return tf.reduce_max(counts, axis=0) > min_count


@tf.autograph.experimental.do_not_convert
def sample_labels(label_probs: tf.Tensor, batch_size, seed) -> tf.Tensor:
  """[batch_size] int32 labels drawn from an (unnormalised) distribution.

  Args:
    label_probs: [C] non-negative weights (e.g. a `qualified_labels` mask
      cast to float, or label counts); not all zero.
    batch_size: Number of labels.
    seed: int or shape-[2] stateless seed.
  """
  probs = tf.reshape(tf.cast(label_probs, tf.float32), [1, -1])
  logits = tf.math.log(tf.maximum(probs, _TINY))
  seed = generators._as_seed(seed)  # pylint: disable=protected-access
  return tf.cast(
      tf.random.stateless_categorical(logits, batch_size, seed=seed)[0],
      tf.int32)


@tf.autograph.experimental.do_not_convert
def _pairwise(x: tf.Tensor, metric: str) -> tf.Tensor:
  """[B, B] distances between the rows of x [B, D]."""
  x = tf.reshape(tf.cast(x, tf.float32), [tf.shape(x)[0], -1])
  if metric == 'cosine':
    unit = tf.math.l2_normalize(x, axis=1)
    return 1.0 - tf.matmul(unit, unit, transpose_b=True)
  diff = x[:, None, :] - x[None, :, :]
  if metric == 'l1':
    return tf.reduce_mean(tf.abs(diff), axis=-1)
  return tf.reduce_mean(tf.square(diff), axis=-1)


@tf.autograph.experimental.do_not_convert
def diversity_loss(noise: tf.Tensor,
                   features: tf.Tensor,
                   *,
                   metric: str = 'l1') -> tf.Tensor:
  """exp(-mean_{i,j} d_feat(f_i, f_j) * mean_d (eps_i - eps_j)^2).

  FedGen's reference `DiversityLoss` (Zhu et al., ICML 2021; after Mao et
  al.'s mode-seeking loss); FedFTG's diversity term uses it on images
  (flattened).

  Args:
    noise: [B, noise_dim] noise the samples were generated from.
    features: [B, ...] generated samples.
    metric: Sample distance: 'l1' (reference), 'l2' (mean squared) or
      'cosine'.

  Returns:
    Scalar in (0, 1].

  Raises:
    ValueError: Unknown `metric`.
  """
  if metric not in FEATURE_METRICS:
    raise ValueError(f'diversity metric {metric!r} is unknown; choose one of '
                     f"{', '.join(FEATURE_METRICS)}")
  return tf.exp(-tf.reduce_mean(
      _pairwise(features, metric) * _pairwise(noise, 'l2')))
