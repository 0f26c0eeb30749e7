"""The FedFTG process: golden server fine-tuning, state, bad input, e2e.

One toy process (tests/algorithms/toy_kd.py) with 3 teacher slots and 2
clients is built once per module; its round is checked against
`tff_kd.federated.fedftg.round_fine_tune` (i.e. `core.fedftg.fine_tune`,
which distils through `distillation.distill`) run eagerly on the eagerly
computed client models, with only the 2 real teachers: the empty slot must
not matter.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.algorithms import toy_kd
from tests.program.test_experiment import _config
from tff_kd import errors
from tff_kd import models
from tff_kd.algorithms import fedftg
from tff_kd.algorithms import registry
from tff_kd.core import distillation
from tff_kd.data import load_dataset
from tff_kd.federated import fedftg as fedftg_tff
from tff_kd.models import generators
from tff_kd.program import evaluation
from tff_kd.program import experiment

ModelWeights = tff.learning.models.ModelWeights
KW = dict(iterations=3, student_steps=2, batch_size=8, noise_dim=4,
          temperature=2.0, mask='none', seed=7)


def _build(data, **overrides):
  kwargs = dict(KW, **overrides)
  return fedftg.build_fedftg_process(
      toy_kd.classifier_fn, data.element_spec,
      num_classes=toy_kd.NUM_CLASSES, clients_per_round=3,
      client_optimizer=tff.learning.optimizers.build_sgdm(toy_kd.LR),
      server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
      generator_optimizer=tff.learning.optimizers.build_adam(1e-2),
      student_optimizer=tff.learning.optimizers.build_sgdm(0.5),
      learning_rate=toy_kd.LR, dataset_fn=data.dataset_fn(toy_kd.LOCAL),
      **kwargs)


def _generator_fn():
  return generators.build_image_generator(
      noise_dim=4, num_classes=3, image_shape=(2,), seed=7)


def _tuning():
  return fedftg_tff.FineTuning(
      generator_fn=_generator_fn,
      generator_optimizer=tff.learning.optimizers.build_adam(1e-2),
      student_optimizer=tff.learning.optimizers.build_sgdm(0.5),
      distill_config=distillation.DistillConfig(
          steps=2, batch_size=8, temperature=2.0, eval_every=2, seed=7,
          student_training=False),
      iterations=3, noise_dim=4, noise='gaussian', transfer_weight=1.0,
      diversity_weight=1.0, mask='none', ensemble='logits', lr_decay=0.998,
      seed=7)


@pytest.fixture(scope='module')
def toy(tmp_path_factory):
  data = toy_kd.make_data(str(tmp_path_factory.mktemp('clients')))
  process = _build(data)
  state0 = process.initialize()
  keys = data.keys([0, 1], seed=0, round_num=0)
  return data, process, state0, keys, process.next(state0, keys)


def test_server_fine_tuning_matches_eager_core(toy):
  data, _, state0, keys, out = toy
  w0 = state0.global_model_weights
  deltas = toy_kd.client_deltas(data, w0, keys)
  n = np.array([3.0, 4.0])
  start = [w + (n[0] * d0 + n[1] * d1) / n.sum()
           for w, d0, d1 in zip(w0.trainable, *deltas)]
  student = toy_kd.classifier_fn().model
  toy_kd.assign(student, ModelWeights(start, []))
  teachers = []
  for d in deltas:
    teacher = toy_kd.classifier_fn().model
    toy_kd.assign(teacher, ModelWeights(
        [w + dk for w, dk in zip(w0.trainable, d)], []))
    teachers.append(teacher)
  generator = _generator_fn()
  gen0 = fedftg.generator_weights(state0)
  toy_kd.assign(generator, gen0)
  tuning = _tuning()
  expected = fedftg_tff.round_fine_tune(
      student, teachers, toy_kd.COUNTS, generator,
      state0.finalizer['generator_optimizer'], 0, tuning)

  new = out.state.global_model_weights
  for got, want in zip(new.trainable, toy_kd.values(student)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert max(np.abs(g - s).max() for g, s in zip(new.trainable, start)
             ) > 1e-3  # Fine-tuning moved the FedAvg model.
  # Generator: as in test_fedgen, the biases that feed BatchNorm (and the
  # moving means after them) have rounding-noise gradients that Adam
  # magnifies; compare them loosely.
  got_gen = toy_kd.flat(fedftg.generator_weights(out.state))
  for i, (got, want) in enumerate(zip(got_gen, toy_kd.values(generator))):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-3, err_msg=i)
  assert not np.allclose(got_gen[0], toy_kd.flat(gen0)[0])
  m = out.metrics['finalizer']
  assert m['num_teachers'] == 2
  for key in ('generator_loss', 'fidelity', 'transfer', 'diversity',
              'teacher_accuracy', 'distill_loss', 'distill_first_loss',
              'distill_last_loss'):
    np.testing.assert_allclose(m[key], float(getattr(expected, key)),
                               rtol=1e-4, atol=1e-6, err_msg=key)
  assert m['transfer'] > 0 and m['distill_loss'] > 0
  np.testing.assert_allclose(
      m['generator_loss'], m['fidelity'] - m['transfer'] + m['diversity'],
      rtol=1e-5)
  assert m['student_learning_rate'] == pytest.approx(0.5)
  assert out.state.finalizer['round'] == 1


def test_model_weights_and_state(toy):
  _, process, state0, _, out = toy
  got = process.get_model_weights(out.state)
  for a, b in zip(toy_kd.flat(got), toy_kd.flat(out.state.global_model_weights)):
    np.testing.assert_array_equal(a, b)
  back = process.set_model_weights(out.state,
                                   process.get_model_weights(state0))
  for a, b in zip(toy_kd.flat(back.global_model_weights),
                  toy_kd.flat(state0.global_model_weights)):
    np.testing.assert_array_equal(a, b)
  # The generator and its Adam state persist in the server state.
  assert int(out.state.finalizer['generator_optimizer']['step']) == 3
  cw = out.metrics['client_work']
  assert cw['num_examples'] == 7 and cw['num_clients'] == 2


@pytest.mark.parametrize('overrides,match', [
    ({'iterations': 0}, 'iterations must be an integer >= 1'),
    ({'student_steps': 0}, 'student_steps must be an integer >= 1'),
    ({'noise': 'pink'}, "noise 'pink' is unknown"),
    ({'mask': 'some'}, "mask 'some' is unknown"),
    ({'ensemble': 'max'}, "ensemble 'max' is unknown"),
    ({'lr_decay': 1.5}, r'lr_decay must be in \(0, 1\]'),
    ({'temperature': 0.0}, 'temperature must be > 0'),
    ({'dataset_fn': None}, 'needs keyed client data'),
])
def test_bad_settings_fail_before_compute(tmp_path, overrides, match):
  data = toy_kd.make_data(str(tmp_path))
  with pytest.raises(errors.ConfigError, match=match):
    if 'dataset_fn' in overrides:
      kwargs = dict(KW)
      fedftg.build_fedftg_process(
          toy_kd.classifier_fn, data.element_spec, num_classes=3,
          clients_per_round=2,
          client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
          server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
          generator_optimizer=tff.learning.optimizers.build_adam(1e-3),
          student_optimizer=tff.learning.optimizers.build_sgdm(0.1),
          learning_rate=0.1, dataset_fn=None, **kwargs)
    else:
      _build(data, **overrides)


def test_registry_and_shipped_config():
  assert registry.get_method('fedftg').name == 'fedftg'
  from configs import fedftg_mnist  # pylint: disable=g-import-not-at-top
  c = fedftg_mnist.get_config()
  experiment.validate_config(c)
  assert c.method == 'fedftg' and c.partition.alpha == 0.1
  assert c.clients_per_round == 8 and c.partition.num_clients == 20


def test_fedftg_run_improves_accuracy(tmp_path):
  c = _config(**{'method': 'fedftg', 'rounds': 3, 'export': False,
                 'fedftg.iterations': 3, 'fedftg.batch_size': 32,
                 'fedftg.noise_dim': 16})
  result = experiment.run(c, str(tmp_path), progress=False)
  digits = load_dataset('digits')
  model = models.build_classifier('cnn', input_shape=(8, 8, 1),
                                  num_classes=10, seed=c.seed).model
  start = evaluation.Evaluator(model, digits.x_test, digits.y_test)(
      ModelWeights([v.numpy() for v in model.trainable_weights],
                   [v.numpy() for v in model.non_trainable_weights]))
  assert result.final['test/accuracy'] > start.accuracy + 0.2, (
      start, result.final)
  last = result.history[-1]
  assert last['distill/num_teachers'] == c.clients_per_round
  for key in ('generator_loss', 'fidelity', 'transfer', 'diversity',
              'distill_loss'):
    assert np.isfinite(last[f'distill/{key}']), key
  assert 0 <= last['distill/teacher_accuracy'] <= 1
  assert last['distill/distill_loss'] >= 0
