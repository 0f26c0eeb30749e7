"""The FedGen-workload benchmark runs with or without its pure-TF baseline.

`--pure_tf_rounds=0` is how `benchmarks/sidebyside.py` runs it (the process
then does only what `train` does); it used to crash on its empty summary.
Real MNIST from the shared raw files, real TFF runtime, 2-3 rounds.
"""

import json
import os
import subprocess
import sys
import uuid

import pytest

from tests.conftest import SHARED_DATA
from tests.conftest import wait_for_no_tagged_workers
from tests.conftest import WORKER_TAG_ENV

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize('pure_tf_rounds,rounds', [(0, 2), (1, 3)])
def test_fedgen_workload_runs_with_any_pure_tf_rounds(
    pure_tf_rounds, rounds, mnist_data_dir, tmp_path):
  tag = uuid.uuid4().hex  # Marks the benchmark's workers (conftest.py).
  out = tmp_path / 'workload.json'
  proc = subprocess.run(
      [sys.executable, '-m', 'benchmarks.fedgen_workload',
       f'--manual_dir={SHARED_DATA}/mnist', f'--data_dir={mnist_data_dir}',
       f'--rounds={rounds}', f'--pure_tf_rounds={pure_tf_rounds}',
       f'--out={out}'],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3', WORKER_TAG_ENV: tag})
  assert proc.returncode == 0, proc.stderr[-3000:]
  run = json.loads(out.read_text())['runs'][0]
  assert run['rounds'] == rounds and len(run['round_times']) == rounds
  assert all(r['wall_s'] > 0 for r in run['round_times'])
  assert run['run_before_first_round_s'] > 0
  if pure_tf_rounds:
    assert run['pure_tf_local_work_s']['median'] > 0
    assert run['tff_overhead_ratio'] > 0
  else:  # No baseline: nothing of it is prepared, traced or reported.
    assert run['prepare_s'] is None
    assert run['pure_tf_local_work_s'] is None
    assert run['tff_overhead_ratio'] is None
  wait_for_no_tagged_workers(tag)  # Its worker is gone.


def test_fedd3a_protocol_refuses_a_record_of_other_settings(tmp_path):
  """A later invocation adds to its `--out` record only with the same
  settings; otherwise one line, before any data is read or run starts."""
  out = tmp_path / 'protocol'
  out.with_suffix('.json').write_text(json.dumps(
      {'setting': {'rounds': 7}, 'runs': {}, 'commands': []}))
  proc = subprocess.run(
      [sys.executable, '-m', 'benchmarks.fedd3a_protocol', f'--out={out}',
       f'--manual_dir={SHARED_DATA}', f'--data_dir={tmp_path / "tfds"}'],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'})
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines() == [
      f'fedd3a_protocol: error: {out}.json holds runs with other settings; '
      'choose another --out']
  assert not (tmp_path / 'tfds').exists()


def test_compare_methods_titles_the_dataset_it_compares(tmp_path):
  """A Fashion-MNIST config's report says so. The one run is recorded
  already, so the benchmark only rebuilds its summary: no training."""
  out = tmp_path / 'compare'
  (out / 'runs').mkdir(parents=True)
  (out / 'runs' / 'fedavg_s0.json').write_text(json.dumps(dict(
      variant='fedavg', method='fedavg', seed=0, accuracy=[0.5, 0.6],
      train_loss=[1.0, 0.8], final_accuracy=0.6, seconds_per_round=1.0,
      metrics={})))
  tag = uuid.uuid4().hex
  proc = subprocess.run(
      [sys.executable, '-m', 'benchmarks.compare_methods',
       '--config=configs/dafkd_fashion_mnist.py', '--variants=fedavg',
       '--seeds=0', f'--root_dir={tmp_path / "root"}', f'--out={out}'],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3', WORKER_TAG_ENV: tag})
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = (out / 'summary.md').read_text().splitlines()
  assert report[0] == ('# Method comparison on fashion_mnist '
                       '(benchmarks/compare_methods.py)')
  assert report[4].startswith('fashion_mnist (first ')
  wait_for_no_tagged_workers(tag)
