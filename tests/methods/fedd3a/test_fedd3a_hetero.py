"""Heterogeneous FedD3A: golden numbers on a toy problem, the model store.

FedD3A: Su, Li, Xue, AAAI 2023, Sec. 3 "Application to Heterogeneous
Models". Global model: the linear toy of tests/methods/fedd3a/test_fedd3a.py
(backbone x Wf, 3 -> 3; head 3 -> 2 logits). Client architectures: A, one
bias-free Dense (3 -> 2); B, Dense(4, tanh) then Dense(2), all bias-free
and constant-initialised, so numpy evaluates every model exactly. Three
clients: 0 and 2 use A (store rows 0 and 1), 1 uses B (row 0). Local work
is one full batch per round (one SGD step), so the shuffle does not matter
and the CE + KD step is checked against an independent eager gradient.

One process is built per module and run for two rounds with clients 0 and
1; the client work alone is built once to read the clients' uploads.
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
A0 = np.array([[0.3, -0.2], [0.1, 0.4], [-0.2, 0.1]], np.float32)
B1 = np.array([[0.4, -0.3, 0.2, 0.1], [0.1, 0.5, -0.4, 0.2],
               [-0.2, 0.1, 0.3, -0.5]], np.float32)
B2 = np.array([[0.6, -0.1], [-0.2, 0.4], [0.3, 0.3], [-0.5, 0.2]],
              np.float32)
X = np.array([[1.0, 0.2, 0.0], [1.2, -0.1, 0.1], [0.9, 0.0, -0.2],  # 0: A.
              [0.1, 1.0, 0.0], [-0.2, 1.1, 0.1],  # Client 1: domain B.
              [0.8, 0.1, 0.3], [1.0, -0.2, 0.2]], np.float32)  # Client 2.
Y = np.array([0, 1, 0, 1, 0, 1, 1], np.int32)
PARTS = [np.arange(3), np.arange(3, 5), np.arange(5, 7)]
POOL = np.array([[1.0, 0.1, 0.05], [0.95, -0.05, 0.1], [1.05, 0.0, 0.0],
                 [0.9, 0.2, -0.1], [0.1, 0.95, 0.0]], np.float32)
LOCAL = client_data.LocalWork('epochs', 1, 8)  # One full batch.
LR = 0.5
ALPHA = 0.1
KD_WEIGHT = 0.7
KD_T = 2.0
HPARAMS = fedd3a_hparams.FedD3AHparams(alpha=ALPHA, kd_weight=KD_WEIGHT,
                                        kd_temperature=KD_T)
CONFIG = distill_hparams.DistillConfig.plain(steps=4, batch_size=2, seed=5,
                                    eval_every=2)
DISTILL_LR = 0.05
W0 = ModelWeights([WF, WH], [])


def _classifier_fn() -> models.Classifier:
  inputs = tf.keras.Input((3,))
  features = tf.keras.Model(inputs, tf.keras.layers.Dense(
      3, use_bias=False)(inputs))
  feature_in = tf.keras.Input((3,))
  head = tf.keras.Model(feature_in, tf.keras.layers.Dense(
      2, use_bias=False)(feature_in))
  model = tf.keras.Model(inputs, head(features(inputs)))
  return models.Classifier(model, features, head, 3)


def _dense(units, kernel, **kwargs):
  return tf.keras.layers.Dense(
      units, use_bias=False,
      kernel_initializer=tf.keras.initializers.Constant(kernel), **kwargs)


def _model_a() -> tf.keras.Model:
  inputs = tf.keras.Input((3,))
  return tf.keras.Model(inputs, _dense(2, A0)(inputs))


def _model_b() -> tf.keras.Model:
  inputs = tf.keras.Input((3,))
  hidden = _dense(4, B1, activation='tanh')(inputs)
  return tf.keras.Model(inputs, _dense(2, B2)(hidden))


MODEL_FNS = (_model_a, _model_b)
INITIAL = ([A0], [B1, B2])


def _np_softmax(logits):
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _np_logits(arch, weights, x):
  if arch == 0:
    return x @ weights[0]
  return np.tanh(x @ weights[0]) @ weights[1]


def _np_projection(z):
  g = z.T.astype(np.float64) @ z
  return g @ np.linalg.inv(ALPHA * np.eye(len(g)) + g)


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
      num_clients=3,
      hparams=fedd3a_hparams.FedD3AHparams(
          **dict(dict(alpha=ALPHA, kd_weight=KD_WEIGHT, kd_temperature=KD_T),
                 **{k: v for k, v in overrides.items() if k in fields})),
      dataset_fn=data.dataset_fn(LOCAL), client_model_fns=MODEL_FNS)
  kwargs.update({k: v for k, v in overrides.items() if k not in fields})
  return fedd3a.build_fedd3a_process(_classifier_fn, data.element_spec,
                                     **kwargs)


@pytest.fixture(scope='module')
def client_updates(data):
  """Round 0's uploads of clients 0 and 1 from the client work alone."""
  work = fedd3a_tff.build_hetero_client_work(
      _classifier_fn, MODEL_FNS, data.element_spec,
      tff.learning.optimizers.build_sgdm(1.0), data.dataset_fn(LOCAL),
      HPARAMS, num_clients=3, learning_rate=LR)
  out = work.next(work.initialize(), [W0, W0],
                  data.keys([0, 1], seed=0, round_num=0))
  by_id = {int(r.update['client_id']): r.update for r in out.result}
  return by_id, out.measurements


@pytest.fixture(scope='module')
def rounds(data, pool):
  """The process and its states: initial, after round 1, after round 2."""
  process = _build(data, pool)
  states = [process.set_model_weights(process.initialize(), W0)]
  outputs = []
  for r in range(2):
    out = process.next(states[-1], data.keys([0, 1], seed=0, round_num=r))
    states.append(out.state)
    outputs.append(out)
  return process, states, outputs


def _eager_step(arch, start, x, y, global_weights):
  """One SGD step of CE + KD_WEIGHT * T^2 KL(global || local), by hand."""
  variables = [tf.Variable(w) for w in start]
  teacher = tf.nn.softmax(x @ global_weights[0] @ global_weights[1] / KD_T)
  with tf.GradientTape() as tape:
    if arch == 0:
      logits = x @ variables[0]
    else:
      logits = tf.tanh(x @ variables[0]) @ variables[1]
    ce = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    kl = tf.reduce_sum(teacher * (tf.math.log(teacher) - tf.nn.log_softmax(
        logits / KD_T)), axis=-1)
    loss = ce + KD_WEIGHT * KD_T**2 * tf.reduce_mean(kl)
  grads = tape.gradient(loss, variables)
  return [(v - LR * g).numpy() for v, g in zip(variables, grads)]


def test_local_step_is_ce_plus_kd_from_the_global_model(client_updates):
  by_id, measurements = client_updates
  for client, arch in ((0, 0), (1, 1)):
    x, y = X[PARTS[client]], Y[PARTS[client]]
    want = _eager_step(arch, INITIAL[arch], x, y, [WF, WH])
    got = by_id[client]['models'][arch].trainable
    for g, w in zip(got, want):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    # The other architecture's slot is zero; the id and architecture ride.
    other = by_id[client]['models'][1 - arch].trainable
    assert all(not np.any(v) for v in other)
    assert int(by_id[client]['architecture']) == arch
    # P lives in the global feature space: the received backbone's features.
    z = (x @ WF).mean(0, keepdims=True)
    np.testing.assert_allclose(by_id[client]['projection'],
                               _np_projection(z), atol=1e-6)
  # Own model only: down global (15) + own; up own + P (9) + 3 scalars.
  a_size, b_size = 6, 20
  assert measurements['bytes_down'] == 4 * (2 * 15 + a_size + b_size)
  assert measurements['bytes_up'] == 4 * (a_size + b_size + 2 * (9 + 3))
  assert measurements['num_clients'] == 2


def test_kd_weight_zero_is_plain_cross_entropy():
  x, y = tf.constant(X[:3]), tf.constant(Y[:3])
  model = _model_a()
  teacher = _classifier_fn()
  reg = fedd3a_tf.global_kd_regularizer(teacher.model, weight=0.0,
                                        temperature=KD_T)
  assert float(reg({'x': x, 'y': y}, model(x), 0)) == 0.0
  reg = fedd3a_tf.global_kd_regularizer(teacher.model, weight=2.0,
                                        temperature=KD_T)
  target = tf.nn.softmax(teacher.model(x) / KD_T)
  np.testing.assert_allclose(
      reg({'x': x, 'y': y}, model(x), 0),
      2.0 * distillation.kd_loss(model(x), target, KD_T), rtol=1e-6)


@pytest.fixture(scope='module')
def eager_server(client_updates):
  """`hetero_server_round` eagerly on clients 0 (A) and 1 (B)."""
  by_id, _ = client_updates
  ups = [by_id[0], by_id[1]]
  stacked = tuple(
      ModelWeights([tf.constant(np.stack([np.asarray(u['models'][a]
                                                     .trainable[i])
                                          for u in ups]))
                    for i in range(len(INITIAL[a]))], [])
      for a in range(2))
  result = fedd3a_tf.hetero_server_round(
      _classifier_fn(), [fn() for fn in MODEL_FNS],
      tff.learning.optimizers.build_adam(DISTILL_LR),
      start_weights=ModelWeights([tf.constant(w) for w in W0.trainable], []),
      uploads=fedd3a_tf.Uploads(
          stacked, tf.constant(np.stack([u['projection'] for u in ups])),
          tf.constant([True, True]), architectures=tf.constant([0, 1])),
      samples=fedd3a_tf.ServerSamples(tf.constant(POOL)),
      settings=fedd3a_tf.ServerSettings(fedd3a_hparams.FedD3AHparams(),
                                        CONFIG))
  return result, ups


def test_server_weights_and_teacher_of_two_architectures(eager_server):
  result, ups = eager_server
  f = POOL @ WF  # The previous global backbone: nothing is averaged.
  r = np.stack([np.einsum('nd,nd->n', f, f @ u['projection']) /
                (np.linalg.norm(f, axis=1) *
                 np.linalg.norm(f @ u['projection'], axis=1)) for u in ups])
  np.testing.assert_allclose(result.scores, r, rtol=1e-5, atol=1e-6)
  z = (r - r.mean(0)) / r.std(0)
  alpha = np.exp(z) / np.exp(z).sum(0)
  np.testing.assert_allclose(result.teacher_weights, alpha, atol=1e-5)
  probs = np.stack([
      _np_softmax(_np_logits(a, [np.asarray(v) for v in
                                 u['models'][a].trainable], POOL))
      for a, u in enumerate(ups)])
  np.testing.assert_allclose(result.target,
                             np.einsum('kn,knc->nc', alpha, probs),
                             atol=1e-5)
  # Client 0's domain (e1) holds 4 of the 5 pool samples.
  assert alpha[0].mean() > 0.65


def test_process_round_equals_eager_server_round(rounds, eager_server):
  process, states, outputs = rounds
  expected, _ = eager_server
  new = process.get_model_weights(states[1])
  for got, want in zip(new.trainable, expected.weights.trainable):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  fin = outputs[0].metrics['finalizer']
  assert fin['num_teachers'] == 2.0
  assert fin['num_teachers_a0'] == 1.0 and fin['num_teachers_a1'] == 1.0
  np.testing.assert_allclose(
      [fin['client_weight_0'], fin['client_weight_1'],
       fin['client_weight_2']],
      list(np.mean(expected.teacher_weights, axis=1)) + [0.0], atol=1e-6)
  np.testing.assert_allclose(fin['first_loss'], expected.distill.first_loss,
                             rtol=1e-5)
  # The student moved away from the previous global model.
  assert np.abs(new.trainable[1] - WH).max() > 1e-3


def test_local_models_persist_in_the_store(rounds, client_updates, data):
  process, states, _ = rounds
  by_id, _ = client_updates
  rows_a = [fedd3a.local_model_rows(s, 0) for s in states]
  rows_b = [fedd3a.local_model_rows(s, 1) for s in states]
  assert rows_a[0][0].shape == (2, 3, 2) and rows_b[0][0].shape == (1, 3, 4)
  np.testing.assert_array_equal(rows_a[0][0], [A0, A0])
  # Round 1: client 0's row (A, row 0) and client 1's (B, row 0) are the
  # trained models they uploaded; client 2 (A, row 1) was not sampled.
  np.testing.assert_allclose(rows_a[1][0][0],
                             by_id[0]['models'][0].trainable[0], atol=0)
  for got, want in zip(rows_b[1], by_id[1]['models'][1].trainable):
    np.testing.assert_allclose(got[0], want, atol=0)
  for rows in rows_a[1:]:
    np.testing.assert_array_equal(rows[0][1], A0)
  # Round 2 starts client 0 from its stored model and the new global one.
  glob = process.get_model_weights(states[1])
  key = data.keys([0], seed=0, round_num=1)[0]
  want = fedd3a_tf.hetero_client_round(
      _classifier_fn(), [fn() for fn in MODEL_FNS],
      tff.learning.optimizers.build_sgdm(1.0),
      ModelWeights([tf.constant(w) for w in glob.trainable], []),
      [ModelWeights([tf.constant(rows_a[1][0][0])], []),
       ModelWeights([tf.constant(w[0]) for w in rows_b[1]], [])],
      data.dataset_fn(LOCAL)(tf.constant(key)), tf.constant(LR),
      architecture=0, hparams=fedd3a_hparams.FedD3AHparams(
          alpha=ALPHA, kd_weight=KD_WEIGHT, kd_temperature=KD_T))
  np.testing.assert_allclose(rows_a[2][0][0], want.weights[0].trainable[0],
                             rtol=1e-5, atol=1e-6)
  assert np.abs(rows_a[2][0][0] - rows_a[1][0][0]).max() > 1e-4


def test_get_set_model_weights_see_the_global_model(rounds):
  process, states, _ = rounds
  assert isinstance(process, tff.learning.templates.LearningProcess)
  state = process.set_model_weights(states[2], W0)
  got = process.get_model_weights(state)
  assert [np.shape(v) for v in got.trainable] == [(3, 3), (3, 2)]
  np.testing.assert_array_equal(got.trainable[1], WH)


def _wrong_classes() -> tf.keras.Model:
  inputs = tf.keras.Input((3,))
  return tf.keras.Model(inputs, tf.keras.layers.Dense(5)(inputs))


@pytest.mark.parametrize('overrides,match', [
    ({'kd_weight': -1.0}, r'fedd3a.kd_weight must be a finite number >= 0'),
    ({'kd_temperature': 0.0}, r'fedd3a.kd_temperature must be .* > 0'),
    ({'num_clients': 1}, r'num_clients must be >= the 2 client'),
    ({'client_model_fns': (_model_a, _wrong_classes)},
     'fedd3a global and client models must share input shape and classes'),
])
def test_bad_settings_fail_before_building(data, pool, overrides, match):
  with pytest.raises(errors.ConfigError, match=match):
    _build(data, pool, **overrides)


def test_unknown_client_architecture_is_a_config_error(data, pool):
  with pytest.raises(errors.ConfigError,
                     match="fedd3a.client_models entry 'vgg' is not"):
    fedd3a_hparams.FedD3AHparams(client_models='cnn,vgg').validate()
  from configs import base  # pylint: disable=g-import-not-at-top
  c = base.get_config()
  c.fedd3a.client_models = 'cnn:layer'
  inputs = common.ProcessInputs(
      lambda: _classifier_fn().model, data.element_spec, 2,
      dataset_fn=data.dataset_fn(LOCAL), server_data=pool,
      classifier_fn=_classifier_fn, num_clients=3)
  with pytest.raises(errors.ConfigError,
                     match="fedd3a.client_models entry 'cnn:layer' is not"):
    c.method = 'fedd3a'
    c.server_data.proxy, c.server_data.proxy_size = 'split', 10
    registry.get_method('fedd3a').build(inputs, settings_lib.from_config(c))


def test_client_id_outside_the_store_fails_at_run_time(data):
  work = fedd3a_tff.build_hetero_client_work(
      _classifier_fn, MODEL_FNS, data.element_spec,
      tff.learning.optimizers.build_sgdm(1.0), data.dataset_fn(LOCAL),
      HPARAMS, num_clients=2, learning_rate=LR)
  with pytest.raises(Exception, match='client id out of range'):
    work.next(work.initialize(), [W0], data.keys([2], seed=0, round_num=0))
