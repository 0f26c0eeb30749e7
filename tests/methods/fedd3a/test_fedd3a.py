"""The FedD3A process: golden numbers on a toy two-domain problem, bad input.

Toy classifier: a bias-free linear backbone B(x) = x Wf (3 -> 3) and a
linear head (3 -> 2 logits), so numpy computes features, projections, the
eq. 6 weights and the eq. 7 target exactly. Client 0 holds data near e1
("domain A"), client 1 near e2 ("domain B"); the server pool is mostly
domain A. One real TFF round (client work, stacking aggregator, finalizer
reading the pool from files) is run once per module and checked against
numpy and against `tff_kd.methods.fedd3a.fedd3a_tf.server_round` run eagerly
on the same
client updates.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd import models
from tff_kd.core import distill_hparams
from tff_kd.core import distillation
from tff_kd.federated import client_data
from tff_kd.federated import learning
from tff_kd.federated import server_data
from tff_kd.methods import common
from tff_kd.methods import registry
from tff_kd.methods.fedd3a import fedd3a_tf
from tff_kd.methods.fedd3a import fedd3a_tff
from tff_kd.methods.fedd3a import fedd3a_tff as fedd3a
from tff_kd.methods.fedd3a import hparams as fedd3a_hparams
from tff_kd.program import settings as settings_lib

ModelWeights = tff.learning.models.ModelWeights

WF = np.array([[1.0, 0.1, 0.0], [0.0, 1.0, 0.2], [0.1, 0.0, 1.0]],
              np.float32)
WH = np.array([[0.5, -0.5], [-0.3, 0.3], [0.2, 0.1]], np.float32)
X = np.array([[1.0, 0.2, 0.0], [1.2, -0.1, 0.1], [0.9, 0.0, -0.2],
              [1.1, 0.3, 0.0],  # Client 0: domain A (near e1).
              [0.1, 1.0, 0.0], [-0.2, 1.1, 0.1], [0.0, 0.9, 0.3]],  # B.
             np.float32)
Y = np.array([0, 1, 0, 1, 1, 0, 1], np.int32)
PARTS = [np.arange(4), np.arange(4, 7)]
POOL = np.array([[1.0, 0.1, 0.05], [0.95, -0.05, 0.1], [1.05, 0.0, 0.0],
                 [0.9, 0.2, -0.1], [0.1, 0.95, 0.0]], np.float32)
# Batch size 1: the batch means are the features themselves, so P does not
# depend on the shuffle order.
LOCAL = client_data.LocalWork('epochs', 1, 1)
LR = 0.1
ALPHA = 0.1
CONFIG = distill_hparams.DistillConfig.plain(steps=4, batch_size=2, seed=5,
                                    eval_every=2)
DISTILL_LR = 0.05


def _classifier_fn() -> models.Classifier:
  inputs = tf.keras.Input((3,))
  features = tf.keras.Model(inputs, tf.keras.layers.Dense(
      3, use_bias=False)(inputs))
  feature_in = tf.keras.Input((3,))
  head = tf.keras.Model(feature_in, tf.keras.layers.Dense(
      2, use_bias=False)(feature_in))
  model = tf.keras.Model(inputs, head(features(inputs)))
  return models.Classifier(model, features, head, 3)


W0 = ModelWeights([WF, WH], [])


def _np_projection(z, alpha=ALPHA):
  z = z.astype(np.float64)
  g = z.T @ z
  return g @ np.linalg.inv(alpha * np.eye(len(g)) + g)


def _np_soft(r):
  z = (r - r.mean(0)) / r.std(0)
  e = np.exp(z - z.max(0))
  return e / e.sum(0)


def _np_softmax(logits):
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


@pytest.fixture(scope='module')
def data(tmp_path_factory):
  return client_data.FileClientData.create(
      str(tmp_path_factory.mktemp('clients')), X, Y, PARTS)


@pytest.fixture(scope='module')
def pool(tmp_path_factory):
  return server_data.ServerData.create(
      str(tmp_path_factory.mktemp('server')), POOL)


def _build(data, pool, **overrides):
  fields = {f.name for f in dataclasses.fields(fedd3a_hparams.FedD3AHparams)}
  kwargs = dict(
      server_data=pool, clients_per_round=3,
      training=learning.Training(
          client_optimizer=tff.learning.optimizers.build_sgdm(1.0),
          server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
          learning_rate=overrides.pop('learning_rate', LR)),
      distillation=distillation.Distillation(
          optimizer=tff.learning.optimizers.build_adam(DISTILL_LR),
          config=overrides.pop('config', CONFIG)),
      hparams=fedd3a_hparams.FedD3AHparams(
          **dict(dict(alpha=ALPHA),
                 **{k: v for k, v in overrides.items() if k in fields})),
      num_clients=2, dataset_fn=data.dataset_fn(LOCAL))
  kwargs.update({k: v for k, v in overrides.items() if k not in fields})
  return fedd3a.build_fedd3a_process(_classifier_fn, data.element_spec,
                                     **kwargs)


@pytest.fixture(scope='module')
def client_updates(data):
  """Each client's update from the client work alone, by client id."""
  work = fedd3a_tff.build_client_work(
      _classifier_fn, data.element_spec,
      tff.learning.optimizers.build_sgdm(1.0),
      fedd3a_hparams.FedD3AHparams(alpha=ALPHA), learning_rate=LR,
      dataset_fn=data.dataset_fn(LOCAL))
  out = work.next(work.initialize(), [W0, W0],
                  data.keys([0, 1], seed=0, round_num=0))
  by_id = {int(r.update['client_id']): r for r in out.result}
  return [by_id[0], by_id[1]], out.measurements


@pytest.fixture(scope='module')
def round_output(data, pool):
  process = _build(data, pool)
  state = process.set_model_weights(process.initialize(), W0)
  return process, process.next(state, data.keys([0, 1], seed=0,
                                                round_num=0))


def test_client_projection_is_the_closed_form_of_received_features(
    client_updates):
  results, measurements = client_updates
  for part, result in zip(PARTS, results):
    p = np.asarray(result.update['projection'])
    np.testing.assert_allclose(p, _np_projection(X[part] @ WF), atol=1e-6)
    np.testing.assert_allclose(p, p.T, atol=0)
    assert float(result.update_weight) == len(part)
  # Up: delta (9 + 6 floats) + P (9) + id + weight, per client.
  assert measurements['bytes_up'] == 2 * 4 * (15 + 9 + 2)
  assert measurements['bytes_down'] == 2 * 4 * 15


def _np_sgd_epoch(x, y, wf, wh, lr):
  """Plain SGD, batch 1, on CE(softmax(x wf wh)): numpy's gradients."""
  wf, wh = wf.astype(np.float64), wh.astype(np.float64)
  for xi, yi in zip(x.astype(np.float64), y):
    f = xi @ wf
    p = _np_softmax((f @ wh)[None])[0]
    g = p - np.eye(2)[yi]  # dCE/dlogits.
    grad_wh = np.outer(f, g)
    grad_wf = np.outer(xi, wh @ g)
    wf, wh = wf - lr * grad_wf, wh - lr * grad_wh
  return wf, wh


def test_client_delta_is_a_numpy_sgd_epoch(data, client_updates):
  results, _ = client_updates
  for client, result in enumerate(results):
    key = data.keys([client], seed=0, round_num=0)[0]
    # The client's shuffled order, read from its round's dataset: local
    # training is its first pass, as FedAvg's (P has a dataset of its own).
    batches = list(data.dataset_fn(LOCAL)(tf.constant(key)))
    x = np.concatenate([b['x'].numpy() for b in batches])
    y = np.concatenate([b['y'].numpy() for b in batches])
    wf, wh = _np_sgd_epoch(x, y, WF, WH, LR)
    delta = result.update['delta'].trainable
    np.testing.assert_allclose(delta[0], wf - WF, atol=1e-6)
    np.testing.assert_allclose(delta[1], wh - WH, atol=1e-6)
    assert np.abs(wh - WH).max() > 1e-3


def _eager_round(client_updates, score_backbone='broadcast'):
  """`server_round` eagerly on the stacked updates (clients 0, 1)."""
  results, _ = client_updates
  deltas = [r.update['delta'] for r in results]
  n = np.array([float(r.update_weight) for r in results])
  mean = [W0.trainable[i] + sum(nk * np.asarray(d.trainable[i])
                                for nk, d in zip(n, deltas)) / n.sum()
          for i in range(2)]
  stacked = ModelWeights(
      [np.stack([np.asarray(d.trainable[i]) for d in deltas])
       for i in range(2)], [])
  projections = np.stack([np.asarray(r.update['projection'])
                          for r in results])
  result = fedd3a_tf.server_round(
      _classifier_fn(), _classifier_fn().model,
      tff.learning.optimizers.build_adam(DISTILL_LR),
      global_weights=ModelWeights([tf.constant(w) for w in W0.trainable], []),
      start_weights=ModelWeights([tf.constant(m, tf.float32) for m in mean],
                                 []),
      uploads=fedd3a_tf.Uploads(
          ModelWeights([tf.constant(d) for d in stacked.trainable], []),
          tf.constant(projections), tf.constant([True, True])),
      samples=fedd3a_tf.ServerSamples(tf.constant(POOL)),
      settings=fedd3a_tf.ServerSettings(
          fedd3a_hparams.FedD3AHparams(score_backbone=score_backbone),
          CONFIG))
  return result, mean, stacked, projections


@pytest.fixture(scope='module')
def eager_round(client_updates):
  return _eager_round(client_updates)


@pytest.mark.parametrize('score_backbone', ['broadcast', 'aggregated'])
def test_server_weights_and_teacher_match_numpy(client_updates,
                                                score_backbone):
  result, mean, stacked, projections = _eager_round(client_updates,
                                                    score_backbone)
  # 'broadcast' (default): the pool's features come from w_t's backbone,
  # the one every client built its P_k with (client P = f(X_k @ WF));
  # 'aggregated': from the averaged model after local training.
  f = POOL @ (WF if score_backbone == 'broadcast' else mean[0])
  r = np.stack([np.einsum('nd,nd->n', f, f @ p) /
                (np.linalg.norm(f, axis=1) * np.linalg.norm(f @ p, axis=1))
                for p in projections])
  np.testing.assert_allclose(result.scores, r, rtol=1e-5, atol=1e-6)
  alpha = _np_soft(r)
  np.testing.assert_allclose(result.teacher_weights, alpha, atol=1e-5)
  np.testing.assert_allclose(np.sum(result.teacher_weights, 0), 1.0,
                             atol=1e-6)
  probs = np.stack([
      _np_softmax(POOL @ (WF + stacked.trainable[0][k]) @
                  (WH + stacked.trainable[1][k])) for k in range(2)])
  np.testing.assert_allclose(result.target,
                             np.einsum('kn,knc->nc', alpha, probs),
                             atol=1e-5)
  # K = 2: standardised scores are +-1, so the weights are 0.881 / 0.119.
  np.testing.assert_allclose(np.sort(alpha[:, 0]),
                             [1 / (1 + np.exp(2)), 1 / (1 + np.exp(-2))],
                             atol=1e-6)


def test_process_round_equals_eager_server_round(eager_round, round_output):
  process, output = round_output
  expected, mean, _, _ = eager_round
  new = process.get_model_weights(output.state)
  for got, want in zip(new.trainable, expected.weights.trainable):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  fin = output.metrics['finalizer']
  np.testing.assert_allclose(
      _per_client(fin, 'weight'),
      np.mean(expected.teacher_weights, axis=1), atol=1e-6)
  np.testing.assert_allclose(
      _per_client(fin, 'score'), np.mean(expected.scores, axis=1), atol=1e-6)
  assert fin['num_teachers'] == 2.0 and fin['steps'] == CONFIG.steps
  # A small KL loss (~3e-4) in float32: graph and eager round-off differ by
  # ~2e-8 on some CPUs (8e-5 relative, measured on an AMD EPYC).
  np.testing.assert_allclose(fin['first_loss'], expected.distill.first_loss,
                             rtol=1e-5, atol=1e-7)
  # The distillation moved the student away from the average.
  assert np.abs(new.trainable[1] - mean[1]).max() > 1e-3


def _per_client(metrics, what):
  return np.array([metrics[f'client_{what}_{k}'] for k in range(2)])


def test_matching_client_gets_the_larger_weight(round_output):
  _, output = round_output
  w = _per_client(output.metrics['finalizer'], 'weight')
  # 4 of 5 pool samples lie in client 0's domain.
  assert w[0] > 0.65 and w[1] < 0.35
  np.testing.assert_allclose(w.sum(), 1.0, atol=1e-6)
  scores = _per_client(output.metrics['finalizer'], 'score')
  assert scores[0] > scores[1]


def test_model_weights_round_trip(round_output):
  process, output = round_output
  state = process.set_model_weights(output.state, W0)
  got = process.get_model_weights(state)
  for a, b in zip(got.trainable, W0.trainable):
    np.testing.assert_array_equal(a, b)
  assert isinstance(process, tff.learning.templates.LearningProcess)


@pytest.mark.parametrize('weighting', ['soft', 'onehot', 'avg', 'random'])
def test_masked_weights_sum_to_one_over_valid_rows(weighting):
  scores = tf.constant([[0.9, 0.2, 0.5], [0.1, 0.8, 0.5], [0.0, 0.0, 0.0]])
  valid = tf.constant([True, True, False])
  w = fedd3a_tf.masked_teacher_weights(scores, valid, weighting, seed=3)
  np.testing.assert_allclose(np.sum(w, 0), 1.0, atol=1e-6)
  np.testing.assert_array_equal(w[2], 0.0)
  if weighting == 'onehot':
    np.testing.assert_array_equal(w[:2], [[1, 0, 1], [0, 1, 0]])
  if weighting in ('avg', 'soft'):
    np.testing.assert_allclose(w[:, 2], [0.5, 0.5, 0.0], atol=1e-6)
  none = fedd3a_tf.masked_teacher_weights(scores, [False] * 3, weighting,
                                          seed=3)
  np.testing.assert_array_equal(none, 0.0)


def test_per_client_mean_places_rows_at_their_ids():
  values = tf.constant([[1.0, 3.0], [0.5, 0.5], [9.0, 9.0]])
  got = fedd3a_tf.per_client_mean(values, [2, 0, 1], [True, True, False], 3)
  np.testing.assert_allclose(got, [0.5, 0.0, 2.0])


@pytest.mark.parametrize('overrides,error,match', [
    ({'alpha': 0.0}, errors.ConfigError, r'fedd3a.alpha .* > 0, got 0.0'),
    ({'alpha': -1.0}, errors.ConfigError, r'> 0, got -1.0'),
    ({'alpha': float('nan')}, errors.ConfigError, r'> 0, got nan'),
    ({'weighting': 'max'}, errors.ConfigError,
     "fedd3a.weighting 'max' is unknown"),
    ({'ensemble': 'mean'}, errors.ConfigError,
     "fedd3a.ensemble 'mean' is unknown"),
    ({'projection_batches': -1}, errors.ConfigError,
     'projection_batches must be an integer >= 0'),
    ({'clients_per_round': 0}, errors.ConfigError,
     'clients_per_round must be >= 1'),
    ({'learning_rate': 0.0}, errors.ConfigError, 'learning rate must be > 0'),
])
def test_bad_settings_fail_before_building(data, pool, overrides, error,
                                           match):
  with pytest.raises(error, match=match):
    _build(data, pool, **overrides)


def test_zero_distillation_steps_fail_before_building(data, pool):
  # A `DistillConfig` checks itself when it is made.
  with pytest.raises(errors.ConfigError,
                     match='distill.steps must be an integer >= 1'):
    _build(data, pool, config=CONFIG.replace(steps=0))


def test_pool_shape_mismatch_is_a_data_error(data, tmp_path):
  wrong = server_data.ServerData.create(str(tmp_path),
                                        np.zeros((4, 2), np.float32))
  with pytest.raises(errors.DataError,
                     match=r'server pool images have shape \(2,\) but the '
                     r'model expects \(3,\)'):
    _build(data, wrong)


def test_registry_builds_fedd3a_from_config(data, pool):
  from configs import base  # pylint: disable=g-import-not-at-top
  method = registry.get_method('fedd3a')
  assert method.needs_server_data
  c = base.get_config()
  c.fedd3a.alpha = -2.0
  inputs = common.ProcessInputs(
      lambda: _classifier_fn().model, data.element_spec, 2,
      dataset_fn=data.dataset_fn(LOCAL), server_data=pool,
      classifier_fn=_classifier_fn, num_clients=2)
  c.method = 'fedd3a'
  c.server_data.proxy, c.server_data.proxy_size = 'split', 10
  with pytest.raises(errors.ConfigError, match='fedd3a.alpha'):
    settings_lib.from_config(c)  # The one check, before anything is built.
  c.fedd3a.alpha = 1.0
  with pytest.raises(errors.ConfigError, match='needs a classifier_fn'):
    method.build(inputs._replace(classifier_fn=None),
                 settings_lib.from_config(c))
