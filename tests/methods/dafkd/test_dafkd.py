"""The DaFKD process: eq. (9) inside TFF, the discriminator store, eq. (7),
appendix B's secure-sum mode against plain mode, bad input.

Three toy clients of 8x8 images (disjoint classes), one local step of batch
8. Each process (plain and private) is built once and run for the same two
rounds: clients (0, 1), then (2, 0). The module runs under TFF's test
context, which implements the secure-sum intrinsic (by an insecure sum);
plain mode runs there exactly as under the local context.
"""

import dataclasses
import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd import models
from tff_kd.core import distill_hparams
from tff_kd.federated import client_data
from tff_kd.federated import tff_types
from tff_kd.methods import common
from tff_kd.methods import registry
from tff_kd.methods.dafkd import dafkd_tf
from tff_kd.methods.dafkd import dafkd_tff
from tff_kd.methods.dafkd import dafkd_tff as dafkd
from tff_kd.methods.dafkd import gan
from tff_kd.methods.dafkd import hparams as dafkd_hparams
from tff_kd.models import generators
from tff_kd.program import settings as settings_lib
from tff_kd.runtime import context

SHAPE = (8, 8, 1)
NUM_CLASSES = 3
NOISE = 4
HIDDEN = (8,)
SEED = 0
LOCAL = client_data.LocalWork('steps', 1, 8)
ROUNDS = ([0, 1], [2, 0])
LR = 0.05


def _images(labels, seed):
  """Class c: a bright quarter (the c-th) on a dark noisy image."""
  rng = np.random.default_rng(seed)
  x = rng.normal(0, 0.3, size=(len(labels), *SHAPE)).astype(np.float32) - 0.5
  for i, c in enumerate(labels):
    r, col = divmod(int(c), 2)
    x[i, 4 * r:4 * r + 4, 4 * col:4 * col + 4] += 1.5
  return np.clip(x, -1, 1)


Y = np.array([0, 1] * 8 + [2] * 16 + [0, 1, 2] * 4, np.int32)
X = _images(Y, 0)
PARTS = [np.arange(0, 16), np.arange(16, 32), np.arange(32, 44)]

_classifier_fn = functools.partial(
    models.build_classifier, 'cnn', input_shape=SHAPE,
    num_classes=NUM_CLASSES, norm='batch', seed=SEED)


def _generator():
  # What build_dafkd_process builds (seed + 1).
  return generators.build_image_generator(
      noise_dim=NOISE, num_classes=NUM_CLASSES, image_shape=SHAPE,
      hidden=HIDDEN, seed=SEED + 1)


@pytest.fixture(scope='module', autouse=True)
def test_context():
  context.install_worker_reaper()
  tff.backends.test.set_sync_test_cpp_execution_context()
  yield
  context.set_local_context()


@pytest.fixture(scope='module')
def data(tmp_path_factory):
  return client_data.FileClientData.create(
      str(tmp_path_factory.mktemp('clients')), X, Y, PARTS)


def _build(data, **kwargs):
  """The process; `kwargs` are builder arguments or `DaFKDHparams` fields."""
  fields = {f.name for f in dataclasses.fields(dafkd_hparams.DaFKDHparams)}
  sgd = tff.learning.optimizers.build_sgdm(LR)
  args = dict(
      num_clients=3, clients_per_round=2,
      # SGD: the secure sum quantises the targets (~1e-7), and Adam's
      # normalised steps would amplify that into the weights.
      optimizers=dafkd.Optimizers(
          sgd, sgd, tff.learning.optimizers.build_sgdm(0.5),
          learning_rate=kwargs.pop('learning_rate', LR)),
      distill_config=distill_hparams.DistillConfig.plain(
          steps=3, batch_size=8, seed=SEED),
      seed=SEED,
      hparams=dafkd_hparams.DaFKDHparams(**dict(
          dict(pool_size=16, noise_dim=NOISE,
               generator_hidden=','.join(map(str, HIDDEN)),
               pool_generator='broadcast'),
          **{k: v for k, v in kwargs.items() if k in fields})))
  args.update({k: v for k, v in kwargs.items() if k not in fields})
  return dafkd.build_dafkd_process(_classifier_fn, data.element_spec,
                                   data.dataset_fn(LOCAL), **args)


def _run(process, data):
  states, outputs = [process.initialize()], []
  for r, clients in enumerate(ROUNDS):
    out = process.next(states[-1], data.keys(clients, seed=SEED, round_num=r))
    states.append(out.state)
    outputs.append(out.metrics)
  return states, outputs


@pytest.fixture(scope='module')
def plain(data):
  process = _build(data)
  return (process,) + _run(process, data)


@pytest.fixture(scope='module')
def private(data):
  return _run(_build(data, private=True), data)


def _eager_joint_loss(data, state, key):
  """Eq. (9) of a client's first step, eagerly, from a process state."""
  clf = _classifier_fn()
  disc = generators.build_discriminator_head(clf, seed=SEED + 2)
  gen = _generator()
  clf_w, gen_w = state.global_model_weights
  tff.learning.models.ModelWeights(
      list(clf_w.trainable), list(clf_w.non_trainable)).assign_weights_to(
          clf.model)
  tff.learning.models.ModelWeights(
      list(gen_w.trainable), list(gen_w.non_trainable)).assign_weights_to(gen)
  client = int(key.split('|')[0])
  for v, rows in zip(dafkd_tf.discriminator_variables(disc),
                     dafkd.discriminator_store(state)):
    v.assign(rows[client])
  batch = next(iter(data.dataset_fn(LOCAL)(tf.constant(key))))
  seeds = tf.random.experimental.stateless_split(
      dafkd_tf.step_seed(tff_types.key_seed(tf.constant(key)), 0), 3)
  x_fake, _, _ = gan.generate(gen, tf.shape(batch['x'])[0], noise_dim=NOISE,
                              num_classes=NUM_CLASSES, seed=seeds[0],
                              training=True)
  logits = clf.model(batch['x'], training=True)
  # The discriminator scores both batches as the server does (inference
  # mode), with the moving statistics the real pass just updated.
  return float(gan.joint_loss(
      logits, batch['y'], disc.logit_model(batch['x'], training=False),
      disc.logit_model(x_fake, training=False), from_logits=True))


def test_joint_loss_eq9_inside_tff_matches_eager(plain, data):
  _, states, outputs = plain
  for r, clients in enumerate(ROUNDS):
    keys = data.keys(clients, seed=SEED, round_num=r)
    # Round 1's client 0 starts from the row it left in round 0: the eager
    # value uses the stored row, so a match shows the row came back.
    expected = np.mean([_eager_joint_loss(data, states[r], k) for k in keys])
    got = outputs[r]['client_work']['train']['joint_loss']
    assert got == pytest.approx(expected, rel=1e-4), r


def test_discriminator_rows_persist_per_client(plain):
  _, states, _ = plain
  init, after0, after1 = (dafkd.discriminator_store(s) for s in states)
  assert [a.shape for a in init] == [(3, 32, 1), (3, 1)]

  def changed(a, b, row):
    return any(np.abs(x[row] - y[row]).max() > 0 for x, y in zip(a, b))

  assert changed(init, after0, 0) and changed(init, after0, 1)
  assert not changed(init, after0, 2)
  assert changed(after0, after1, 2) and changed(after0, after1, 0)
  assert not changed(after0, after1, 1)


def test_store_rows_are_the_uploaded_discriminators(data):
  """Row k of the new store is exactly what client k uploaded."""
  sgd = tff.learning.optimizers.build_sgdm(LR)
  spec = dafkd_tff.ModelSpec(
      _classifier_fn, _generator, True, SEED + 2,
      gan.GanSettings(NOISE, NUM_CLASSES))
  work = dafkd_tff.build_client_work(
      spec, data.element_spec, data.dataset_fn(LOCAL),
      gan.GanOptimizers(sgd, sgd), num_clients=3, learning_rate=LR)
  state = work.initialize()
  weights = dafkd_tff.build_initial_weights_fn(spec)()
  clients = [2, 0]
  out = work.next(state, [weights] * 2,
                  data.keys(clients, seed=SEED, round_num=0))
  before = [np.asarray(v) for v in state[1]]
  after = [np.asarray(v) for v in out.state[1]]
  for client, result in zip(clients, out.result):
    for row, uploaded in zip(after, result.update['discriminator']):
      np.testing.assert_array_equal(row[client], uploaded)
  for row, old in zip(after, before):  # Client 1 did not take part.
    np.testing.assert_array_equal(row[1], old[1])
    assert np.abs(row[2] - old[2]).max() > 0


def test_round_metrics_and_model_views(plain):
  process, states, outputs = plain
  fin = outputs[0]['finalizer']
  assert fin['num_teachers'] == 2.0
  assert fin['alpha_sum_error'] < 1e-5
  assert 0.0 <= fin['alpha_entropy'] <= np.log(2) + 1e-6
  assert fin['steps'] == 3.0 and np.isfinite(fin['last_loss'])
  assert 0.0 < fin['target_entropy'] <= np.log(NUM_CLASSES) + 1e-6
  assert fin['server_seconds'] > 0.0
  # Its parts: up to eq. 8's target, then the distillation (the hook last).
  assert fin['teacher_seconds'] > 0.0 and fin['distill_seconds'] > 0.0
  assert fin['teacher_seconds'] + fin['distill_seconds'] <= (
      fin['server_seconds'])
  for key in ('agreement_before', 'agreement_after'):
    assert 0.0 <= fin[key] <= 1.0, key
  cw = outputs[0]['client_work']['train']
  for key in ('disc_real_accuracy', 'disc_fake_accuracy'):
    assert 0.0 <= cw[key] <= 1.0
  # One own row (33 floats), models and 8 bytes per client, both ways.
  weights = process.get_model_weights(states[1])
  assert len(weights.trainable) == len(_classifier_fn().model.trainable_weights)
  gen_w = dafkd.generator_weights(states[1])
  assert len(gen_w.trainable) == len(_generator().trainable_weights)
  assert cw['bytes_up'] - cw['bytes_down'] == 2 * 8.0
  zeroed = tff.learning.models.ModelWeights(
      [np.zeros_like(v) for v in weights.trainable],
      [np.asarray(v) for v in weights.non_trainable])
  state = process.set_model_weights(states[1], zeroed)
  assert all(np.all(np.asarray(v) == 0)
             for v in process.get_model_weights(state).trainable)
  # The generator and the store are untouched.
  for a, b in zip(dafkd.generator_weights(state).trainable, gen_w.trainable):
    np.testing.assert_array_equal(a, b)


def test_feature_generator_round(data):
  """Appendix A through TFF: the generator makes [B, d] features."""
  process = _build(data, generator='feature', generator_labels='local',
                   aux_weight=1.0, discriminator='projection')
  state = process.initialize()
  out = process.next(state, data.keys(ROUNDS[0], seed=SEED, round_num=0))
  gen_w = dafkd.generator_weights(out.state)
  clf = _classifier_fn()
  assert gen_w.trainable[-1].shape == (clf.feature_dim,)
  fin = out.metrics['finalizer']
  assert fin['num_teachers'] == 2.0 and fin['alpha_sum_error'] < 1e-5
  assert 0.0 <= fin['label_fidelity'] <= 1.0
  for a, b in zip(process.get_model_weights(out.state).trainable,
                  process.get_model_weights(state).trainable):
    assert np.all(np.isfinite(a)) and np.abs(a - b).max() > 0


def test_private_mode_equals_plain_mode(plain, private):
  _, plain_states, plain_out = plain
  private_states, private_out = private
  for r in (1, 2):
    p_clf, p_gen = plain_states[r].global_model_weights
    q_clf, q_gen = private_states[r].global_model_weights
    for a, b in zip(p_gen.trainable, q_gen.trainable):
      np.testing.assert_allclose(a, b, atol=1e-6)
    for a, b in zip(p_clf.trainable, q_clf.trainable):
      np.testing.assert_allclose(a, b, atol=1e-5)
    for key in ('first_loss', 'last_loss', 'mean_disc_score',
                'target_entropy'):
      assert private_out[r - 1]['finalizer'][key] == pytest.approx(
          plain_out[r - 1]['finalizer'][key], rel=1e-4, abs=1e-6), key
  # The discriminators stay (simulated) on the clients: the store is kept.
  for a, b in zip(dafkd.discriminator_store(plain_states[2]),
                  dafkd.discriminator_store(private_states[2])):
    np.testing.assert_allclose(a, b, atol=1e-6)
  secure = private_out[0]['aggregator']['secure_sum']
  assert secure['secure_upper_clipped_count'] == 0


def test_teacher_weights_eq7_on_a_toy_stack():
  scores = np.array([[0.9, 0.0, 0.2, 0.4], [0.3, 0.0, 0.2, 0.1],
                     [0.5, 0.5, 0.5, 0.5]], np.float32)
  valid = np.array([True, True, False])
  alpha = dafkd_tf.teacher_weights(scores, valid).numpy()
  np.testing.assert_allclose(alpha.sum(0), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(alpha[2], 0.0)
  np.testing.assert_allclose(alpha[:2], gan.correlation_weights(scores[:2]),
                             rtol=1e-6)
  np.testing.assert_allclose(alpha[:2], [[0.75, 0.5, 0.5, 0.8],
                                         [0.25, 0.5, 0.5, 0.2]], rtol=1e-6)
  uniform = dafkd_tf.teacher_weights(scores, valid, correlation=False)
  np.testing.assert_allclose(uniform[:2], 0.5)


def _bad(data, match, **kwargs):
  with pytest.raises(errors.ConfigError, match=match):
    _build(data, **kwargs)


@pytest.mark.parametrize('kwargs,match', [
    (dict(pool_size=0), 'pool_size must be an integer >= 1, got 0'),
    (dict(noise_dim=-1), 'noise_dim must be'),
    (dict(clients_per_round=4), 'clients_per_round=4 is more than'),
    (dict(learning_rate=0.0), 'client learning rate must be > 0'),
    (dict(gp_weight=-0.3), 'dafkd.gp_weight must be a finite number >= 0'),
    (dict(generator_form='wgan'), "generator_form 'wgan' is unknown"),
    (dict(discriminator_mode='moving'), "discriminator_mode 'moving' is"),
    (dict(ensemble='mean'), "dafkd.ensemble 'mean' is unknown"),
    (dict(private=True, ensemble='logits'), "needs ensemble='probs'"),
    (dict(private=True, pool_generator='aggregated'),
     "pool_generator must be 'broadcast'"),
    (dict(generator_hidden=''), 'dafkd.generator_hidden must be'),
    (dict(generator_hidden='8,0'), 'dafkd.generator_hidden must be'),
    (dict(holder_share=0.0), r'dafkd.holder_share must be in \(0, 1\]'),
    (dict(pool='real', private=True), "pool='real' is an ablation"),
    (dict(generator='feature', pool='real'),
     r"generator='feature' \(appendix A\).*pool='real' holds images"),
    (dict(generator='feature', gp_weight=0.3),
     r"generator='feature'.*gp_weight > 0 interpolates"),
    (dict(generator='feature', shared_extractor=False),
     r"generator='feature'.*shared_extractor=False"),
    (dict(feature_activation='tanh'), "feature_activation 'tanh' is unknown"),
    (dict(twin_student=True, private=True),
     'twin_student=True distils on the uniform ensemble'),
    (dict(detach_extractor=True, shared_extractor=False),
     'detach_extractor=True keeps eq. 2 out of the shared extractor'),
])
def test_bad_settings_raise_config_error(data, kwargs, match):
  _bad(data, match, **kwargs)


def test_missing_inputs_raise_config_error(data):
  inputs = common.ProcessInputs(lambda: None, data.element_spec, 3,
                                  dataset_fn=data.dataset_fn(LOCAL))
  with pytest.raises(errors.ConfigError, match='classifier_fn'):
    registry.get_method('dafkd').build(inputs,
                                       settings_lib.from_config(_config()))


def _config():
  from configs import base  # pylint: disable=g-import-not-at-top
  c = base.get_config()
  c.method = 'dafkd'
  return c
