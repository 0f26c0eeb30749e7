"""The FedGen process: golden server and client steps, state, bad input, e2e.

One toy process (tests/methods/toy_kd.py) is built once per module. Its
rounds are checked against the same pure-TF code run eagerly on the clients'
eagerly computed updates: the FedAvg of the classifiers, the generator's
50-step round (`tff_kd.methods.fedgen.fedgen_tff.generator_round`, i.e.
`fedgen_tf.train_generator`) on the received heads and label counts, and,
in round 1, the clients' regularised local training. A twin process with a
labeled server validation set reports the round's link table
(`tff_kd.core.links`), recomputed here in numpy from the same models, and
its rounds are bit-identical to the process without it.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.methods import link_checks
from tests.methods import toy_kd
from tff_kd import errors
from tff_kd import models
from tff_kd.federated import learning
from tff_kd.federated import server_data as server_data_lib
from tff_kd.methods import registry
from tff_kd.methods.fedgen import fedgen_tff
from tff_kd.methods.fedgen import fedgen_tff as fedgen
from tff_kd.methods.fedgen import hparams as fedgen_hparams
from tff_kd.models import generators
from tff_kd.program import experiment

ModelWeights = tff.learning.models.ModelWeights
KW = dict(generator_steps=4, generator_batch_size=8, noise_dim=4, hidden=8,
          local_gen_batch_size=4, local_alpha=2.0, local_beta=1.0)


def _fedavg_training(learning_rate: float) -> learning.Training:
  return learning.Training(
      client_optimizer=tff.learning.optimizers.build_sgdm(learning_rate),
      server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
      learning_rate=learning_rate)


def _build(data, server_data=None, **overrides):
  kwargs = dict(seed=7, hparams=fedgen_hparams.FedGenHparams(**dict(KW,
                                                             **overrides)),
                server_data=server_data)
  return fedgen.build_fedgen_process(
      toy_kd.classifier_fn, data.element_spec,
      clients_per_round=2,
      training=_fedavg_training(toy_kd.LR),
      generator_optimizer=tff.learning.optimizers.build_adam(1e-2),
      dataset_fn=data.dataset_fn(toy_kd.LOCAL),
      local_batch_size=toy_kd.LOCAL.batch_size, **kwargs)


def _generator_fn():
  return generators.build_feature_generator(
      noise_dim=4, num_classes=3, feature_dim=4, hidden=8, seed=7)


def _regularized_work(data, local, **hparams):
  """FedGen's client work on `local` with the toy generator's regulariser
  (`hparams`: the FedGenHparams that differ between the tests)."""
  reg = fedgen_tff.LocalRegularizer(
      generator_fn=_generator_fn,
      hparams=fedgen_hparams.FedGenHparams(
          noise_dim=4, coefficient_decay=0.98, noise='gaussian',
          start_round=0, **hparams),
      batch_size=8, floor=1e-4)
  return fedgen_tff.build_client_work(
      toy_kd.classifier_fn, data.element_spec,
      tff.learning.optimizers.build_sgdm(toy_kd.LR), num_classes=3,
      learning_rate=toy_kd.LR, dataset_fn=data.dataset_fn(local),
      regularizer=reg)


def _training():
  return fedgen_tff.GeneratorTraining(
      generator_fn=_generator_fn,
      optimizer=tff.learning.optimizers.build_adam(1e-2),
      hparams=fedgen_hparams.FedGenHparams(
          generator_steps=4, generator_batch_size=8, noise_dim=4,
          noise='gaussian', teacher_weight=1.0, diversity_weight=1.0,
          ensemble='per_head'),
      seed=7)


@pytest.fixture(scope='module')
def toy(tmp_path_factory):
  data = toy_kd.make_data(str(tmp_path_factory.mktemp('clients')))
  process = _build(data)
  state0 = process.initialize()
  keys0 = data.keys([0, 1], seed=0, round_num=0)
  out0 = process.next(state0, keys0)
  keys1 = data.keys([0, 1], seed=0, round_num=1)
  out1 = process.next(out0.state, keys1)
  return data, process, state0, out0, out1, (keys0, keys1)


VAL_X, VAL_Y = link_checks.TOY_VAL_X, link_checks.TOY_VAL_Y


@pytest.fixture(scope='module')
def toy_labeled(tmp_path_factory, toy):
  """The toy's two rounds again, with a labeled server validation set."""
  data, _, state0, _, _, (keys0, keys1) = toy
  server_data = server_data_lib.ServerData.create(
      str(tmp_path_factory.mktemp('server')), toy_kd.X, VAL_X, VAL_Y)
  process = _build(data, server_data=server_data)
  out0 = process.next(state0, keys0)
  out1 = process.next(out0.state, keys1)
  return out0, out1


def _eager_generator_round(gen_weights, heads, counts, round_num):
  gen = _generator_fn()
  toy_kd.assign(gen, gen_weights)
  training = _training()
  state = training.optimizer.initialize(tuple(
      tf.TensorSpec(v.shape, v.dtype) for v in gen.trainable_weights))
  kernels = tf.constant(np.stack([h[0] for h in heads]))
  biases = tf.constant(np.stack([h[1] for h in heads]))
  result = fedgen_tff.generator_round(gen, kernels, biases,
                                      tf.constant(counts), state, round_num,
                                      training)
  return result, toy_kd.values(gen)


def test_round0_server_step_matches_eager_core(toy):
  data, _, state0, out0, _, (keys0, _) = toy
  clf0, gen0 = state0.global_model_weights
  deltas = toy_kd.client_deltas(data, clf0, keys0)
  n = np.array([3.0, 4.0])
  expected = [w + (n[0] * d0 + n[1] * d1) / n.sum()
              for w, d0, d1 in zip(clf0.trainable, *deltas)]
  new_clf, new_gen = out0.state.global_model_weights
  for got, want in zip(new_clf.trainable, expected):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # The generator trains on the clients' heads (last two trainables) with
  # their label counts: head k = global head + client k's delta.
  heads = [(clf0.trainable[-2] + d[-2], clf0.trainable[-1] + d[-1])
           for d in deltas]
  result, gen_values = _eager_generator_round(gen0, heads, toy_kd.COUNTS, 0)
  # Weights in Keras order: hidden kernel, hidden bias, BN gamma, BN beta,
  # output kernel, output bias, BN moving mean, moving variance. The hidden
  # bias feeds BatchNorm, so its gradient is 0 up to rounding, which Adam
  # magnifies to ~1e-4 (and the moving mean follows it): compare those two
  # loosely, everything else tightly.
  for i, (got, want) in enumerate(zip(toy_kd.flat(new_gen), gen_values)):
    atol = 1e-3 if i in (1, 6) else 1e-6
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol, err_msg=i)
  assert not np.allclose(toy_kd.flat(new_gen)[0], toy_kd.flat(gen0)[0])
  m = out0.metrics['finalizer']
  assert m['num_teachers'] == 2
  for key, value in (('generator_loss', result.loss),
                     ('teacher_loss', result.teacher_loss),
                     ('diversity_loss', result.diversity),
                     ('teacher_accuracy', result.teacher_accuracy)):
    np.testing.assert_allclose(m[key], float(value), rtol=1e-4, err_msg=key)
  np.testing.assert_allclose(
      m['generator_loss'], m['teacher_loss'] + m['diversity_loss'], rtol=1e-5)
  # The counts matter: with another client's counts the round differs, so
  # the match above pins the counts the clients uploaded.
  swapped, _ = _eager_generator_round(gen0, heads, toy_kd.COUNTS[::-1], 0)
  assert abs(float(swapped.teacher_loss) - m['teacher_loss']) > 1e-3
  cw = out0.metrics['client_work']['train']
  assert cw['num_examples'] == 7 and cw['num_clients'] == 2
  # Down: classifier + generator; up: classifier + 3 counts + weight.
  clf_bytes = sum(np.asarray(v).nbytes for v in toy_kd.flat(clf0))
  gen_bytes = sum(np.asarray(v).nbytes for v in toy_kd.flat(gen0))
  assert cw['bytes_down'] == 2 * (clf_bytes + gen_bytes)
  assert cw['bytes_up'] == 2 * (clf_bytes + 4 * 4)


def _eager_regularised_step(data, clf1, gen1, key):
  """One client's round-1 update, written out independently.

  The toy's local work is one full batch, so the round is one SGD step on
      CE(f(x), y) + a * 1/B' sum_j CE(h(G(eps_j, yhat_j)), yhat_j)
                 + b * 1/B sum_i KL(softmax(h(G(eps'_i, y_i))) || softmax(f(x_i)))
  with a = max(1e-4, 2 * 0.98) * B'/B, b = max(1e-4, 1 * 0.98) (round 1),
  yhat_j drawn uniformly over every class (the reference's
  `available_labels` are the federation's, not the client's), G in
  inference mode and its features constants. Only the random draws reuse
  TF's stateless samplers, seeded as the client does (key hash, step 0).
  Returns (the update, the drawn labels yhat, the labels the client holds).
  """
  clf = toy_kd.classifier_fn()
  toy_kd.assign(clf.model, clf1)
  gen = _generator_fn()
  toy_kd.assign(gen, gen1)
  # The batch in the client's shuffled order (eps'_i pairs with example i).
  batch = next(iter(data.dataset_fn(toy_kd.LOCAL)(tf.constant(key))))
  x, y = batch['x'].numpy(), batch['y'].numpy()
  held = np.unique(y)
  step_seed = tf.stack([tf.strings.to_hash_bucket_fast(key, 2**62),
                        tf.constant(0, tf.int64)])
  seeds = tf.random.experimental.stateless_split(step_seed, 3)
  uniform = np.zeros([1, 3], np.float32)  # Every class, held or not.
  sampled = tf.random.stateless_categorical(uniform, 4,
                                            seed=seeds[0])[0].numpy()
  eps = tf.random.stateless_normal([4, 4], seed=seeds[1])
  eps_y = tf.random.stateless_normal([len(y), 4], seed=seeds[2])
  z_hat = gen([eps, sampled], training=False).numpy()
  z_y = gen([eps_y, y], training=False).numpy()
  a = max(1e-4, 2.0 * 0.98) * 4 / 8
  b = max(1e-4, 1.0 * 0.98)
  p = tf.nn.softmax(clf.head(z_y)).numpy()  # The KL target: a constant.
  with tf.GradientTape() as tape:
    logits = clf.model(x, training=True)
    ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=y, logits=logits))
    teacher = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=sampled, logits=clf.head(z_hat)))
    kl = tf.reduce_mean(tf.reduce_sum(
        p * (np.log(p) - tf.nn.log_softmax(logits)), axis=-1))
    loss = ce + a * teacher + b * kl
  grads = tape.gradient(loss, clf.model.trainable_weights)
  return [-toy_kd.LR * g.numpy() for g in grads], sampled, held


def test_round1_clients_train_the_regularised_objective(toy):
  data, _, _, out0, out1, (_, keys1) = toy
  clf1, gen1 = out0.state.global_model_weights
  steps = [_eager_regularised_step(data, clf1, gen1, k) for k in keys1]
  deltas = [d for d, _, _ in steps]
  # The check has teeth: a client draws generated features of a label it
  # does not hold (the reference's draw over the federation's labels).
  assert any(set(sampled) - set(held) for _, sampled, held in steps)
  sizes = {int(k.split('|')[0]): len(toy_kd.PARTS[int(k.split('|')[0])])
           for k in keys1}
  n = np.array([sizes[int(k.split('|')[0])] for k in keys1], np.float32)
  new_clf = out1.state.global_model_weights[0]
  for i, got in enumerate(new_clf.trainable):
    want = clf1.trainable[i] + sum(
        nk * d[i] for nk, d in zip(n, deltas)) / n.sum()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=i)


def test_model_weights_view_is_the_classifier(toy):
  _, process, state0, out0, _, _ = toy
  clf, gen = out0.state.global_model_weights
  got = process.get_model_weights(out0.state)
  for a, b in zip(toy_kd.flat(got), toy_kd.flat(clf)):
    np.testing.assert_array_equal(a, b)
  new = process.set_model_weights(out0.state,
                                  process.get_model_weights(state0))
  for a, b in zip(toy_kd.flat(new.global_model_weights[0]),
                  toy_kd.flat(state0.global_model_weights[0])):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(toy_kd.flat(fedgen.generator_weights(new)),
                  toy_kd.flat(gen)):
    np.testing.assert_array_equal(a, b)  # The generator is untouched.


@pytest.mark.parametrize('overrides,match', [
    ({'generator_steps': 0}, 'fedgen.generator_steps must be an integer >= 1'),
    ({'noise': 'pink'}, "fedgen.noise 'pink' is unknown"),
    ({'ensemble': 'max'}, "fedgen.ensemble 'max' is unknown"),
    ({'local_alpha': -1.0}, 'fedgen.local_alpha must be a finite number >= 0'),
    ({'coefficient_decay': 0.0},
     r'fedgen.coefficient_decay must be in \(0, 1\]'),
    ({'output_activation': 'nosuch'}, 'fedgen.output_activation must be'),
])
def test_bad_settings_fail_before_compute(tmp_path, overrides, match):
  data = toy_kd.make_data(str(tmp_path))
  with pytest.raises(errors.ConfigError, match=match):
    if 'dataset_fn' in overrides:
      fedgen.build_fedgen_process(
          toy_kd.classifier_fn, data.element_spec,
          clients_per_round=2,
          training=_fedavg_training(0.1),
          generator_optimizer=tff.learning.optimizers.build_adam(1e-3),
          dataset_fn=None, local_batch_size=8)
    else:
      _build(data, **overrides)


def test_nonlinear_head_is_refused(tmp_path):
  def two_layer_head():
    clf = toy_kd.classifier_fn()
    feature_in = tf.keras.Input((4,))
    head = tf.keras.Model(feature_in, tf.keras.layers.Dense(3)(
        tf.keras.layers.Dense(5)(feature_in)))
    inputs = tf.keras.Input((2,))
    model = tf.keras.Model(inputs, head(clf.features(inputs)))
    return models.Classifier(model, clf.features, head, 4)

  data = toy_kd.make_data(str(tmp_path))
  with pytest.raises(errors.ConfigError, match='head is one Dense layer'):
    fedgen.build_fedgen_process(
        two_layer_head, data.element_spec,
        clients_per_round=2,
        training=_fedavg_training(0.1),
        generator_optimizer=tff.learning.optimizers.build_adam(1e-3),
        dataset_fn=data.dataset_fn(toy_kd.LOCAL), local_batch_size=8)


def test_registry_and_shipped_config():
  assert registry.get_method('fedgen').name == 'fedgen'
  from configs import fedgen_method_mnist  # pylint: disable=g-import-not-at-top
  c = fedgen_method_mnist.get_config()
  experiment.from_config(c)
  assert c.method == 'fedgen' and c.partition.alpha == 0.1
  assert c.clients_per_round == 8 and c.partition.num_clients == 20


def test_long_rounds_scale_the_regulariser_to_its_reference_steps(tmp_path):
  """40 local steps with coefficients tuned for 20: the same update as
  half the coefficients, unscaled (`LocalRegularizer.reference_steps`)."""
  data = toy_kd.make_data(str(tmp_path))
  local = toy_kd.LOCAL._replace(unit='steps', amount=40)

  def update(alpha, beta, reference_steps):
    work = _regularized_work(data, local, local_alpha=alpha,
                             local_beta=beta, local_gen_batch_size=4,
                             reference_steps=reference_steps)
    weights = (toy_kd.values_of(toy_kd.classifier_fn().model),
               toy_kd.values_of(_generator_fn()))
    out = work.next(work.initialize(), [weights],
                    data.keys([1], seed=0, round_num=0))
    return [np.asarray(d) for d in out.result[0].update['delta'].trainable]

  scaled = update(2.0, 1.0, 20)
  for a, b in zip(scaled, update(1.0, 0.5, 0)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert max(np.abs(a - b).max()
             for a, b in zip(scaled, update(2.0, 1.0, 0))) > 1e-4


def test_the_link_hook_leaves_the_round_unchanged(toy, toy_labeled):
  """Same state and algorithm metrics, bit for bit, with the link table
  measured (labeled set) and without it (where every link reads -1)."""
  _, _, _, out0, out1, _ = toy
  link_checks.assert_round_unchanged((out0, out1), toy_labeled)


def test_two_rounds_report_the_link_table(toy_labeled):
  for out in toy_labeled:
    m = out.metrics['finalizer']
    link_checks.assert_links_in_range(m)  # FedGen distils on no target.
    # The server distils nothing into the classifier.
    assert m['labeled_accuracy_after'] == m['labeled_accuracy_before']


@pytest.mark.parametrize('round_num', [0, 1])
def test_link_table_matches_numpy(toy, toy_labeled, round_num):
  """The links, from the same client models on the same labeled images.

  Teachers: broadcast classifier + each client's delta (round 0: plain
  SGD, round 1: the regularised step); FedGen's ensemble weights each
  teacher's logits by its share of the image's true label (the clients'
  label counts); before (and after: the server distils nothing): the
  averaged classifier the round returns; no target.
  """
  data, _, state0, out0, out1, keys = toy
  start = (state0, out0.state)[round_num].global_model_weights
  clf, gen = start
  if round_num == 0:
    deltas = toy_kd.client_deltas(data, clf, keys[0])
  else:
    deltas = [_eager_regularised_step(data, clf, gen, k)[0]
              for k in keys[1]]
  teachers = np.stack([
      link_checks.np_toy_logits(
          [w + d for w, d in zip(clf.trainable, delta)], VAL_X)
      for delta in deltas])  # [K, V, C]
  averaged = (out0, out1)[round_num].state.global_model_weights[0]
  want = link_checks.expected_links(
      teachers, VAL_Y,
      link_checks.np_class_share_ensemble(teachers, toy_kd.COUNTS, VAL_Y),
      link_checks.np_toy_logits(averaged.trainable, VAL_X))
  link_checks.assert_links_match(toy_labeled[round_num].metrics['finalizer'],
                                 want)
  assert 0 < want['teacher_labeled_accuracy'] < 1
  # The label weighting matters here: FedGen's ensemble is not the average.
  assert (want['ensemble_labeled_accuracy'] !=
          want['ensemble_labeled_accuracy_logits'])


def test_labeled_images_of_another_shape_are_refused(tmp_path):
  link_checks.assert_labeled_images_of_another_shape_are_refused(
      _build, tmp_path)


def test_generated_labels_are_drawn_over_every_class():
  """A client draws its generated features' labels over every class, the
  ones it lacks included (the reference's federation-wide
  `available_labels`), per client and for a fused stack alike."""
  one = fedgen_tff.generated_label_probs(tf.constant([5, 0, 0], tf.int32))
  np.testing.assert_array_equal(one, [1.0, 1.0, 1.0])
  stack = fedgen_tff.generated_label_probs(
      tf.constant([[0.0, 3.0, 0.0], [2.0, 0.0, 1.0]]))
  np.testing.assert_array_equal(stack, np.ones([2, 3], np.float32))


def test_the_regulariser_teaches_a_client_the_labels_it_lacks(tmp_path):
  """Client 0 holds labels 0 and 1, never 2. Trained with the generated-
  feature term (40 steps, alpha = 5, no latent term), its head classifies
  the generator's features of label 2 as 2 (0.92 of them); its twin
  without the term (alpha at the 1e-4 floor) never does: the labels it
  lacks reach a client only through the generator, drawn over every class
  as the reference draws them."""
  data = toy_kd.make_data(str(tmp_path))
  local = toy_kd.LOCAL._replace(unit='steps', amount=40)
  gen = _generator_fn()
  eps = tf.random.stateless_normal([64, 4], seed=[5, 6])
  missing = tf.fill([64], 2)
  features = gen([eps, missing], training=False)

  def share_predicted_missing(alpha):
    work = _regularized_work(data, local, local_alpha=alpha,
                             local_beta=0.0, local_gen_batch_size=8,
                             reference_steps=0)
    clf = toy_kd.classifier_fn()
    start = toy_kd.values_of(clf.model)
    weights = (start, toy_kd.values_of(gen))
    out = work.next(work.initialize(), [weights],
                    data.keys([0], seed=0, round_num=0))
    delta = out.result[0].update['delta']
    toy_kd.assign(clf.model, ModelWeights(
        [w + d for w, d in zip(start.trainable, delta.trainable)],
        list(delta.non_trainable)))
    predicted = tf.argmax(clf.head(features), axis=-1).numpy()
    return float(np.mean(predicted == 2))

  assert set(toy_kd.Y[toy_kd.PARTS[0]]) == {0, 1}
  assert share_predicted_missing(5.0) > 0.8
  assert share_predicted_missing(0.0) < 0.1
