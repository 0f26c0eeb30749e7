"""The FedDF process: golden numbers on toy clients, prototypes, bad input.

Two toy clients with the bias-free linear model of test_fedavg (one
full-batch SGD step each, so numpy gives their models exactly). The
process's server fusion is checked against `tff_kd.methods.feddf.feddf_tf.fuse`
run
eagerly on those numpy models, so the TFF wiring (broadcast, stacking
aggregator, finalizer reading the pool from files) and the pure-TF maths are
tested against each other.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.methods import link_checks
from tests.methods.fedavg.test_fedavg import _client_delta
from tests.methods.fedavg.test_fedavg import _model_fn
from tests.methods.fedavg.test_fedavg import PARTS
from tests.methods.fedavg.test_fedavg import W0
from tests.methods.fedavg.test_fedavg import X
from tests.methods.fedavg.test_fedavg import Y
from tff_kd import errors
from tff_kd.core import distill_hparams
from tff_kd.core import distillation
from tff_kd.federated import client_data
from tff_kd.federated import learning
from tff_kd.federated import server_data
from tff_kd.federated import stacking
from tff_kd.methods import common
from tff_kd.methods import registry
from tff_kd.methods.fedavg import fedavg_tff as fedavg
from tff_kd.methods.feddf import feddf_tf
from tff_kd.methods.feddf import feddf_tff
from tff_kd.methods.feddf import feddf_tff as feddf
from tff_kd.methods.feddf import hparams as feddf_hparams

ModelWeights = tff.learning.models.ModelWeights
LOCAL = client_data.LocalWork('epochs', 1, 32)
LR = 0.1
# A labeled server validation set on which client 0's model (trained on one
# class-0 example) is no better than random guessing and client 1's is
# right: drop-worst must drop client 0.
VAL_X = np.array([[1.3, 0.95], [-0.7, -1.27], [0.41, 1.04], [-0.74, -0.92]],
                 np.float32)
VAL_Y = np.array([1, 0, 1, 0], np.int32)


@pytest.fixture(scope='module')
def data(tmp_path_factory):
  return client_data.FileClientData.create(
      str(tmp_path_factory.mktemp('clients')), X, Y, PARTS)


@pytest.fixture(scope='module')
def pool(tmp_path_factory):
  return server_data.ServerData.create(
      str(tmp_path_factory.mktemp('server')), X, VAL_X, VAL_Y)


def _moved(a: ModelWeights, b: ModelWeights) -> bool:
  return any(np.abs(np.asarray(x) - np.asarray(y)).max() > 0
             for x, y in zip(a.trainable, b.trainable))


_KEYED = object()


def _training() -> learning.Training:
  return learning.Training(
      client_optimizer=tff.learning.optimizers.build_sgdm(1.0),
      server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
      learning_rate=LR)


def _build(data, pool, *, distill_lr=0.0, steps=4, drop_worst=False,
           model_fns=(_model_fn,), clients_per_round=2, dataset_fn=_KEYED,
           **kwargs):
  return feddf.build_feddf_process(
      model_fns, data.element_spec, server_data=pool,
      clients_per_round=clients_per_round, training=_training(),
      distillation=distillation.Distillation(
          optimizer=tff.learning.optimizers.build_adam(distill_lr),
          config=kwargs.pop('config', distill_hparams.DistillConfig.plain(
              steps=steps, batch_size=2, seed=5))),
      hparams=feddf_hparams.FedDFHparams(drop_worst=drop_worst),
      dataset_fn=data.dataset_fn(LOCAL) if dataset_fn is _KEYED
      else dataset_fn, **kwargs)


def _round(process, data, clients=(0, 1)):
  state = process.initialize()
  state = process.set_model_weights(state, ModelWeights([W0], []))
  return process.next(state, data.keys(list(clients), seed=0, round_num=0))


def test_zero_learning_rate_distillation_is_fedavg(data, pool):
  output = _round(_build(data, pool, distill_lr=0.0), data)
  expected = W0 + (1 * _client_delta(PARTS[0], LR) +
                   3 * _client_delta(PARTS[1], LR)) / 4
  new = output.state.global_model_weights[0].trainable[0]
  np.testing.assert_allclose(new, expected, rtol=1e-5, atol=1e-6)
  # ... and equals the FedAvg process itself.
  avg = fedavg.build_fedavg_process(
      _model_fn, data.element_spec, training=_training(),
      dataset_fn=data.dataset_fn(LOCAL))
  avg_out = _round(avg, data)
  np.testing.assert_allclose(
      new, avg.get_model_weights(avg_out.state).trainable[0], atol=1e-6)
  cw = output.metrics['client_work']['train']
  assert cw['num_clients'] == 2.0 and cw['num_examples'] == 4.0
  # Real traffic: the model down, the model + weight + prototype id up.
  assert cw['bytes_down'] == 2 * 16 and cw['bytes_up'] == 2 * (16 + 8)
  assert output.metrics['aggregator'] == 2


def test_server_receives_each_clients_trained_model(data, pool):
  work = feddf_tff.build_prototype_client_work(
      [_model_fn], data.element_spec,
      tff.learning.optimizers.build_sgdm(1.0), learning_rate=LR,
      dataset_fn=data.dataset_fn(LOCAL))
  update_type = work.next.type_signature.result.result.member.update
  aggregator = stacking.build_stacking_aggregator(update_type, 3)
  broadcast = ((ModelWeights([W0], []),),) * 2
  out = work.next(work.initialize(), list(broadcast),
                  data.keys([0, 1], seed=0, round_num=0))
  results = out.result
  stack = aggregator.next(aggregator.initialize(),
                          [r.update for r in results],
                          [r.update_weight for r in results]).result
  assert int(stack.count) == 2
  rows = stack.values['deltas'][0].trainable[0]
  # Rows arrive in any order; identify them by their weights (1 and 3).
  order = np.argsort(np.asarray(stack.weights)[:2])
  np.testing.assert_allclose(np.asarray(stack.weights)[:2][order], [1, 3])
  for row, part in zip(order, PARTS):
    np.testing.assert_allclose(rows[row], _client_delta(part, LR),
                               rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(rows[2], np.zeros_like(W0))  # Unused slot.
  # More clients than slots: a clear error, not an index error.
  small = stacking.build_stacking_aggregator(update_type, 1)
  with pytest.raises(Exception, match='more clients than the 1 teacher'):
    small.next(small.initialize(), [r.update for r in results],
               [r.update_weight for r in results])


@pytest.mark.parametrize('drop_worst', [False, True])
def test_process_fusion_matches_eager_fuse(data, pool, drop_worst):
  config = distill_hparams.DistillConfig.plain(steps=6, batch_size=2, seed=5,
                                      eval_every=2)
  output = _round(_build(data, pool, distill_lr=0.1, config=config,
                         drop_worst=drop_worst), data)
  deltas = [_client_delta(p, LR).astype(np.float32) for p in PARTS]
  accs = [link_checks.np_accuracy(VAL_X @ (W0 + d), VAL_Y) for d in deltas]
  assert accs[0] <= 0.5 < accs[1]  # The premise of the drop-worst case.
  start = W0 + (deltas[0] + 3 * deltas[1]) / 4
  proto = feddf_tf.Prototype(
      student=_model_fn(), teacher=_model_fn(),
      global_weights=ModelWeights([W0], []),
      deltas=ModelWeights([np.stack(deltas)], []),
      valid=tf.constant([True, True]),
      start_weights=ModelWeights([start], []))
  expected = feddf_tf.fuse(
      [proto], tff.learning.optimizers.build_adam(0.1), X, config,
      val_x=VAL_X, val_y=VAL_Y, drop_worst=drop_worst)
  new = output.state.global_model_weights[0].trainable[0]
  np.testing.assert_allclose(new, expected.weights[0].trainable[0],
                             rtol=1e-4, atol=1e-5)
  assert not np.allclose(new, start, atol=1e-3)  # Distillation moved it.
  m = output.metrics['finalizer']
  assert m['num_teachers'] == 2
  assert m['teachers_kept'] == (1 if drop_worst else 2)
  assert m['steps'] == 6
  # The link table, from the same teachers by hand: AVGLOGITS over the kept
  # teachers (FedDF's own), both uniform averages over all of them, the
  # average (before) and the distilled student (after); the target's
  # entropy lies in (0, log 2].
  val_logits = np.stack([VAL_X @ (W0 + d) for d in deltas])
  kept = [1] if drop_worst else [0, 1]
  link_checks.assert_links_match(m, link_checks.expected_links(
      val_logits, VAL_Y, np.mean(val_logits[kept], 0), VAL_X @ start,
      VAL_X @ np.asarray(new), target_entropy=None))
  link_checks.assert_links_in_range(m, target_classes=2)
  assert m['distill_seconds'] > 0 and m['samples_per_second'] > 0


def _cnn_fn(norm):
  def build():
    from tff_kd import models  # pylint: disable=g-import-not-at-top
    return models.build_classifier('cnn', input_shape=(2, 2, 1),
                                   num_classes=2, norm=norm, seed=0).model
  return build


def test_heterogeneous_clients_train_only_their_prototype(tmp_path):
  x = np.random.default_rng(0).normal(size=(6, 2, 2, 1)).astype(np.float32)
  y = np.array([0, 1, 0, 1, 0, 1], np.int32)
  data = client_data.FileClientData.create(
      str(tmp_path / 'c'), x, y, [np.arange(3), np.arange(3, 6)])
  fns = (_cnn_fn('batch'), _cnn_fn('group'))
  work = feddf_tff.build_prototype_client_work(
      fns, data.element_spec, tff.learning.optimizers.build_sgdm(0.1),
      learning_rate=0.1, dataset_fn=data.dataset_fn(LOCAL))
  initial = feddf_tff.build_initial_weights_fn(fns)()
  out = work.next(work.initialize(), [initial] * 2,
                  data.keys([0, 1], seed=0, round_num=0))
  for client, result in enumerate(out.result):
    assert result.update['prototype'] == client  # Client i -> i % 2.
    for p, delta in enumerate(result.update['deltas']):
      zero = ModelWeights([np.zeros_like(d) for d in delta.trainable], [])
      assert _moved(delta, zero) == (p == client)


def test_bad_inputs_fail_with_one_clear_line(data, pool, tmp_path):
  wrong = server_data.ServerData.create(
      str(tmp_path / 'wrong'), np.zeros((4, 3), np.float32))
  with pytest.raises(errors.DataError,
                     match=r'shape \(3,\) but the model expects \(2,\)'):
    _build(data, wrong)
  with pytest.raises(errors.ConfigError,
                     match='distill.steps must be an integer >= 1, '
                     'got 0'):
    _build(data, pool, config=distill_hparams.DistillConfig.plain(steps=0))
  no_val = server_data.ServerData.create(str(tmp_path / 'noval'), X)
  with pytest.raises(errors.ConfigError, match='drop_worst needs'):
    _build(data, no_val, drop_worst=True)
  with pytest.raises(errors.DataError, match='non-empty'):
    server_data.ServerData.create(str(tmp_path / 'empty'),
                                  np.zeros((0, 2), np.float32))


def test_registry_has_feddf():
  method = registry.get_method('feddf')
  assert method.needs_server_data
  assert isinstance(common.ProcessInputs(_model_fn, collections.OrderedDict(),
                                           2).prototype_fns, tuple)
