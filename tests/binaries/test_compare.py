"""The `compare` binary: a real study, its resume, one-line errors.

The study is two methods (FedAvg and FedDF with a tiny pool and 5
distillation steps) x 2 seeds x 2 rounds on the digits setting of
tests/helpers.py, as the real binary. It first runs FedAvg alone, then
both: FedAvg's finished runs are skipped (their records untouched), and
one whose record was removed (a run stopped after its last checkpoint)
resumes from its checkpoint instead of training again. Bad input is
checked through the binary's own parser and `main`, all cases in one
process (`tests.faults.common.main_in_process`), and once through the real
binary.
"""

import csv
import os
import subprocess
import sys
import uuid

from tests.conftest import WORKER_TAG_ENV
from tests.conftest import wait_for_no_tagged_workers
from tests.faults import common
from tests.methods import link_checks

_DIGITS = os.path.join(common.REPO, 'configs', 'digits.py')
# tests/helpers.py's digits setting, with FedDF's smoke pool for both
# methods (the same clients for both), nothing exported.
_SMALL = [f'--config={_DIGITS}', '--config.partition.num_clients=6',
          '--config.clients_per_round=3', '--config.export=false',
          '--config.server_data.proxy=split',
          '--config.server_data.proxy_size=100',
          '--config.server_data.val_size=50', '--config.distill.steps=5',
          '--config.distill.batch_size=32', '--seeds=0,1', '--rounds=2']


def _compare(*args: str, tag: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, '-m', 'binaries.compare', *args], cwd=common.REPO,
      capture_output=True, text=True, timeout=600,
      env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3', WORKER_TAG_ENV: tag})


def _csv(path) -> list[dict[str, str]]:
  with open(path) as f:
    return list(csv.DictReader(f))


def test_a_study_writes_its_tables_and_resumes(tmp_path):
  out = tmp_path / 'study'
  tag = uuid.uuid4().hex
  first = _compare(*_SMALL, '--methods=fedavg', f'--out={out}', tag=tag)
  assert first.returncode == 0, first.stderr[-3000:]
  records = {s: out / 'runs' / f'fedavg_s{s}' / 'record.json' for s in (0, 1)}
  mtimes = {s: os.stat(p).st_mtime_ns for s, p in records.items()}
  # fedavg_s1 stopped after its last checkpoint, before its record.
  os.remove(records[1])

  second = _compare(*_SMALL, '--methods=fedavg,feddf', f'--out={out}',
                    tag=tag)
  assert second.returncode == 0, second.stderr[-3000:]
  lines = second.stdout.splitlines()
  assert lines[0] == ('compare: 4 runs (fedavg, feddf x seeds 0, 1) on '
                      f'digits, 2 rounds each; outputs in {out}')
  assert '[1/4] fedavg seed 0: finished earlier, skipped' in lines
  assert any(line.startswith('[2/4] fedavg seed 1: final ') and
             line.endswith('resumed after round 2') for line in lines), lines
  for i, seed in ((3, 0), (4, 1)):
    assert any(line.startswith(f'[{i}/4] feddf seed {seed}: final ')
               for line in lines), lines
  assert os.stat(records[0]).st_mtime_ns == mtimes[0]  # Not run again.
  # The resumed run trained no round again.
  with open(out / 'runs' / 'fedavg_s1' / 'metrics.csv') as f:
    assert [r['round'] for r in csv.DictReader(f)] == ['1', '2']
  assert 'run 4/4 feddf s1' in second.stderr  # The one progress bar.

  for name in ('fedavg_s0', 'fedavg_s1', 'feddf_s0', 'feddf_s1'):
    run = out / 'runs' / name
    for part in ('metrics.csv', 'record.json', 'config.json', 'checkpoints'):
      assert (run / part).exists(), (name, part)
  summary = (out / 'summary.md').read_text()
  assert '| fedavg | fedavg | 0, 1 | ' in summary
  assert '| feddf | feddf | 0, 1 | ' in summary
  assert '## Mechanism diagnostics' in summary
  # FedDF's link row (FedAvg logs none): the teachers' accuracy first.
  assert any(line.startswith('| feddf | 0.') for line in summary.splitlines())
  assert not any(line.startswith('| fedavg | 0.')
                 for line in summary.splitlines())
  link_checks.assert_fills_the_link_table(str(out / 'runs' / 'feddf_s0'),
                                          'feddf')
  rows = _csv(out / 'summary.csv')
  assert [(r['entry'], r['seed']) for r in rows] == [
      ('fedavg', '0'), ('fedavg', '1'), ('fedavg', 'mean'), ('fedavg', 'std'),
      ('feddf', '0'), ('feddf', '1'), ('feddf', 'mean'), ('feddf', 'std')]
  for row in rows:
    assert 0 < float(row['final_accuracy']) <= 1 or row['seed'] == 'std'
    assert float(row['best_accuracy']) >= float(row['final_accuracy']) or (
        row['seed'] == 'std')
    kd = row['entry'] == 'feddf'
    for key in ('distill/labeled_accuracy_before',
                'distill/labeled_accuracy_after', 'raised_share'):
      assert bool(row[key]) == kd, (row['entry'], key)
  assert (out / 'curves.png').stat().st_size > 0
  wait_for_no_tagged_workers(tag)


def test_bad_input_is_one_line_exit_2_and_no_folder(tmp_path):
  out = tmp_path / 'study'
  small = [f'--config={_DIGITS}', f'--out={out}']
  cases = [
      (['--methods=fedfoo'], "--methods: method 'fedfoo' is unknown"),
      (['--variant=justalabel'], "malformed --variant 'justalabel'"),
      (['--variant=x:fedavg:rounds'], "malformed --variant 'x:fedavg:rounds'"),
      (['--variant=x:fedfoo'], "method 'fedfoo' is unknown"),
      (['--variant=x:feddf:distill.nosuch=1'],
       "config key 'distill.nosuch' does not exist"),
      (['--variant=x:fedavg:dafkd.aux_weight=1.0'],
       "'dafkd.aux_weight' is in the dafkd method's section; fedavg does not "
       'read it'),
      (['--variant=x:fedavg:distill.steps=3'],
       'fedavg has no distillation step'),
      (['--variant=x:dafkd:dafkd.generator=nosuch'],
       "x (dafkd), seed 0: dafkd.generator 'nosuch' is unknown"),
      (['--methods=fedavg', '--seeds=0,one'],
       "--seeds must be integers (e.g. --seeds=0,1,2), got 'one'"),
      (['--methods=fedavg', '--seeds=0,0'], 'seed 0 is listed twice'),
      (['--methods=fedavg', '--variant=fedavg:fedprox'],
       "the label 'fedavg' is given twice"),
      (['--methods=fedavg', '--config=configs/nosuch.py'],
       'cannot load the config file'),
      (['--methods=fedavg', '--config.partition.alpha=-0.5'],
       'fedavg, seed 0: partition.alpha must be > 0, got -0.5'),
      ([], 'nothing to run'),
  ]
  results = common.main_in_process([small + argv for argv, _ in cases],
                                    program='compare')
  for (argv, message), result in zip(cases, results):
    common.one_line_error(result['code'], result['stderr'], message,
                          program='compare')
    assert len(result['stderr'].strip().splitlines()) == 1, (argv, result)
  # The real binary: absl's app.run adds nothing to the one line.
  proc = _compare(*small, '--methods=fedavg', '--seeds=x', tag='bad_input')
  common.one_line_error(proc.returncode, proc.stderr, "got 'x'",
                        program='compare')
  assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
  assert not out.exists()
