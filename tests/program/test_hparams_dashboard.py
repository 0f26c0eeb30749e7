"""Every run's settings and metrics on TensorBoard's HParams dashboard.

A real run (digits, `helpers.digits_config`) of 2 rounds, continued to 3,
read back as TensorBoard's HParams plugin reads a study folder: the run is
one session whose settings hold the method, the seed, nested keys such as
`partition.alpha` and the values in force after the resume (`rounds` 3),
with `test/accuracy` a metric at its final round; its events hold exactly
one session start. `tff_kd.program.releases` on its own, cheaply: a
restart with the same settings writes none, `drop_after` keeps it, and
two runs of a study share one dashboard with both methods.
"""

import asyncio
import glob
import os

import pytest
import tensorflow as tf
from tensorboard import context as tb_context
from tensorboard.backend.event_processing import data_provider
from tensorboard.backend.event_processing import plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import backend_context
from tensorboard.plugins.hparams import get_experiment
from tensorboard.plugins.hparams import list_session_groups
from tensorboard.plugins.hparams import metadata

from tests import helpers
from tff_kd.program import experiment
from tff_kd.program import releases


def events(run_dir: str) -> list[tf.compat.v1.Event]:
  """Every event of a run's TensorBoard folder."""
  return [event for path in sorted(glob.glob(os.path.join(
      run_dir, releases.TENSORBOARD_DIR, 'events.out.tfevents.*')))
          for event in tf.compat.v1.train.summary_iterator(path)]


def session_starts(run_dir: str) -> list[dict]:
  """The settings of every HParams session start in a run's events."""
  found = []
  for event in events(run_dir):
    for value in event.summary.value:
      if value.tag == metadata.SESSION_START_INFO_TAG:
        assert event.step == 0
        info = metadata.parse_session_start_info_plugin_data(
            value.metadata.plugin_data.content)
        found.append({k: getattr(v, v.WhichOneof('kind'))
                      for k, v in info.hparams.items()})
  return found


def dashboard(logdir: str) -> tuple[api_pb2.Experiment,
                                    list[api_pb2.SessionGroup]]:
  """What TensorBoard's HParams tab shows for `logdir`: its experiment (the
  settings and metric columns) and its session groups."""
  multiplexer = plugin_event_multiplexer.EventMultiplexer()
  multiplexer.AddRunsFromDirectory(logdir)
  multiplexer.Reload()
  backend = backend_context.Context(base_plugin.TBContext(
      logdir=logdir, multiplexer=multiplexer,
      data_provider=data_provider.MultiplexerDataProvider(multiplexer,
                                                          logdir)))
  request = tb_context.RequestContext()
  found = get_experiment.Handler(request, backend, '').run()
  groups = list_session_groups.Handler(
      request, backend, '', api_pb2.ListSessionGroupsRequest(
          start_index=0, slice_size=100,
          allowed_statuses=[api_pb2.STATUS_UNKNOWN])).run()
  return found, list(groups.session_groups)


def metric_names(found: api_pb2.Experiment) -> set[str]:
  return {m.name.tag for m in found.metric_infos}


@pytest.mark.slow
def test_a_resumed_run_is_one_session_with_its_settings(tmp_path):
  root = str(tmp_path / 'study' / 'fedavg_seed0')
  experiment.run(helpers.digits_config(rounds=2, export=False), root,
                 progress=False)
  (first,) = session_starts(root)
  assert first['rounds'] == 2
  experiment.run(helpers.digits_config(rounds=3, export=False), root,
                 progress=False)
  (settings,) = session_starts(root)  # Replaced: `rounds` changed.
  assert settings['method'] == 'fedavg'
  assert settings['seed'] == 0
  assert settings['rounds'] == 3
  assert settings['partition.alpha'] == 0.5
  assert settings['partition.num_clients'] == 6
  assert settings['runtime.fuse_clients'] == 'None'
  # The run's own sections only: no other method's defaults.
  assert not [k for k in settings if k.startswith(('dafkd.', 'feddf.'))]

  found, groups = dashboard(str(tmp_path / 'study'))
  assert {'test/accuracy', 'train/loss'} <= metric_names(found)
  assert {'method', 'seed', 'partition.alpha'} <= {
      h.name for h in found.hparam_infos}
  (group,) = groups
  (session,) = group.sessions
  assert session.name == os.path.join('fedavg_seed0',
                                      releases.TENSORBOARD_DIR)
  assert group.hparams['rounds'].number_value == 3
  (accuracy,) = [m for m in session.metric_values
                 if m.name.tag == 'test/accuracy']
  assert accuracy.training_step == 3


def release(root: str, hparams: dict, rounds: range) -> None:
  manager = releases.release_manager(root, hparams)
  for r in rounds:
    asyncio.run(manager.release(
        {'train/loss': 1.0 / r, 'test/accuracy': 0.1 * r}, key=r))


def test_a_restart_keeps_the_one_session_start(tmp_path):
  root = str(tmp_path / 'run')
  hparams = {'method': 'fedavg', 'seed': 0, 'partition.alpha': 0.5}
  release(root, hparams, range(1, 3))
  releases.drop_after(root, 0)  # Every round dropped; not the settings.
  assert session_starts(root) == [hparams]
  assert not any(e.summary.value for e in events(root) if e.step > 0)
  release(root, hparams, range(1, 2))
  assert session_starts(root) == [hparams]
  assert len(glob.glob(os.path.join(root, 'tb', '*'))) == 2

def test_a_study_shares_one_dashboard(tmp_path):
  for i, method in enumerate(('fedavg', 'feddf')):
    release(str(tmp_path / method),
            {'method': method, 'seed': i, 'dafkd.x': None, 'l': [1, 2]},
            range(1, 3))
  found, groups = dashboard(str(tmp_path))
  assert metric_names(found) == {'test/accuracy', 'train/loss'}
  infos = {h.name: h for h in found.hparam_infos}
  assert sorted(v.string_value for v in
                infos['method'].domain_discrete.values) == ['fedavg', 'feddf']
  assert [v.string_value for v in infos['l'].domain_discrete.values] == [
      '[1, 2]']
  assert sorted(g.hparams['seed'].number_value for g in groups) == [0, 1]
  assert {g.hparams['dafkd.x'].string_value for g in groups} == {'None'}
