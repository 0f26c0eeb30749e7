"""Every remaining `studies/speed/` script runs its real code path, tiny.

As `test_smoke.py` (whose digits overrides and runner these reuse): each
script runs as `python -m studies.speed.<script>` on scikit-learn's digits
through `--overrides`, with one setting per axis, one repeat and the fewest
rounds its summary needs (2, or 3 where rounds 2..N-1 are summarised), and
its JSON and Markdown must hold the fields its README table is made from.
`sidebyside.py` runs our side only (`--skip=reference`: the PyTorch
reference is not installed), then re-summarises that record
(`--resummarise`). Temporary folders of the scripts go under `tmp_path`
(`TMPDIR`), and no `worker_binary` may outlive a test.
"""

import json
import os

import pytest

from tests.conftest import wait_for_no_tagged_workers
from tests.conftest import WORKER_TAG_ENV
from tests.studies.test_smoke import DIGITS
from tests.studies.test_smoke import _run

# The FedGen reference workload's partition, as `test_fedgen_workload`.
FEDGEN_DIGITS = f'{DIGITS},partition.kind=fedgen,partition.per_class=20'


@pytest.fixture(autouse=True)
def _no_leftover_workers(tmp_path, monkeypatch):
  """Scripts' temporary folders under tmp_path; no worker_binary of the
  test's own scripts left (they are tagged: the other pytest worker's
  tests run workers of their own at the same time)."""
  monkeypatch.setenv('TMPDIR', str(tmp_path))
  tag = f'smoke-speed-{os.getpid()}-{tmp_path.name}'
  monkeypatch.setenv(WORKER_TAG_ENV, tag)
  yield
  wait_for_no_tagged_workers(tag)


def _json(path) -> dict:
  with open(path) as f:
    return json.load(f)


def test_threads(tmp_path):
  out = tmp_path / 'threads'
  # One setting (TFF's and TF's defaults: the ratios' base); 3 rounds leave
  # one steady round for `process.next`'s median.
  _run('speed.threads', '--rounds=3', '--repeats=1', '--methods=fedavg',
       '--settings=-1:0', f'--overrides={FEDGEN_DIGITS}', f'--out={out}')
  result = _json(f'{out}.json')
  assert 'command' in result and 'machine' in result
  assert [(s['concurrent_clients'], s['intra_op_threads'])
          for s in result['settings']] == [(-1, 0)]
  (run,) = result['runs']
  assert (run['method'], run['concurrent_clients'],
          run['intra_op_threads']) == ('fedavg', -1, 0)
  assert run['next_median'] > 0 and run['train_eval_mean'] > 0
  assert run['first_round_next'] > 0 and 0 <= run['accuracy'] <= 1
  md = (tmp_path / 'threads.md').read_text()
  assert md.startswith('# Worker threads and concurrency')
  assert "| fedavg | -1 | 0 | TFF's and TensorFlow's defaults" in md
  assert '| 1.00 |' in md  # The ratio to the defaults.


def test_server_device(tmp_path):
  out = tmp_path / 'server_device'
  _run('speed.server_device', '--rounds=2', '--repeats=1', '--methods=feddf',
       f'--overrides={DIGITS},server_data.proxy_size=100,'
       'server_data.val_size=50,distill.steps=2', f'--out={out}',
       timeout=180)
  result = _json(f'{out}.json')
  assert 'command' in result and 'machine' in result
  (row,) = result['rows']
  assert (row['method'], row['repeat']) == ('feddf', 0)
  assert [r['setting'] for r in row['runs']] == ['runtime', 'driver']
  for r in row['runs']:
    assert r['median_train_s'] > 0 and r['first_round_s'] > 0
    assert 0 <= r['final_accuracy'] <= 1
  md = (tmp_path / 'server_device.md').read_text()
  assert md.startswith('# Server step in the TFF runtime vs in the driver')
  assert '| feddf | 0 |' in md


def test_remote_workers(tmp_path):
  # Starts the script's 3 loopback workers and runs each of its 3 settings.
  out = tmp_path / 'remote_workers'
  _run('speed.remote_workers', '--rounds=2', '--repeats=1',
       '--methods=fedavg', f'--overrides={FEDGEN_DIGITS}', f'--out={out}',
       timeout=180)
  result = _json(f'{out}.json')
  assert 'command' in result and 'machine' in result
  (row,) = result['rows']
  assert (row['method'], row['repeat']) == ('fedavg', 0)
  assert [r['setting'] for r in row['runs']] == ['local', 'remote1',
                                                 'remote2']
  for r in row['runs']:
    assert r['median_train_s'] > 0 and r['mean_train_s'] > 0
    assert 0 <= r['final_accuracy'] <= 1
  md = (tmp_path / 'remote_workers.md').read_text()
  assert md.startswith('# Seconds per round: local runtime vs loopback')
  assert '| fedavg | 0 |' in md


def test_client_cost(tmp_path):
  out = tmp_path / 'client_cost'
  # Rounds of 4 and 2 IID clients instead of 100 and 10; one pass per part.
  _run('speed.client_cost', '--repeats=1', '--round_sizes=4,2',
       f'--overrides={DIGITS},partition.kind=iid', f'--out={out}')
  result = _json(f'{out}.json')
  meta = result['meta']
  assert 'command' in meta and 'machine' in meta
  assert 'K = 4 clients of 50 steps or K = 2 of 100 steps' in meta['setting']
  assert [(r['part'], r['clients']) for r in result['rows']] == [
      ('call only', 4), ('read files', 4), ('dataset from key, iterated', 4),
      ('train 2 steps, in-memory data', 4), ('full client', 4),
      ('full client', 2)]
  assert all(r['ms_per_client'] > 0 for r in result['rows'])
  assert set(meta['round_ms']) == {'4', '2'} and meta['round_ratio'] > 0
  md = (tmp_path / 'client_cost.md').read_text()
  assert md.startswith("# One client's cost in TensorFlow")
  assert '| full client | 2 |' in md
  assert "A round's clients one after another: K = 4 " in md


def test_sidebyside_ours_then_resummarise(tmp_path):
  out = tmp_path / 'sidebyside'
  runs = tmp_path / 'runs'
  # Our side only; its fedgen_workload.py gets the digits overrides through
  # --ours_flags (a CSV list: the quotes keep the overrides one item).
  _run('speed.sidebyside', '--skip=reference', '--pairs=1', '--rounds=3',
       '--method=fedavg', f'--runs_dir={runs}',
       f'--ours_flags="--overrides={FEDGEN_DIGITS}"', f'--out={out}')
  result = _json(f'{out}.json')
  assert 'command' in result and 'machine' in result
  (run,) = result['runs']
  assert run['side'] == 'ours' and run['rounds'] == 3
  assert '--overrides=dataset.name=digits' in run['command']
  assert run['process']['returncode'] == 0
  assert not run['process']['leftover_children']
  for key in ('per_round_train_eval_mean', 'per_round_train_eval_median',
              'per_round_wall_mean', 'first_round_wall', 'startup_teardown',
              'imports_s', 'process_wall'):
    assert run[key] > 0, key
  assert 0 <= run['final_accuracy'] <= 1
  assert result['ratios'] == {}  # No reference side to divide by.
  md = (tmp_path / 'sidebyside.md').read_text()
  assert md.startswith('# Side by side: FedGen PyTorch reference vs tff_kd')
  assert '| start-up + teardown (process wall minus rounds) |' in md

  # Re-summarise that record: same per-run summaries, nothing run.
  again = tmp_path / 'again'
  _run('speed.sidebyside', f'--resummarise={out}.json', '--note=re-read',
       f'--out={again}')
  redone = _json(f'{again}.json')
  assert redone['extra_note'] == 're-read'
  for key in ('per_round_train_eval_mean', 'startup_teardown'):
    assert redone['runs'][0][key] == pytest.approx(run[key]), key
  assert 're-read' in (tmp_path / 'again.md').read_text()


def test_worker_grappler(tmp_path):
  """Every setting once, two teachers on a 16-image pool: the same logits
  in the plain `tf.function`, in the worker under each compilation and in
  this process's session with each set of options. The settings share two
  processes (`--nofresh`); the measurement's one process per setting is
  the same code, run per setting."""
  out = tmp_path / 'worker_grappler'
  _run('speed.worker_grappler', '--repeats=1', '--teachers=2', '--pool=16',
       '--calls=1', '--nofresh', f'--out={out}', timeout=300)
  result = _json(f'{out}.json')
  assert 'command' in result and 'machine' in result
  runs = {r['mode']: r for r in result['runs']}
  assert set(runs) == {'plain', 'plain_no_grappler', 'plain_one_thread',
                       'worker_static', 'worker_server', 'worker_grappler',
                       'session_worker', 'session_l1', 'session_meta',
                       'session_inter2', 'session_default'}
  sums = [r['logit_sum'] for r in runs.values()]
  assert max(sums) - min(sums) <= 1e-3 * max(1.0, abs(sums[0]))
  assert all(len(r['ms_per_teacher']) == 1 and r['ms_per_teacher'][0] > 0
             for r in runs.values())
  report = (tmp_path / 'worker_grappler.md').read_text()
  assert '| `worker_grappler` |' in report and '`--nofresh`' in report


def test_step_cost(tmp_path):
  """Both steps traced, counted and timed; DaFKD's eq. 9 step runs the
  extractor three times, so it must count more operations than FedAvg's.
  The fused DaFKD step built by the script computes, from the same start,
  the sum of the per-client eq. 9 losses (`gan.client_gan_step`)."""
  out = tmp_path / 'step_cost'
  _run('speed.step_cost', '--batch_size=4', '--repeats=2',
       '--fused_clients=2', f'--out={out}')
  result = _json(f'{out}.json')
  assert 'command' in result and 'machine' in result
  fedavg, dafkd, forward, fused_fedavg, fused_dafkd = result['rows']
  assert fused_fedavg['step'] == 'FedAvg, 2 clients fused (per client)'
  assert fused_dafkd['step'] == 'DaFKD eq. 9, 2 clients fused (per client)'
  assert fused_fedavg['ms'] > 0 and fused_dafkd['ms'] > 0
  assert fused_dafkd['mflop'] > fused_fedavg['mflop'] > 0
  assert result['fused_loss_error'] < 1e-5
  assert fedavg['step'].startswith('FedAvg')
  assert dafkd['step'].startswith('DaFKD')
  assert dafkd['mflop'] > 2 * fedavg['mflop'] > 0
  assert 0 < forward['mflop'] < fedavg['mflop']
  assert fedavg['ms'] > 0 and dafkd['ms'] > 0
  assert '| x FedAvg |' in (tmp_path / 'step_cost.md').read_text()
