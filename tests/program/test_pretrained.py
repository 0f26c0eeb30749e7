"""Pretrained initial weights through the program: `model.weights` is the
round-0 global model of a real FedDF run, a mismatched file is refused
before anything is written, and heterogeneous FedDF / FedD3A take Keras
Applications (and their weights) in their client model lists."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import smoke_config
from tff_kd import errors
from tff_kd import models
from tff_kd.methods import registry
from tff_kd.program import checkpoints
from tff_kd.program import experiment
from tff_kd.program import run_folder
from tff_kd.program import sampling


def _weights_file(path: str, input_shape=(8, 8, 1)):
  """A 'pretrained' CNN made on the fly (seed 7, every variable + 0.25) and
  its values in `ModelWeights` order (trainable, then non-trainable)."""
  model = models.build_classifier('cnn', input_shape=input_shape,
                                  num_classes=10, seed=7).model
  for v in model.weights:
    v.assign(v + 0.25)
  model.save_weights(path)
  return [v.numpy() for v in model.trainable_weights +
          model.non_trainable_weights]


def _flat(weights):
  return list(weights.trainable) + list(weights.non_trainable)


def test_weights_file_is_the_round0_model_of_a_run(tmp_path):
  path = str(tmp_path / 'cnn.h5')
  expected = _weights_file(path)
  config = smoke_config('feddf', rounds=1, **{'model.weights': path})
  root = str(tmp_path / 'run')
  experiment.run(config, root, progress=False)
  exp = experiment.prepare(config, root)
  # The process's own initial state (built in a TFF computation's graph)
  # and the program's round 0 (`load_or_initialize` on a fresh folder).
  for state in (exp.process.initialize(), checkpoints.load_or_initialize(
      exp, checkpoints.manager_for(exp.settings,
                                   str(tmp_path / 'fresh')))[0]):
    for a, b in zip(_flat(exp.process.get_model_weights(state)), expected):
      np.testing.assert_array_equal(a, b)
  # The run trained from there; resuming reads its checkpoint, not the file.
  state, done = checkpoints.load_or_initialize(
      exp, checkpoints.manager_for(exp.settings, root))
  assert done == 1
  trained = _flat(exp.process.get_model_weights(state))
  assert not all(np.array_equal(a, b) for a, b in zip(trained, expected))


def _refused_before_anything_is_written(config, root, match: str) -> None:
  """`experiment.run` ends in one `ConfigError` line matching `match` and
  leaves nothing in `root` but the run folder's lock, which every run takes
  first."""
  with pytest.raises(errors.ConfigError) as e:
    experiment.run(config, str(root), progress=False)
  assert '\n' not in str(e.value)
  assert e.match(match)
  assert not root.exists() or set(os.listdir(root)) <= {run_folder.LOCK_FILE}


def test_mismatched_file_is_refused_before_anything_is_written(tmp_path):
  path = str(tmp_path / 'rgb.h5')
  _weights_file(path, input_shape=(8, 8, 3))  # The digits are grey.
  root = tmp_path / 'run'
  config = smoke_config('fedavg', **{'model.weights': path})
  _refused_before_anything_is_written(
      config, root,
      rf'^model.weights: {path} does not fit the model: variable 0 is \S+ '
      r'\(3, 3, 3, 6\) in the file but \S+ \(3, 3, 1, 6\)')


@pytest.mark.parametrize('overrides,match', [
    ({'model.name': 'keras:ResNet18'}, "'keras:ResNet18' is not a Keras "
                                       'Application'),
    ({'model.weights': 'imagenet'}, "model.weights='imagenet' needs a keras:"),
    ({'model.weights': '/no/such/w.h5'}, 'is not a weights file'),
    ({'method': 'feddf', 'feddf.client_models': 'cnn,keras:MobileNetV2',
      'model.weights': 'imagenet', 'model.name': 'keras:MobileNetV2'},
     'feddf.client_models replaces the model'),
    ({'method': 'feddf', 'feddf.client_models': 'cnn,keras:MobileNetV2',
      'feddf.client_weights': 'imagenet'}, 'has 1 entries but'),
    ({'method': 'fedd3a', 'fedd3a.client_models': 'cnn,keras:MobileNetV2',
      'fedd3a.client_weights': 'imagenet,'}, "entry for 'cnn'"),
])
def test_bad_model_settings_fail_before_compute(tmp_path, overrides, match):
  method = overrides.get('method', 'fedavg')
  with pytest.raises(errors.ConfigError, match=match):
    experiment.run(smoke_config(method, **overrides), str(tmp_path),
                   progress=False)
  assert not os.listdir(tmp_path)


def test_heterogeneous_client_lists_take_keras_applications(tmp_path):
  # Validation and the prototypes' settings only: tracing a MobileNetV2
  # round takes minutes on 2 CPU cores (the README's runs do it).
  path = str(tmp_path / 'cnn.h5')
  _weights_file(path)
  for method in ('feddf', 'fedd3a'):
    config = smoke_config(method, **{
        f'{method}.client_models': 'cnn,keras:MobileNetV2',
        f'{method}.client_weights': f'{path},imagenet'})
    experiment.from_config(config)
  assert experiment.from_config(config).prototypes == [('cnn', 'batch')]
  assert experiment.from_config(config).prototype_weights == [('', 'model.weights')]
  config = smoke_config('feddf', **{
      'feddf.client_models': 'cnn,keras:MobileNetV2',
      'feddf.client_weights': f'{path},imagenet'})
  assert experiment.from_config(config).prototypes == [('cnn', 'batch'),
                                           ('keras:MobileNetV2', 'batch')]
  assert experiment.from_config(config).prototype_weights == [
      (path, 'feddf.client_weights entry 0'),
      ('imagenet', 'feddf.client_weights entry 1')]


def _keras_model():
  """A user's functional Keras classifier (seeded; softmax output)."""
  init = tf.keras.initializers.GlorotUniform
  images = tf.keras.Input((8, 8, 1))
  h = tf.keras.layers.Conv2D(8, 3, activation='relu',
                             kernel_initializer=init(1))(images)
  h = tf.keras.layers.GlobalAveragePooling2D(name='pool')(h)
  probs = tf.keras.layers.Dense(10, activation='softmax',
                                kernel_initializer=init(2))(h)
  return tf.keras.Model(images, probs)


def test_a_from_keras_model_trains_through_a_method_builder(tmp_path):
  config = smoke_config('fedavg', rounds=1)
  exp = experiment.prepare(config, str(tmp_path))
  classifier_fn = lambda: models.from_keras(  # noqa: E731
      _keras_model(), feature_layer='pool', num_classes=10)
  inputs = exp.inputs._replace(model_fn=lambda: classifier_fn().model,
                               classifier_fn=classifier_fn)
  process = exp.settings.method.build(inputs, exp.settings)
  state = process.initialize()
  clients = sampling.sample_clients(config.partition.num_clients,
                                    config.clients_per_round,
                                    seed=config.seed, round_num=0)
  output = process.next(state, exp.client_data.keys(
      clients, seed=config.seed, round_num=0))
  assert np.isfinite(output.metrics['client_work']['train']['train_loss_sum'])
  before = process.get_model_weights(state).trainable
  after = process.get_model_weights(output.state).trainable
  assert [a.shape for a in after] == [(3, 3, 1, 8), (8,), (8, 10), (10,)]
  assert not np.array_equal(before[0], after[0])


def test_a_run_folder_is_not_resumed_with_other_weights(tmp_path):
  path = str(tmp_path / 'cnn.h5')
  _weights_file(path)
  checkpoints.check_resumable(
      experiment.from_config(smoke_config('fedavg')), str(tmp_path))
  with pytest.raises(errors.CheckpointError,
                     match="different 'model.weights' \\(''"):
    checkpoints.check_resumable(experiment.from_config(
        smoke_config('fedavg', **{'model.weights': path})), str(tmp_path))


def test_a_pretrain_setting_is_made_once_and_runs_as_a_cached_file(
    tmp_path, capfd):
  """`model.weights='pretrain:...'`: the first run trains and caches the
  file (in a child process), its round 0 is that file, and a second run
  reads the cache and is the same run, metric for metric."""
  data_dir = str(tmp_path / 'data')
  config = smoke_config('fedavg', rounds=1, **{
      'model.weights': 'pretrain:digits?epochs=1&limit=300',
      'dataset.data_dir': data_dir})
  first = experiment.run(config, str(tmp_path / 'a'), progress=False)
  made = os.path.join(data_dir, 'tff_kd_pretrained',
                      'cnn_batch_8x8x1_digits_seed0_e1_n300.weights.h5')
  assert sorted(os.listdir(os.path.dirname(made))) == [
      os.path.basename(made), os.path.basename(made) + '.json']
  assert "pretraining cnn (batch) on digits" in capfd.readouterr().err
  stamp = os.stat(made).st_mtime_ns
  second = experiment.run(config, str(tmp_path / 'b'), progress=False)
  assert 'pretraining' not in capfd.readouterr().err
  assert os.stat(made).st_mtime_ns == stamp
  assert first.final == second.final
  exp = experiment.prepare(config, str(tmp_path / 'c'))
  model = models.build_classifier('cnn', input_shape=(8, 8, 1),
                                  num_classes=10, seed=0).model
  seeded = [v.numpy() for v in model.trainable_weights]
  model.load_weights(made)
  start = exp.process.get_model_weights(exp.process.initialize())
  for a, b, c in zip(start.trainable, model.trainable_weights, seeded):
    np.testing.assert_array_equal(a, b.numpy())
  assert not all(np.array_equal(a, c) for a, c in zip(start.trainable,
                                                      seeded))


def test_a_failed_pretraining_is_one_line_before_compute(tmp_path):
  root = tmp_path / 'run'
  config = smoke_config('fedavg', **{
      'model.weights': 'pretrain:usps?epochs=1',
      'dataset.data_dir': str(tmp_path / 'data'),
      'dataset.manual_dir': str(tmp_path / 'nothing')})
  _refused_before_anything_is_written(
      config, root,
      r"^model.weights='pretrain:usps\?epochs=1': pretraining failed: "
      'DataError: ')
  assert not os.path.exists(tmp_path / 'data' / 'tff_kd_pretrained')
