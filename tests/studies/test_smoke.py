"""Every study script runs its real code path on the tiniest setting.

Each script runs as `python -m studies.<study>.<script>` (its flags, its
context, its output files), on scikit-learn's bundled 8x8 digits through
the script's `--overrides` (no download, no tfds build), for 1-2 rounds of
a few clients, and its output must hold the fields its README's table is
made from. The speed study's other scripts are in test_smoke_speed.py
(`sidebyside.py` runs our side only: the FedGen PyTorch reference is not
installed here), the DaFKD and FedD3A studies' in test_smoke_research.py.
"""

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

from tff_kd.methods import registry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
# Digits, few clients, short local work: each run is a few seconds.
DIGITS = ('dataset.name=digits,partition.min_size=2,partition.kind=dirichlet,'
          'partition.num_clients=4,clients_per_round=2,local.unit=steps,'
          'local.amount=2,local.batch_size=16')


def _run(module: str, *args: str, timeout: int = 120) -> str:
  """Runs `python -m studies.<module> args`; its stdout."""
  proc = subprocess.run(
      [sys.executable, '-m', f'studies.{module}', *args], cwd=ROOT,
      capture_output=True, text=True, timeout=timeout,
      env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'})
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


def _json(path) -> dict:
  with open(path) as f:
    return json.load(f)


def test_feddf_vs_fedavg(tmp_path):
  out = tmp_path / 'feddf'
  _run('feddf_vs_fedavg.feddf_vs_fedavg', '--rounds=1', '--methods=feddf',
       '--proxy_size=100', '--distill_steps=2',
       f'--overrides={DIGITS},server_data.val_size=50', f'--out={out}')
  result = _json(f'{out}.json')
  assert 'command' in result and 'machine' in result
  assert (tmp_path / 'feddf.md').read_text().startswith('# FedDF vs FedAvg')


def test_fedgen_workload(tmp_path):
  pure_tf_rounds = 1
  out = tmp_path / 'workload.json'
  # Round 1 traces and the last one checkpoints: 3 rounds leave one steady.
  _run('speed.fedgen_workload', '--rounds=3',
       f'--pure_tf_rounds={pure_tf_rounds}',
       f'--overrides={DIGITS},partition.kind=fedgen,partition.per_class=20',
       f'--out={out}')
  run = _json(out)['runs'][0]
  assert run['rounds'] == 3 and len(run['round_times']) == 3
  assert all(r['wall_s'] > 0 for r in run['round_times'])
  assert run['prepare_s'] > 0 and run['run_outside_rounds_s'] > 0
  assert run['pure_tf_local_work_s']['median'] > 0
  assert run['tff_overhead_ratio'] > 0


def test_compare_methods_and_dafkd_links(tmp_path):
  """A one-run comparison, then the link table of its run record."""
  out = tmp_path / 'compare'
  _run('compare_methods.compare_methods', '--config=configs/digits.py',
       '--variants=fedavg', '--seeds=0', '--rounds=1',
       f'--overrides={DIGITS}', f'--out={out}')
  summary = _json(out / 'summary.json')
  assert 'fedavg' in json.dumps(summary)
  assert (out / 'runs' / 'fedavg_s0.json').exists()
  assert (out / 'summary.md').read_text().startswith(
      '# Method comparison on digits')
  links = tmp_path / 'links.md'
  _run('dafkd_pool.dafkd_links', f'--runs={out / "runs"}', '--last=1',
       f'--out={links}')
  assert '| fedavg | 0 |' in links.read_text()


def test_stack_memory(tmp_path):
  out = tmp_path / 'stack'
  _run('speed.stack_memory', '--params=1000', '--clients=2',
       '--variants=slots', f'--out={out}')
  result = _json(f'{out}.json')
  assert result['runs'] and 'command' in result
  assert (tmp_path / 'stack.md').exists()


def test_scale(tmp_path):
  out = tmp_path / 'scale'
  _run('scale.scale', '--methods=fedavg', '--num_clients=4',
       '--clients_per_round=2', '--examples_per_round=64', '--rounds=2',
       f'--overrides={DIGITS}', f'--out={out}', timeout=180)
  result = _json(out / 'scale.json')
  assert result['records'] and 'command' in result['meta']
  assert (out / 'scale.md').read_text().startswith('# Cost at scale')


def test_scale_knows_which_methods_group_and_fuse():
  """The scale driver does not import the library, so it keeps its own
  lists of the methods that group and fuse clients: they must be the
  registry's."""
  path = pathlib.Path(ROOT, 'studies', 'scale', 'scale.py')
  tree = ast.parse(path.read_text(), str(path))
  lists = {node.targets[0].id: node.value for node in tree.body
           if isinstance(node, ast.Assign) and len(node.targets) == 1 and
           isinstance(node.targets[0], ast.Name)}
  fuses = set(ast.literal_eval(lists['_FUSES']))
  assert fuses == {m.name for m in registry.METHODS.values()
                   if m.fuses_clients}
  groups = {m.name for m in registry.METHODS.values() if m.groups_clients}
  assert ast.unparse(lists['_GROUPS']) == '_FUSES' and groups == fuses


def test_table1_and_its_decomposition(tmp_path):
  """Two methods at one alpha, one round: the table with the paper's
  column and the link table, the curves, then the side-by-side report."""
  out = tmp_path / 'table1'
  _run('table1.table1', '--config=configs/digits.py', '--alphas=0.5',
       '--methods=fedavg,feddf', '--seeds=0', '--rounds=1',
       f'--overrides={DIGITS},server_data.proxy=split,'
       'server_data.proxy_size=60,server_data.val_size=40,distill.steps=2',
       f'--out={out}', f'--root_dir={tmp_path / "runs"}', '--manual_dir=',
       timeout=300)
  table = (out / 'table1.md').read_text()
  assert '| FedAvg | ' in table and '| FedDF | ' in table
  assert '| 0.5 | FedDF | ' in table  # Its link table.
  assert (out / 'table1.png').stat().st_size > 0
  _run('table1.table1', f'--out={out}',
       f'--decompose=recipe={out / "alpha0.5"}')
  assert '| recipe (feddf) | ' in (out / 'decompose.md').read_text()


def test_import_cost(tmp_path):
  """One fresh process: every part of the split, the library's own row."""
  _run('speed.import_cost', '--repeats=1', f'--out={tmp_path / "imports"}')
  text = (tmp_path / 'imports.md').read_text()
  assert '| tensorflow | ' in text
  assert "| the library's own modules (tff_kd, binaries, configs) | " in text


def test_build_cost(tmp_path):
  """A fresh process builds DaFKD (the build that converted the most) on
  digits: its time, and no AutoGraph conversion in it, which counts because
  the hook on TensorFlow's conversion entry point sees a probe's."""
  _run('speed.build_cost', '--methods=dafkd', '--repeats=1', '--top=3',
       f'--out={tmp_path / "build"}')
  (row,) = _json(tmp_path / 'build.json')['rows']
  assert row['method'] == 'dafkd' and row['prepare_s'] > 0.0
  assert row['hook_sees_conversions']
  assert row['conversions'] == 0 and row['autograph_s'] == 0.0, row
  assert '| dafkd | ' in (tmp_path / 'build.md').read_text()
