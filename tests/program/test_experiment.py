"""The training program: config validation, resume, checkpoints, export.

Runs in-process on scikit-learn's bundled digits with a few tiny rounds.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests import helpers
from tests.helpers import digits_config as _config
from tests.methods import link_checks
from tff_kd import errors
from tff_kd.program import experiment
from tff_kd.program import state_files


@pytest.mark.parametrize('key,value,match', [
    ('method', 'fedfoo', "method 'fedfoo' is unknown"),
    ('dataset.name', 'nodata', "dataset 'nodata' is unknown"),
    ('model.name', 'vgg', "model.name 'vgg' is unknown"),
    ('clients_per_round', 7, 'clients_per_round=7 is impossible with 6'),
    ('partition.alpha', 0.0, r'alpha must be > 0, got 0\.0'),
    ('partition.alpha', -1.0, r'alpha must be > 0, got -1\.0'),
    ('partition.kind', 'pathological', "partition.kind 'pathological'"),
    ('local.unit', 'minutes', "unit 'minutes' is unknown"),
    ('rounds', 0, 'rounds must be an integer >= 1, got 0'),
    ('runtime.concurrent_clients', -2,
     r'runtime.concurrent_clients must be an integer >= -1 .*got -2'),
    ('runtime.intra_op_threads', -1,
     r'runtime.intra_op_threads must be an integer >= 0, got -1'),
    ('runtime.clients_per_call', 0,
     r'runtime.clients_per_call must be an integer >= 1, got 0'),
])
def test_bad_settings_fail_before_any_compute(tmp_path, key, value, match):
  with pytest.raises(errors.ConfigError, match=match):
    experiment.from_config(_config(**{key: value}))
  with pytest.raises(errors.ConfigError, match=match):
    experiment.run(_config(**{key: value}), str(tmp_path))
  assert not os.path.exists(tmp_path / 'checkpoints')


def test_unknown_config_key_is_named():
  c = _config()
  with c.unlocked():
    c.partition.nosuch = 3
  with pytest.raises(errors.ConfigError,
                     match="config key 'partition.nosuch' does not exist"):
    experiment.from_config(c)


def test_more_clients_than_samples(tmp_path):
  c = _config(**{'partition.num_clients': 5000, 'clients_per_round': 1})
  with pytest.raises(errors.ConfigError,
                     match='num_clients=5000 is more than the 1437'):
    experiment.run(c, str(tmp_path))


def test_missing_data_file(tmp_path):
  c = _config(**{'dataset.name': 'usps',
                 'dataset.manual_dir': str(tmp_path / 'empty')})
  os.makedirs(tmp_path / 'empty')
  with pytest.raises(errors.DataError, match='usps.h5'):
    experiment.run(c, str(tmp_path / 'run'))


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('run'))
  result = experiment.run(_config(rounds=3), root, progress=False)
  return root, result


def test_run_writes_metrics_checkpoints_and_export(finished_run):
  root, result = finished_run
  assert [h['round'] for h in result.history] == [1, 2, 3]
  for h in result.history:
    assert 0.0 <= h['test/accuracy'] <= 1.0
    assert h['comm/bytes_down'] > 0 and h['comm/bytes_up'] > 0
    assert h['time/train_s'] > 0
  with open(os.path.join(root, 'metrics.csv')) as f:
    assert len(f.read().strip().splitlines()) == 4  # Header + 3 rounds.
  assert os.path.isdir(os.path.join(root, 'checkpoints', 'program_state_3'))
  assert os.listdir(os.path.join(root, 'tb'))
  with open(os.path.join(root, 'final.json')) as f:
    assert json.load(f)['test/accuracy'] == result.final['test/accuracy']


def test_export_is_served_by_plain_tensorflow(finished_run):
  """The SavedModel loads and predicts in a process that never imports TFF."""
  root, result = finished_run
  script = textwrap.dedent(f"""
      import sys
      import numpy as np
      import tensorflow as tf
      from sklearn import datasets, model_selection
      d = datasets.load_digits()
      x = ((d.images / 16.0 - 0.5) / 0.5).astype(np.float32)[..., None]
      _, x_test, _, y_test = model_selection.train_test_split(
          x, d.target, test_size=0.2, random_state=0, stratify=d.target)
      model = tf.saved_model.load({result.export_dir!r})
      out = model.signatures['serving_default'](images=tf.constant(x_test))
      acc = np.mean(np.argmax(out['logits'].numpy(), -1) == y_test)
      np.testing.assert_allclose(out['probabilities'].numpy().sum(-1), 1,
                                 rtol=1e-5)
      assert 'tensorflow_federated' not in sys.modules
      print('ACC', acc)
  """)
  proc = subprocess.run([sys.executable, '-c', script], capture_output=True,
                        text=True, timeout=300,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  assert proc.returncode == 0, proc.stderr[-2000:]
  acc = float(proc.stdout.split('ACC')[1])
  assert acc == pytest.approx(result.final['test/accuracy'], abs=1e-6)


def test_resume_continues_where_it_stopped(finished_run, tmp_path):
  root, result = finished_run
  # The same experiment asked for 3 more rounds resumes after round 3 ...
  more = experiment.run(_config(rounds=5), root, progress=False)
  assert [h['round'] for h in more.history] == [4, 5]
  # ... and ends exactly where an uninterrupted 5-round run ends: the same
  # weights, bit for bit, and the same per-round losses.
  straight = experiment.run(_config(rounds=5), str(tmp_path), progress=False)
  (_, resumed), (_, whole) = map(helpers.saved_leaves, (root, str(tmp_path)))
  assert len(resumed) == len(whole)
  for a, b in zip(resumed, whole):  # Every leaf of the state.
    np.testing.assert_array_equal(a, b)
  assert ([h['train/loss'] for h in more.history] ==
          [h['train/loss'] for h in straight.history[3:]])


def test_incompatible_root_dir_is_refused(finished_run):
  root, _ = finished_run
  with pytest.raises(errors.CheckpointError, match="different 'seed'"):
    experiment.run(_config(rounds=5, seed=7), root, progress=False)


def test_resume_ignores_other_methods_settings_and_new_default_keys(
    finished_run):
  root, _ = finished_run
  # FedAvg reads no dafkd or distill setting: changing one does not block.
  other = _config(rounds=3)
  other.dafkd.pool_size = 7
  other.distill.steps = 3
  experiment.run(other, root, progress=False)
  # A key the saved run predates (deleted here from its config.json) blocks
  # only when it is set away from its default.
  path = os.path.join(root, 'config.json')
  with open(path) as f:
    saved = json.load(f)
  original = json.dumps(saved)
  del saved['partition']['per_class']
  with open(path, 'w') as f:
    json.dump(saved, f)
  experiment.run(_config(rounds=3), root, progress=False)
  with open(path, 'w') as f:
    json.dump(saved, f)
  changed = _config(rounds=3)
  changed.partition.per_class = 5
  with pytest.raises(errors.CheckpointError,
                     match=r"different 'partition.per_class' \(0 there, 5"):
    experiment.run(changed, root, progress=False)
  with open(path, 'w') as f:
    f.write(original)


def _corrupt(root: str, version: int) -> None:
  path = os.path.join(root, 'checkpoints', f'program_state_{version}',
                      state_files.STATE_FILE)
  with open(path, 'wb') as f:
    f.write(b'\x00garbage' * 10)


def test_corrupt_newest_checkpoint_falls_back_to_the_newest_readable(
    finished_run, tmp_path, caplog):
  root = str(tmp_path / 'run')
  experiment.run(_config(rounds=2), root, progress=False)
  _corrupt(root, 2)
  with caplog.at_level('WARNING'):
    result = experiment.run(_config(rounds=3), root, progress=False)
  assert result.resumed_after == 1
  assert [h['round'] for h in result.history] == [2, 3]
  assert 'resuming from round 1' in caplog.text
  # Nothing is lost: the unreadable folder is kept aside.
  assert os.listdir(os.path.join(root, 'checkpoints_unreadable')) == [
      'program_state_2']
  # Resuming from round 1 replays round 2 exactly: the end of the module's
  # straight 3-round run of the same config.
  _, straight = finished_run
  assert result.final['test/accuracy'] == straight.final['test/accuracy']
  assert result.final['test/loss'] == straight.final['test/loss']


def test_run_stopped_before_its_first_checkpoint_resumes(tmp_path):
  # Regression: only round 0's checkpoint exists (a run stopped between
  # checkpoints); resuming used to fail on saving round 0 again.
  root = str(tmp_path / 'run')
  experiment.run(_config(rounds=1), root, progress=False)
  shutil.rmtree(os.path.join(root, 'checkpoints', 'program_state_1'))
  result = experiment.run(_config(rounds=1), root, progress=False)
  assert result.resumed_after == 0
  assert [h['round'] for h in result.history] == [1]


def test_no_readable_checkpoint_is_a_clear_error(tmp_path):
  root = str(tmp_path)
  experiment.run(_config(rounds=2), root, progress=False)
  for version in (0, 1, 2):
    _corrupt(root, version)
  with pytest.raises(errors.CheckpointError,
                     match='unreadable or incompatible.*no readable '
                     'checkpoint among rounds 0, 1, 2'):
    experiment.run(_config(rounds=3), root, progress=False)
  assert not os.path.exists(os.path.join(root, 'checkpoints_unreadable'))




def test_warm_up_leaves_no_compiling_for_the_first_round(tmp_path):
  from tensorflow_federated.python.core.impl.execution_contexts import compiler_pipeline  # pylint: disable=g-import-not-at-top
  exp = experiment.prepare(_config(), str(tmp_path))
  assert experiment.warm_up(exp).result() > 0
  info = compiler_pipeline.CompilerPipeline.compile.cache_info
  misses = info().misses
  state = exp.process.initialize()
  keys = exp.client_data.keys([0, 1, 2], seed=0, round_num=0)
  state = exp.process.next(state, keys).state
  experiment.evaluate(exp, state)
  assert info().misses == misses


def test_evaluations_still_work_after_another_process_is_built(tmp_path):
  """prepare, build_dataset_process, then evaluate (docs/API.md).

  Building a process makes Keras models in a graph, which used to leave the
  evaluators' eagerly made model in Keras's "invalid state".
  """
  exp = experiment.prepare(_config(), str(tmp_path))
  state = exp.process.initialize()
  weights = exp.process.get_model_weights(state)
  experiment.build_dataset_process(exp)
  first = exp.evaluations['test'](weights, state)
  assert set(first) == {'test/loss', 'test/accuracy'}
  assert 0.0 <= first['test/accuracy'] <= 1.0
  experiment.build_dataset_process(exp)  # Again, after the first trace.
  assert exp.evaluations['test'](weights, state) == first
  assert experiment.evaluate(exp, state) == first


def test_labeled_server_set_without_a_pool_feeds_the_link_table(tmp_path):
  # server_data.val_size without a proxy: the data-free methods still get
  # the labeled images for their link table; a pool method is refused.
  c = _config(**{'method': 'fedftg', 'server_data.val_size': 40,
                 'export': False, 'fedftg.iterations': 1,
                 'fedftg.student_steps': 1})
  result = experiment.run(c, str(tmp_path / 'ftg'), progress=False)
  links = {k: v for k, v in result.history[-1].items()
           if k.startswith('distill/') and 'labeled_accuracy' in k}
  assert links and all(0 <= v <= 1 for v in links.values()), links
  link_checks.assert_fills_the_link_table(result.history, 'fedftg')
  c = _config(**{'method': 'feddf', 'server_data.val_size': 40})
  with pytest.raises(errors.ConfigError, match='server_data.proxy'):
    experiment.prepare(c, str(tmp_path / 'df'))
