"""DaFKD's domain awareness, measured in the mode the server uses.

Two clients with disjoint classes of scikit-learn's digits (0-4 and 5-9)
run the real client round (`dafkd_tf.client_round`: BatchNorm CNN, DCGAN
generator, their discriminator rows carried from round to round); the server
path (`teacher_outputs` in inference mode, `teacher_weights` of eq. 7) then
scores held-out real digits, the clients' own training images and the
generated pool.

What is pinned:

* the one-mode fix: after a client round, in the server's mode, every
  client's discriminator scores its own training images above 0.3 and at
  least 0.1 above the generated pool. With the old 'real_train' mode (real
  batches in training mode, generated ones in inference mode) the
  discriminator learnt the BatchNorm mode, and at least one client scores
  its own data below 0.1 at the server: that twin must fail. (The absolute
  scores move with the CPU's round-off: 0.59 / 0.49 own against 0.30 /
  0.12 pool on an AMD EPYC, where the twin gave 0.87 / 0.04; a fixed 0.5
  threshold passed on one machine and failed on the other.)
* eq. 7 puts more than half of the weight on the client that holds a
  held-out image's class: on >= 80% of them when the negatives are real
  images of the global distribution (the oracle pool, Theorem 1's p_g = p;
  measured 0.92 after one round), and on >= 65% with the generator after
  two rounds (measured 0.72 to 0.77 on this data; the generator, not the
  weighting, is the weaker link: BUILD_NOTES "DaFKD mechanism").
* the generated pool carries the domains only with the conditional
  candidates (`generator_labels='local'`, `aux_weight`, a projection
  discriminator): after two rounds eq. 7 gives the holder of a pool
  sample's pseudo label 0.99 of the weight on average and the averaged
  classifier labels 0.90 of G(z, y) y (asserted: >= 0.8, >= 0.6); the
  paper's unconditional pool gives 0.50 and 0.10 (asserted: <= 0.65,
  <= 0.3), i.e. chance for two clients and ten classes.
"""

from typing import NamedTuple

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import data as data_lib
from tff_kd import models
from tff_kd.methods.dafkd import dafkd_tf
from tff_kd.methods.dafkd import gan
from tff_kd.core import local_training
from tff_kd.federated import client_data
from tff_kd.models import generators

NOISE = 16
EPOCHS = 5


@pytest.fixture(scope='module')
def digits():
  d = data_lib.load_dataset('digits')
  parts = [np.where(d.y_train < 5)[0], np.where(d.y_train >= 5)[0]]
  return d, parts


def _stack(weights):
  return tff.learning.models.ModelWeights(
      [tf.stack(t) for t in zip(*[w.trainable for w in weights])],
      [tf.stack(t) for t in zip(*[w.non_trainable for w in weights])])


class _Round(NamedTuple):
  own_train: list  # Per client: server-mode score of its training images.
  pool: np.ndarray  # Per client: mean score on the generated pool.
  own_alpha: np.ndarray  # Held-out images: eq. 7's weight on the holder.
  pool_own_alpha: np.ndarray  # Pool: the weight on the holder of y.
  fidelity: float  # Share of G(z, y) the averaged classifier calls y.


def _rounds(digits, rounds, *, mode='inference', oracle=False,
            conditional=False) -> list[_Round]:
  """Runs DaFKD rounds on the two disjoint clients.

  `conditional`: the generator's labels from the client's batch, the aux
  classification term and a projection discriminator, scored at the server
  with the pool's pseudo labels (held-out images: their true labels).
  """
  d, parts = digits
  shape = d.x_train.shape[1:]
  clf = models.build_classifier('cnn', input_shape=shape, num_classes=10,
                                seed=0)
  disc = generators.build_discriminator_head(
      clf, seed=2, num_classes=10 if conditional else 0)
  gen = generators.build_dcgan_generator(noise_dim=NOISE, num_classes=10,
                                         image_shape=shape, seed=1)
  weights = local_training.model_weights
  clf_w = tf.nest.map_structure(tf.identity, weights(clf.model))
  gen_w = tf.nest.map_structure(tf.identity, weights(gen))
  rows = [[tf.identity(v) for v in dafkd_tf.discriminator_variables(disc)]
          ] * 2
  settings = gan.GanSettings(
      NOISE, 10, generator_form='non_saturating', discriminator_mode=mode,
      generator_labels='local' if conditional else 'uniform',
      aux_weight=1.0 if conditional else 0.0)
  sgd = tff.learning.optimizers.build_sgdm(0.05)
  adam = tff.learning.optimizers.build_adam(1e-3, beta_1=0.5, beta_2=0.99)
  # Oracle negatives: every other test image (all classes); the other half
  # is held out for the weights.
  negatives = tf.constant(d.x_test[::2]) if oracle else None
  held_x, held_y = d.x_test[1::2], d.y_test[1::2]
  valid = tf.constant([True, True])
  out = []
  for r in range(rounds):
    results = []
    for k in range(2):
      seed = tf.constant(10 * r + k, tf.int64)
      dataset = client_data.shuffled_batches(
          tf.constant(d.x_train[parts[k]]), tf.constant(d.y_train[parts[k]]),
          seed, client_data.LocalWork('epochs', EPOCHS, 16))
      results.append(dafkd_tf.client_round(
          gan.GanModels(clf, disc, gen), (clf_w, gen_w), rows[k], dataset,
          gan.GanOptimizers(sgd, adam), dafkd_tf.Round(tf.constant(0.05)), seed,
          settings,
          negatives_pool=negatives))
      rows[k] = results[-1].discriminator
    deltas = _stack([res.classifier_delta for res in results])
    disc_rows = [tf.stack(t) for t in zip(*rows)]
    gen_w = dafkd_tf.mean_update(
        gen_w, _stack([res.generator_delta for res in results]), valid)
    tf.nest.map_structure(lambda v, t: v.assign(t), weights(gen), gen_w)
    pool, pool_y = dafkd_tf.pseudo_pool(
        gen, 200, noise_dim=NOISE, num_classes=10,
        seed=dafkd_tf.pool_seed(0, r), with_labels=True)

    def scores(x, y):
      return dafkd_tf.teacher_outputs(
          clf, disc, clf_w, deltas, disc_rows, valid, tf.constant(x),
          labels=tf.constant(y) if conditional else None)[1].numpy()

    def own_alpha(x, y):
      alpha = dafkd_tf.teacher_weights(scores(x, y), valid).numpy()
      y = np.asarray(y)
      return np.where(y < 5, alpha[0], alpha[1])

    train_scores = scores(d.x_train, d.y_train)
    own_train = [train_scores[k][parts[k]].mean() for k in range(2)]
    round_out = (own_train, scores(pool, pool_y).mean(axis=1),
                 own_alpha(held_x, held_y), own_alpha(pool, pool_y))
    clf_w = dafkd_tf.mean_update(clf_w, deltas, valid)
    tf.nest.map_structure(lambda v, t: v.assign(t), weights(clf.model),
                          clf_w)
    fidelity = float(np.mean(np.argmax(clf.model(pool, training=False),
                                       -1) == pool_y.numpy()))
    out.append(_Round(*round_out, fidelity))
  return out


@pytest.fixture(scope='module')
def paper_rounds(digits) -> list[_Round]:
  """Two rounds of the paper's settings, shared by the tests that read
  them (a round depends only on the rounds before it: the first of two is
  the one-round run)."""
  return _rounds(digits, 2)


def test_server_mode_scores_own_data_real_and_generated_fake(paper_rounds):
  own_train, pool = paper_rounds[0][:2]
  assert min(own_train) > 0.3, own_train
  assert min(np.asarray(own_train) - pool) > 0.1, (own_train, pool)


def test_the_batchnorm_mode_shortcut_fails_the_same_check(digits):
  # The twin with the old shortcut: at the server a discriminator rejects
  # its own training data.
  own_train = _rounds(digits, 1, mode='real_train')[0].own_train
  assert min(own_train) < 0.1, own_train


def test_eq7_weights_the_holder_with_the_oracle_pool(digits):
  own_alpha = _rounds(digits, 1, oracle=True)[0].own_alpha
  assert np.mean(own_alpha > 0.5) >= 0.8


def test_eq7_weights_the_holder_with_the_generator(paper_rounds):
  own_alpha = paper_rounds[-1].own_alpha
  assert np.mean(own_alpha > 0.5) >= 0.65


def test_the_conditional_pool_carries_the_domains(digits, paper_rounds):
  """The generated pool itself knows the domains only with the conditional
  candidates (labels from the client's batch, aux term, projection head):
  eq. 7 puts the weight on the holder of a pool sample's pseudo label,
  and the averaged classifier calls most of G(z, y) y. The paper's
  unconditional pool, scored the same way, does neither."""
  paper = paper_rounds[-1]
  conditional = _rounds(digits, 2, conditional=True)[-1]
  assert np.mean(conditional.pool_own_alpha) >= 0.8, conditional
  assert conditional.fidelity >= 0.6, conditional
  assert np.mean(paper.pool_own_alpha) <= 0.65, paper
  assert paper.fidelity <= 0.3, paper
