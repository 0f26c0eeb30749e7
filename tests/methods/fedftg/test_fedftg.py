"""The FedFTG process: golden server fine-tuning, state, bad input, e2e.

One toy process (tests/methods/toy_kd.py) with 3 teacher slots and 2
clients is built once per module; its round is checked against
`tff_kd.methods.fedftg.fedftg_tff.round_fine_tune` (i.e. `fedftg_tf.fine_tune`,
which distils through `distillation.distill`) run eagerly on the eagerly
computed client models, with only the 2 real teachers: the empty slot must
not matter. A twin process with a labeled server validation set reports
the round's link table (`tff_kd.core.links`), recomputed here in numpy from
the same models, and its rounds are bit-identical to the process without
it.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.methods import link_checks
from tests.methods import toy_kd
from tff_kd import errors
from tff_kd.core import distill_hparams
from tff_kd.core import distillation
from tff_kd.core import fused
from tff_kd.core import links
from tff_kd.core import local_training
from tff_kd.federated import learning
from tff_kd.federated import server_data as server_data_lib
from tff_kd.methods import registry
from tff_kd.methods.fedftg import fedftg_tf
from tff_kd.methods.fedftg import fedftg_tff
from tff_kd.methods.fedftg import fedftg_tff as fedftg
from tff_kd.methods.fedftg import hparams as fedftg_hparams
from tff_kd.models import classifiers
from tff_kd.models import generators
from tff_kd.program import experiment

ModelWeights = tff.learning.models.ModelWeights
KW = dict(iterations=3, student_steps=2, noise_dim=4, mask='none')
# The student's `distill` keys (`fedftg_hparams.DISTILL_KEYS`).
DISTILL_KW = dict(fedftg_hparams.DISTILL_DEFAULTS, batch_size=8,
                  temperature=2.0)


def _build(data, server_data=None, classifier_fn=toy_kd.classifier_fn,
           **overrides):
  distill = {k: v for k, v in overrides.items() if k in DISTILL_KW}
  own = {k: v for k, v in overrides.items() if k not in DISTILL_KW}
  return fedftg.build_fedftg_process(
      classifier_fn, data.element_spec,
      clients_per_round=3,
      training=learning.Training(
          client_optimizer=tff.learning.optimizers.build_sgdm(toy_kd.LR),
          server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
          learning_rate=toy_kd.LR),
      generator_optimizer=tff.learning.optimizers.build_adam(1e-2),
      distillation=distillation.Distillation(
          optimizer=tff.learning.optimizers.build_sgdm(0.5),
          config=distill_hparams.DistillConfig(
              **dict(DISTILL_KW, **distill))),
      dataset_fn=data.dataset_fn(toy_kd.LOCAL), seed=7,
      hparams=fedftg_hparams.FedFTGHparams(**dict(KW, **own)),
      server_data=server_data)


def _generator_fn():
  return generators.build_image_generator(
      noise_dim=4, num_classes=3, image_shape=(2,), seed=7)


def _tuning():
  return fedftg_tff.FineTuning(
      generator_fn=_generator_fn,
      generator_optimizer=tff.learning.optimizers.build_adam(1e-2),
      student_optimizer=tff.learning.optimizers.build_sgdm(0.5),
      distill_config=distill_hparams.DistillConfig.plain(
          steps=2, batch_size=8, temperature=2.0, eval_every=2, seed=7,
          student_training=False, kl_reduction='mean'),
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
  # 3 iterations x one generator step per teacher (2 clients).
  assert int(out.state.finalizer['generator_optimizer']['step']) == 6
  cw = out.metrics['client_work']['train']
  assert cw['num_examples'] == 7 and cw['num_clients'] == 2


@pytest.mark.parametrize('overrides,match', [
    ({'iterations': 0}, 'fedftg.iterations must be an integer >= 1'),
    ({'student_steps': 0}, 'fedftg.student_steps must be an integer >= 1'),
    ({'noise': 'pink'}, "fedftg.noise 'pink' is unknown"),
    ({'mask': 'some'}, "fedftg.mask 'some' is unknown"),
    ({'ensemble': 'max'}, "fedftg.ensemble 'max' is unknown"),
    ({'lr_decay': 1.5}, r'distill.lr_decay must be in \(0, 1\]'),
    ({'temperature': 0.0}, 'distill.temperature must be a finite number > 0'),
])
def test_bad_settings_fail_before_compute(tmp_path, overrides, match):
  data = toy_kd.make_data(str(tmp_path))
  with pytest.raises(errors.ConfigError, match=match):
    if 'dataset_fn' in overrides:
      fedftg.build_fedftg_process(
          toy_kd.classifier_fn, data.element_spec,
          clients_per_round=2,
          training=learning.Training(
              client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
              server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
              learning_rate=0.1),
          generator_optimizer=tff.learning.optimizers.build_adam(1e-3),
          distillation=distillation.Distillation(
              optimizer=tff.learning.optimizers.build_sgdm(0.1),
              config=distill_hparams.DistillConfig(
                  **fedftg_hparams.DISTILL_DEFAULTS)),
          dataset_fn=None, seed=7,
          hparams=fedftg_hparams.FedFTGHparams(**KW))
    else:
      _build(data, **overrides)


def test_registry_and_shipped_config():
  assert registry.get_method('fedftg').name == 'fedftg'
  from configs import fedftg_mnist  # pylint: disable=g-import-not-at-top
  c = fedftg_mnist.get_config()
  experiment.from_config(c)
  assert c.method == 'fedftg' and c.partition.alpha == 0.1
  assert c.clients_per_round == 8 and c.partition.num_clients == 20


def _adam_step(w, g, lr, beta_1=0.9, beta_2=0.999, eps=1e-7):
  """The first step of Adam (TFF's form, bias-corrected learning rate)."""
  m, v = (1 - beta_1) * g, (1 - beta_2) * g * g
  return w - lr * np.sqrt(1 - beta_2) / (1 - beta_1) * m / (np.sqrt(v) + eps)


def test_one_fine_tune_iteration_matches_an_independent_computation():
  """One iteration (1 generator step, 2 student steps), written out.

  Generator step: x = G(z, y), D_T = softmax(sum_k a_{k,y} z_k(x)) with
  a_{k,c} = n_{k,c} / n_c, loss = -mean log D_T[y] - T^2 mean KL(D_T^(1/T)
  || softmax(s(x) / T)) + exp(-mean_ij l1(x_i, x_j) sq(z_i, z_j)), one Adam
  step. Student: a fresh (z', y'), target softmax(sum_k a_{k,y'} z_k(x') /
  T), two SGD steps on T^2 mean KL / C (the reference's 'mean' reduction),
  the student in inference mode. Only the random draws reuse TF's stateless
  samplers with the seeds fine_tune derives.
  """
  temperature, lr_g, lr_s = 2.0, 1e-2, 0.5
  counts = toy_kd.COUNTS
  rng = np.random.default_rng(3)

  def models_():
    student = toy_kd.classifier_fn().model
    teachers = [toy_kd.classifier_fn().model for _ in range(2)]
    for k, t in enumerate(teachers):
      toy_kd.assign(t, ModelWeights(
          [w + 0.3 * (k + 1) * rng.normal(size=w.shape).astype(np.float32)
           for w in toy_kd.values(t)], []))
    return student, teachers, _generator_fn()

  student, teachers, gen = models_()
  start = toy_kd.values(student)
  gen_start = [v.numpy() for v in gen.trainable_weights]
  teacher_values = [toy_kd.values(t) for t in teachers]
  config = distill_hparams.DistillConfig.plain(
      steps=2, batch_size=8, temperature=temperature, eval_every=2, seed=7,
      kl_reduction='mean')
  adam = tff.learning.optimizers.build_adam(lr_g)
  sgd = tff.learning.optimizers.build_sgdm(lr_s)
  specs = lambda m: tuple(tf.TensorSpec(v.shape, v.dtype)
                          for v in m.trainable_weights)
  seed = tf.constant([7, 0], tf.int64)
  fedftg_tf.fine_tune(
      fedftg_tf.FineTuneModels(student, teachers, gen), counts,
      fedftg_tf.FineTuneOptimizers(adam, sgd),
      (adam.initialize(specs(gen)), sgd.initialize(specs(student))),
      fedftg_tf.FineTuneSettings(config, iterations=1, noise_dim=4,
                                 mask='none', generator_steps=1), seed)

  # The same, independently, on fresh copies of the models.
  student2, teachers2, gen2 = models_()
  toy_kd.assign(student2, ModelWeights(start, []))
  for t, values in zip(teachers2, teacher_values):
    toy_kd.assign(t, ModelWeights(values, []))
  alpha = counts / counts.sum(0)  # [K, C]
  seeds = tf.random.experimental.stateless_split(
      tf.random.experimental.stateless_fold_in(seed, 0), 4)

  def draw(s_labels, s_noise):
    labels = tf.random.stateless_categorical(
        np.log(counts.sum(0))[None].astype(np.float32), 8, seed=s_labels)[0]
    return tf.cast(labels, tf.int32), tf.random.stateless_normal(
        [8, 4], seed=s_noise)

  def teacher_logits(x, labels):
    a = tf.gather(alpha.T, labels)  # [B, K]
    return tf.einsum('bk,kbc->bc', a, tf.stack([t(x) for t in teachers2]))

  labels, z = draw(seeds[0], seeds[1])
  with tf.GradientTape() as tape:
    x = gen2([z, labels], training=True)
    d_t = tf.nn.softmax(teacher_logits(x, labels))
    fidelity = -tf.reduce_mean(tf.math.log(tf.gather(
        d_t, labels, axis=1, batch_dims=1)))
    tempered = tf.nn.softmax(tf.math.log(d_t) / temperature)
    log_s = tf.nn.log_softmax(student2(x, training=False) / temperature)
    transfer = tf.reduce_mean(tf.reduce_sum(
        tempered * (tf.math.log(tempered) - log_s), -1)) * temperature**2
    l1 = tf.reduce_mean(tf.abs(x[:, None] - x[None]), -1)
    sq = tf.reduce_mean(tf.square(z[:, None] - z[None]), -1)
    loss = fidelity - transfer + tf.exp(-tf.reduce_mean(l1 * sq))
  grads = tape.gradient(loss, gen2.trainable_weights)
  for v, g in zip(gen2.trainable_weights, grads):
    v.assign(_adam_step(v.numpy(), g.numpy(), lr_g))
  # The biases feeding BatchNorm get rounding-noise gradients that Adam
  # magnifies: compare the generator loosely (as the process test does).
  for got, want in zip(gen.trainable_weights, gen2.trainable_weights):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4,
                               atol=2e-3)
  assert not np.allclose(gen.trainable_weights[0].numpy(), gen_start[0])

  labels, z = draw(seeds[2], seeds[3])
  x = gen2([z, labels], training=True)
  target = tf.nn.softmax(teacher_logits(x, labels) / temperature).numpy()
  for _ in range(2):
    with tf.GradientTape() as tape:
      log_s = tf.nn.log_softmax(student2(x, training=False) / temperature)
      kl = tf.reduce_sum(target * (np.log(target) - log_s), -1)
      loss = tf.reduce_mean(kl) * temperature**2 / 3  # / C: 'mean'.
    grads = tape.gradient(loss, student2.trainable_weights)
    for v, g in zip(student2.trainable_weights, grads):
      v.assign(v - lr_s * g)
  for got, want in zip(toy_kd.values(student), toy_kd.values(student2)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert max(np.abs(a - b).max()
             for a, b in zip(toy_kd.values(student), start)) > 1e-3


VAL_X, VAL_Y = link_checks.TOY_VAL_X, link_checks.TOY_VAL_Y


@pytest.fixture(scope='module')
def toy_labeled(tmp_path_factory, toy):
  """Two rounds without and with a labeled server validation set.

  Returns:
    (keys of round 1, the plain process's two rounds, the labeled twin's).
  """
  data, process, state0, keys0, out0 = toy
  keys1 = data.keys([0, 1], seed=0, round_num=1)
  plain = (out0, process.next(out0.state, keys1))
  server_data = server_data_lib.ServerData.create(
      str(tmp_path_factory.mktemp('server')), toy_kd.X, VAL_X, VAL_Y)
  labeled = _build(data, server_data=server_data)
  l0 = labeled.next(state0, keys0)
  return (keys0, keys1), plain, (l0, labeled.next(l0.state, keys1))


def test_the_link_hook_leaves_the_round_unchanged(toy_labeled):
  """Same state (student, generator and its Adam state) and algorithm
  metrics, bit for bit, over two rounds, with the link table measured
  (labeled set) and without it (where every link reads -1)."""
  _, plain, measured = toy_labeled
  link_checks.assert_round_unchanged(plain, measured)
  for a_out, b_out in zip(plain, measured):
    for a, b in zip(toy_kd.flat(fedftg.generator_weights(a_out.state)),
                    toy_kd.flat(fedftg.generator_weights(b_out.state))):
      np.testing.assert_array_equal(a, b)


def test_two_rounds_report_the_link_table(toy_labeled):
  for out in toy_labeled[2]:
    # Generated batches: no fixed pool, so no target entropy.
    link_checks.assert_links_in_range(out.metrics['finalizer'])


@pytest.mark.parametrize('round_num', [0, 1])
def test_link_table_matches_numpy(toy, toy_labeled, round_num):
  """The links, from the same models on the same labeled images.

  Teachers: broadcast classifier + each client's delta (the empty third
  slot is left out); FedFTG's class-level ensemble weights teacher k's
  logits by its share n_{k,y} / n_y of the image's true label y
  (ensemble='logits'); before: the FedAvg average (example weights 3 and
  4); after: the fine-tuned student the round returns; no target.
  """
  data, _, state0, _, _ = toy
  keys, _, measured = toy_labeled
  w0 = (state0, measured[0].state)[round_num].global_model_weights
  deltas = toy_kd.client_deltas(data, w0, keys[round_num])
  teachers = np.stack([
      link_checks.np_toy_logits(
          [w + d for w, d in zip(w0.trainable, delta)], VAL_X)
      for delta in deltas])  # [K, V, C]
  start = [w + (3.0 * d0 + 4.0 * d1) / 7.0
           for w, d0, d1 in zip(w0.trainable, *deltas)]
  tuned = measured[round_num].state.global_model_weights.trainable
  want = link_checks.expected_links(
      teachers, VAL_Y,
      link_checks.np_class_share_ensemble(teachers, toy_kd.COUNTS, VAL_Y),
      link_checks.np_toy_logits(start, VAL_X),
      link_checks.np_toy_logits(tuned, VAL_X))
  link_checks.assert_links_match(measured[round_num].metrics['finalizer'],
                                 want)
  assert 0 < want['teacher_labeled_accuracy'] < 1
  # The class weighting matters here: FedFTG's ensemble is not the average.
  assert (want['ensemble_labeled_accuracy'] !=
          want['ensemble_labeled_accuracy_logits'])


def test_link_table_probs_ensemble_and_an_empty_slot_match_numpy():
  """`link_table` eagerly: ensemble='probs', a masked third teacher (its
  logits and counts must not count), before/after two given students."""
  rng = np.random.default_rng(5)

  def random_weights():
    return [w + rng.normal(size=w.shape).astype(np.float32)
            for w in toy_kd.values(toy_kd.classifier_fn().model)]

  teacher_weights = [random_weights() for _ in range(3)]
  teachers = []
  for w in teacher_weights:
    teacher = toy_kd.classifier_fn().model
    toy_kd.assign(teacher, ModelWeights(w, []))
    teachers.append(teacher)
  before, after = random_weights(), random_weights()
  student = toy_kd.classifier_fn().model
  counts = np.concatenate([toy_kd.COUNTS, np.zeros([1, 3], np.float32)])
  valid = tf.constant([True, True, False])
  table = fedftg_tff.link_table(
      fedftg_tf.FineTuneModels(student, teachers, None),
      ModelWeights(before, []), ModelWeights(after, []), valid, counts,
      (tf.constant(VAL_X), tf.constant(VAL_Y)), ensemble='probs',
      batch_size=5)
  assert list(table) == list(links.NAMES)
  logits = np.stack([link_checks.np_toy_logits(w, VAL_X)
                     for w in teacher_weights[:2]])
  own = link_checks.np_class_share_ensemble(
      link_checks.np_softmax(logits), toy_kd.COUNTS, VAL_Y)
  link_checks.assert_links_match(table, link_checks.expected_links(
      logits, VAL_Y, own, link_checks.np_toy_logits(before, VAL_X),
      link_checks.np_toy_logits(after, VAL_X)))


def test_labeled_images_of_another_shape_are_refused(tmp_path):
  link_checks.assert_labeled_images_of_another_shape_are_refused(
      _build, tmp_path)


def _norm_classifier_fn():
  """A toy classifier with BatchNorm (moving statistics per teacher)."""
  seeds = classifiers.InitSeeds(5)
  inputs = tf.keras.Input((2,))
  x = tf.keras.layers.Dense(4, kernel_initializer=seeds('glorot'))(inputs)
  x = tf.keras.layers.BatchNormalization()(x)
  x = tf.keras.layers.ReLU()(x)
  outputs = tf.keras.layers.Dense(
      3, kernel_initializer=seeds('glorot'))(x)
  return tf.keras.Model(inputs, outputs)


def test_stacked_teachers_give_the_models_round():
  """`teachers='stacked'` runs `_server_round` as the K Keras models do.

  Three slots, the last empty: its uploaded non-trainable rows are NaN, so
  a stacked row that read them instead of the global statistics (as the
  per-model path does) would turn the masked logits into NaN. Each filled
  teacher has its own weights and BatchNorm statistics; the labeled set
  runs the link table's batched teacher pass (2 batches).
  """
  rng = np.random.default_rng(0)
  structure = _norm_classifier_fn()
  weights = local_training.model_weights(structure)
  global_weights = ModelWeights(
      [v.numpy() for v in weights.trainable],
      [np.abs(v.numpy()) + 0.5 for v in weights.non_trainable])
  filled = np.array([True, True, False])

  def rows(values, empty):
    out = []
    for v in values:
      d = (0.2 * rng.normal(size=(3,) + v.shape)).astype(np.float32)
      d[2] = empty
      out.append(d)
    return out

  deltas = ModelWeights(
      rows(global_weights.trainable, 0.0),
      # Whole statistics (not deltas): positive, the empty row NaN.
      [np.abs(d) + 0.5 for d in rows(global_weights.non_trainable, np.nan)])
  counts = np.array([[5.0, 1.0, 0.0], [0.0, 4.0, 6.0], [0.0, 0.0, 0.0]],
                    np.float32)
  uploads = fedftg_tff._Uploads(  # pylint: disable=protected-access
      deltas, tf.constant(filled), tf.constant(counts))
  labeled = (tf.constant(rng.normal(size=(300, 2)), tf.float32),
             tf.constant(rng.integers(0, 3, size=300), tf.int32))
  tuning = _tuning()._replace(iterations=2)
  gen_weights = local_training.model_weights(_generator_fn())
  gen_state = tuning.generator_optimizer.initialize(tuple(
      tf.TensorSpec(v.shape, v.dtype) for v in gen_weights.trainable))
  results = {}
  for mode in ('models', 'stacked'):
    teachers = (fused.StackedModel(_norm_classifier_fn()) if mode == 'stacked'
                else [_norm_classifier_fn() for _ in range(3)])
    results[mode] = tf.nest.map_structure(
        np.asarray, fedftg_tff._server_round(  # pylint: disable=protected-access
            fedftg_tf.FineTuneModels(_norm_classifier_fn(), teachers,
                                     _generator_fn()),
            global_weights, global_weights, uploads, gen_weights, gen_state,
            tf.constant(0), tuning, labeled=labeled))
  models, stacked = results['models'], results['stacked']
  for part in (0, 1, 3):  # The result, the student, the link table.
    for a, b in zip(tf.nest.flatten(models[part]),
                    tf.nest.flatten(stacked[part])):
      assert np.all(np.isfinite(b)), part
      np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5, err_msg=part)
  # The generator's biases that feed BatchNorm get rounding-noise gradients
  # that Adam magnifies to steps of its learning rate's size (as in
  # `test_server_fine_tuning_matches_eager_core`): loosely.
  for a, b in zip(tf.nest.flatten(models[2]), tf.nest.flatten(stacked[2])):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=2e-3)
  table = models[3]
  assert 0.0 <= table['teacher_labeled_accuracy'] <= 1.0
  # The student moved: the comparison is of a real round.
  assert max(np.abs(s - g).max() for s, g in zip(
      models[1].trainable, global_weights.trainable)) > 1e-4


def test_stacked_teachers_need_an_architecture_fused_clients_run(tmp_path):
  def classifier_fn():
    inputs = tf.keras.Input((2,))
    x = tf.keras.layers.LayerNormalization()(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(3)(x))
    return classifiers.Classifier(model, model, model, 3)

  data = toy_kd.make_data(str(tmp_path))
  with pytest.raises(errors.ConfigError,
                     match="fedftg teachers='stacked' runs the teachers as "
                     'one stacked model: .*LayerNormalization'):
    _build(data, classifier_fn=classifier_fn, teachers='stacked')
