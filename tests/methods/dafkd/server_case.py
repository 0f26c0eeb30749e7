"""A seeded DaFKD server round's inputs, shared by the server-round tests.

Two received clients: the broadcast classifier plus large seeded deltas,
and the discriminator head plus seeded offsets, so that their teachers and
eq. (7) weights differ well beyond round-off.
"""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import local_training
from tff_kd.methods.dafkd import dafkd_tf
from tff_kd.methods.dafkd import gan


def perturbed(values, scale: float, seed: int) -> list[tf.Tensor]:
  """Seeded Gaussian tensors of the shapes of `values`, times `scale`."""
  rng = np.random.default_rng(seed)
  return [tf.constant(scale * rng.standard_normal(v.shape), tf.float32)
          for v in values]


def two_clients(models: gan.GanModels, delta_scale: float,
                row_scale: float) -> tuple:
  """(broadcast (classifier, generator) weights, two clients' `Uploads`).

  Args:
    models: The built `gan.GanModels` whose current values are broadcast.
    delta_scale: Scale of the clients' classifier deltas.
    row_scale: Scale of their discriminator rows' offsets.
  """
  clf, disc, gen = models
  weights = local_training.model_weights
  clf_w = tf.nest.map_structure(tf.identity, weights(clf.model))
  gen_w = tf.nest.map_structure(tf.identity, weights(gen))
  deltas = tff.learning.models.ModelWeights(
      [tf.stack([d0, d1]) for d0, d1 in zip(
          perturbed(clf_w.trainable, delta_scale, 0),
          perturbed(clf_w.trainable, delta_scale, 1))],
      [tf.stack([v, v]) for v in clf_w.non_trainable])
  disc_vars = dafkd_tf.discriminator_variables(disc)
  rows = [tf.stack([v + r0, v + r1]) for v, r0, r1 in zip(
      disc_vars, perturbed(disc_vars, row_scale, 2),
      perturbed(disc_vars, row_scale, 3))]
  uploads = dafkd_tf.Uploads(
      deltas, tff.learning.models.ModelWeights(
          [tf.zeros_like(w) for w in gen_w.trainable],
          list(gen_w.non_trainable)), tf.constant([True, True]), rows)
  return (clf_w, gen_w), uploads
