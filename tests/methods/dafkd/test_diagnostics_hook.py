"""DaFKD's server round and its one diagnostics hook (`tff_kd.core.diagnostics`).

`dafkd_tf.server_round` is the algorithm alone (Wang et al., CVPR 2023,
Algorithm 1 lines 9-13); its mechanism metrics come from the hook it calls
once. Pinned here:

* the round's result (classifier, generator, distillation) is bit-identical
  with the hook off, with DaFKD's hook (labeled-image diagnostics and the
  uniform-weight twin, which both overwrite the server's models) and with
  any other hook;
* DaFKD's hook reports its metrics, a foreign hook sees the round's view
  (pool, eq. 7's weights, eq. 8's target, the student before and after) and
  is called exactly once per round;
* the skipped rounds of `diagnostics_every` read NaN.
"""

import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import models
from tff_kd.core import diagnostics as core_diagnostics
from tff_kd.core import distill_hparams
from tff_kd.methods.dafkd import dafkd_tf
from tff_kd.methods.dafkd import diagnostics as dafkd_diagnostics
from tff_kd.methods.dafkd import gan
from tff_kd.models import generators
from tests.methods.dafkd import server_case as server_case_lib

NOISE = 8
SHAPE = (8, 8, 1)
CLASSES = 10
POOL = 16
SETTINGS = dafkd_tf.ServerSettings(
    gan.GanSettings(NOISE, CLASSES),
    distill_hparams.DistillConfig.plain(steps=3, batch_size=8, seed=5,
                                     temperature=2.0),
    POOL, pool_from_broadcast=True)


@pytest.fixture(scope='module')
def case():
  """Models, broadcast weights, two clients' uploads, labeled images."""
  clf = models.build_classifier('cnn', input_shape=SHAPE,
                                num_classes=CLASSES, seed=0)
  disc = generators.build_discriminator_head(clf, seed=2)
  gen = generators.build_image_generator(
      noise_dim=NOISE, num_classes=CLASSES, image_shape=SHAPE, hidden=(16,),
      seed=1)
  models_ = gan.GanModels(clf, disc, gen)
  weights, uploads = server_case_lib.two_clients(models_, 0.5, 1.0)
  rng = np.random.default_rng(4)
  validation = dafkd_diagnostics.Validation(
      tf.constant(rng.uniform(-1, 1, (24, *SHAPE)), tf.float32),
      tf.constant(rng.integers(0, CLASSES, 24), tf.int32),
      tf.constant(rng.integers(0, 5, (2, CLASSES)), tf.float32), 0.05)
  return models_, weights, uploads, validation


def _round(case, hook):
  models_, weights, uploads, validation = case
  return dafkd_tf.server_round(
      models_, tff.learning.optimizers.build_sgdm(0.3), weights, uploads,
      SETTINGS, dafkd_tf.pool_seed(0, tf.constant(2)),
      labeled=(validation.x, validation.y), diagnostics=hook)


def _dafkd_hook(case, **kwargs):
  return dafkd_diagnostics.RoundDiagnostics(
      SETTINGS, tff.learning.optimizers.build_sgdm(0.3), case[3], **kwargs)


def _assert_same_round(a, b):
  for x, y in zip(tf.nest.flatten((a.classifier, a.generator, a.distill)),
                  tf.nest.flatten((b.classifier, b.generator, b.distill))):
    np.testing.assert_array_equal(x, y)


def test_the_hook_does_not_change_the_round(case):
  off = _round(case, None)
  assert not off.metrics
  on = _round(case, _dafkd_hook(case, twin_student=True))
  _assert_same_round(off, on)
  names = set(on.metrics)
  assert {'alpha_entropy', 'mean_disc_score', 'agreement_before',
          'agreement_after', 'label_fidelity', 'target_entropy',
          'twin_labeled_accuracy_after', 'holder_ratio',
          'pool_holder_ratio'} <= names
  assert all(math.isfinite(float(v)) for v in on.metrics.values())
  assert float(on.metrics['alpha_sum_error']) < 1e-5


def test_any_hook_sees_the_round_once(case):
  calls = []

  def hook(r: core_diagnostics.ServerRound):
    calls.append(r)
    core_diagnostics.load(r.student_variables, r.before)
    return {'pool_rows': tf.cast(tf.shape(r.pool)[0], tf.float32),
            'weight_sum': tf.reduce_sum(r.weights),
            'agreement_after': core_diagnostics.argmax_agreement(
                r.student(r.pool, training=False), r.target)}

  r = _round(case, hook)
  assert len(calls) == 1  # One trace, one call.
  assert float(r.metrics['pool_rows']) == POOL
  np.testing.assert_allclose(r.metrics['weight_sum'], POOL, rtol=1e-5)
  # The hook overwrote the student with its start; the round is unchanged.
  _assert_same_round(r, _round(case, None))


def test_skipped_rounds_read_nan(case):
  skipped = _round(case, _dafkd_hook(case, diagnose=tf.constant(False)))
  ran = _round(case, _dafkd_hook(case, diagnose=tf.constant(True)))
  every = _round(case, _dafkd_hook(case))
  for name in dafkd_diagnostics.diagnostic_metrics(
      dafkd_diagnostics.skipped_diagnostics(pool_labels=True)):
    assert math.isnan(float(skipped.metrics[name])), name
    assert float(ran.metrics[name]) == float(every.metrics[name]), name
  # The mechanism metrics of the round itself are not skipped.
  assert float(skipped.metrics['agreement_after']) == float(
      every.metrics['agreement_after'])
  assert core_diagnostics.due(1, 0) is None
  assert [bool(core_diagnostics.due(3, r)) for r in range(6)] == [
      False, False, True, False, False, True]
