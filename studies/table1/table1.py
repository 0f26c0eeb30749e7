r"""DaFKD's Table 1 (MNIST block) at CPU size, every method in its own recipe.

Wang et al., "DaFKD: Domain-aware Federated Knowledge Distillation", CVPR
2023, Table 1 compares FedAvg, FedProx, FedDF, FedGen, FedFTG and DaFKD on
MNIST with E = 20 local epochs at Dir(alpha), alpha in {0.05, 0.1, 1}. This
command runs that block in `configs/dafkd_paper_cpu.py` (the regime, shrunk
to 2 cores; each method distils with its own `distill` recipe), over seeds,
and writes beside each other our final test accuracy and the paper's:

* `<out>/table1.md`: the table (mean +- std over seeds, the gap to FedAvg,
  seconds per round), then each KD method's link table (mean over rounds
  and seeds, on the server's 500 labeled images: the teachers, the method's
  ensemble and the uniform averages, the averaged model before the server
  step and the student after it, the rounds in which the step raised the
  labeled accuracy, the target's entropy) and the total run time;
* `<out>/table1.png`: mean test-accuracy curves with +- std bands, one
  panel per alpha;
* `<out>/alpha<a>/`: the study of each alpha, run by the library's
  `compare` run loop (`experiment.plan_study`, `run_study`,
  `write_study_summary`): its `summary.md`, `summary.csv`, `curves.png`,
  and under `runs/<label>_s<seed>/` each run's `record.json`, `metrics.csv`
  and `config.json` (the run folders themselves, with their checkpoints,
  are under `--root_dir`; a stopped study resumes where it stopped).
  Folders of the earlier runner (`studies/compare_methods`: one JSON file
  per run in `runs/`) are read too, its `dafkd` as `dafkd.paper_dcgan`
  and its `dafkd_oracle` as `dafkd`.

A row is a `compare --methods` item: a method (in its default preset) or
`<method>.<preset>` (docs/variants.md).

Usage (about 3 minutes per run of FedAvg, FedProx, FedDF, FedGen and
FedFTG on 2 cores, about 20 per DaFKD run):
  TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -m studies.table1.table1 \
      --alphas=0.05,0.1,1 --seeds=0,1,2
"""

import json
import math
import os
import shutil
import statistics
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from tff_kd.runtime import context  # pylint: disable=g-import-not-at-top
context.install()  # The program opts in to tff_kd's process set-up.
from tff_kd.program import experiment  # pylint: disable=g-import-not-at-top

from absl import app  # pylint: disable=g-bad-import-order
from absl import flags

from studies import common

# Table 1, MNIST, E = 20 (mean +- std over the paper's runs), per alpha.
PAPER = {
    '0.05': dict(fedavg=(69.11, 1.39), fedprox=(80.77, 0.35),
                 feddf=(79.42, 0.57), fedgen=(81.06, 1.09),
                 fedftg=(80.95, 1.06), dafkd=(82.33, 0.44)),
    '0.1': dict(fedavg=(95.16, 0.79), fedprox=(93.21, 0.55),
                feddf=(94.27, 0.12), fedgen=(94.98, 0.47),
                fedftg=(94.43, 0.49), dafkd=(95.56, 0.41)),
    '1': dict(fedavg=(98.11, 0.14), fedprox=(97.08, 0.69),
              feddf=(98.37, 0.40), fedgen=(96.39, 0.90),
              fedftg=(98.47, 0.21), dafkd=(98.96, 0.38)),
}
# Our rows: the comparison's variant -> (label, the paper's column).
ROWS = {
    'fedavg': ('FedAvg', 'fedavg'),
    'fedprox': ('FedProx', 'fedprox'),
    'feddf': ('FedDF', 'feddf'),
    'fedgen': ('FedGen', 'fedgen'),
    'fedftg': ('FedFTG', 'fedftg'),
    'dafkd.paper_dcgan': ("DaFKD, the paper's (paper_dcgan)", 'dafkd'),
    'dafkd': ('DaFKD, the library default (real_pool)', None),
}
# The earlier runner's names of the same runs (`studies/compare_methods`):
# its `dafkd` is the paper's algorithm with the reference code's DCGAN
# generator; its `dafkd_oracle` is what `--method=dafkd` runs in this
# regime, the default preset `real_pool` (the DCGAN it also names is not
# used on the real pool).
_OLD_NAMES = {'dafkd': 'dafkd.paper_dcgan', 'dafkd_oracle': 'dafkd'}
# What a study run's folder keeps in `<out>` (the rest, checkpoints, stays
# in --root_dir).
_KEPT = ('record.json', 'metrics.csv', 'config.json')


def _link_keys(name: str) -> tuple[str, ...]:
  """A link's metric (`tff_kd/core/links.py`'s name), then the name a
  method reports it under where it has its own (`experiment.LINK_ALIASES`:
  DaFKD's eq. 7 ensemble and the uniform average of the probabilities it
  weights, `tff_kd/methods/dafkd/diagnostics.py`)."""
  key = f'distill/{name}'
  alias = experiment.LINK_ALIASES.get(key)
  return (key,) if alias is None else (key, alias)


# The link table's columns. The first key a run logs is read; a column it
# has none of reads '-'.
LINKS = tuple((label, _link_keys(name)) for label, name in (
    ('teachers', 'teacher_labeled_accuracy'),
    ('ensemble (own)', 'ensemble_labeled_accuracy'),
    ('logit avg', 'ensemble_labeled_accuracy_logits'),
    ('prob avg', 'ensemble_labeled_accuracy_probs'),
    ('before', 'labeled_accuracy_before'),
    ('after', 'labeled_accuracy_after'),
    ('target entropy', 'target_entropy')))

_ALPHAS = flags.DEFINE_list('alphas', ['0.05', '0.1', '1'],
                            'Dirichlet alphas (Table 1: 0.05, 0.1, 1).')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds.')
_METHODS = flags.DEFINE_list('methods', list(ROWS), 'Rows to run.')
_CONFIG = flags.DEFINE_string('config', 'configs/dafkd_paper_cpu.py',
                              'The regime.')
_MANUAL_DIR = flags.DEFINE_string('manual_dir', '../shared/data/mnist',
                                  'MNIST files (tfds manual_dir).')
_OUT = flags.DEFINE_string('out', 'studies/table1/results', 'Result folder.')
_ROOT = flags.DEFINE_string('root_dir', '/tmp/table1_runs',
                            'Run folders (checkpoints).')
_ROUNDS = flags.DEFINE_integer('rounds', None, 'Rounds (default: the '
                               'config\'s).')
_OVERRIDES = flags.DEFINE_list('overrides', [], 'key=value config overrides '
                               'for every run (e.g. the smoke test\'s).')
_CLIENTS = flags.DEFINE_enum(
    'clients', 'fast', list(experiment.CLIENTS),
    "compare's --clients: 'fast' (grouped, fused where the method allows: "
    "another draw of the same algorithm) or 'config'. The committed rows "
    "ran with 'config' (one client per call).")
_REPORT_ONLY = flags.DEFINE_bool('report_only', False,
                                 'Only rebuild the report from the runs.')
_DECOMPOSE = flags.DEFINE_list(
    'decompose', [], 'Instead of the table: label=folder pairs of '
    'compare_methods result folders (one recipe each) to report side by '
    'side, with their link tables, in <out>/decompose.md.')


def _mean(values) -> float:
  values = [v for v in values if math.isfinite(v)]
  return statistics.fmean(values) if values else float('nan')


def _std(values) -> float:
  return statistics.stdev(values) if len(values) > 1 else 0.0


def load_runs(folder: str) -> dict[str, list[dict]]:
  """variant -> run records (sorted by seed) in `folder/runs`: `compare`
  run folders (`common.study_record`), or the earlier runner's JSON files (its
  names as `_OLD_NAMES` maps them)."""
  runs: dict[str, list[dict]] = {}
  path = os.path.join(folder, 'runs')
  for name in sorted(os.listdir(path)) if os.path.isdir(path) else []:
    entry = os.path.join(path, name)
    if os.path.isdir(entry):
      record = common.study_record(entry)
    else:
      with open(entry) as f:
        record = json.load(f)
      record['variant'] = _OLD_NAMES.get(record['variant'],
                                         record['variant'])
    runs.setdefault(record['variant'], []).append(record)
  for records in runs.values():
    records.sort(key=lambda r: r['seed'])
  return runs


def cell(records: list[dict]) -> dict:
  """Final accuracy (%) mean, std and per seed, s/round, or the error."""
  errors = [r['error'] for r in records if 'error' in r]
  if errors:
    return dict(error=errors[0])
  finals = [100 * r['final_accuracy'] for r in records]
  return dict(mean=_mean(finals), std=_std(finals), finals=finals,
              seconds=_mean(r['seconds_per_round'] for r in records),
              wall=sum(r.get('wall_seconds', 0.0) for r in records))


def links(records: list[dict]) -> dict:
  """The link table of a method's runs: means over rounds and seeds, and
  the share of rounds whose server step raised the labeled accuracy."""
  metrics = [r['metrics'] for r in records if 'metrics' in r]
  before, after = LINKS[4][1][0], LINKS[5][1][0]
  if not metrics or before not in metrics[0]:
    return {}

  def column(keys: tuple[str, ...]) -> float:
    key = next((k for k in keys if k in metrics[0]), None)
    return (float('nan') if key is None else
            _mean(v for m in metrics for v in m[key]))

  out = {name: column(keys) for name, keys in LINKS}
  pairs = [(b, a) for m in metrics for b, a in zip(m[before], m[after])]
  out['raised'] = sum(a > b for b, a in pairs) / len(pairs)
  out['lowered'] = sum(a < b for b, a in pairs) / len(pairs)
  return out


def _link(value: float) -> str:
  """A link's cell: '-' where the method has none (a missing metric, or
  the -1 that a method without a target on a pool logs as its entropy)."""
  return f'{value:.3f}' if math.isfinite(value) and value >= 0 else '-'


def report(results: dict[str, dict[str, list[dict]]], seeds: list[str]
           ) -> str:
  """The Markdown report of {alpha: {variant: records}}."""
  alphas = list(results)
  lines = [
      '# DaFKD Table 1 (MNIST, E = 20) at CPU size', '',
      f'`{_CONFIG.value}`, seeds {",".join(seeds)}; final test accuracy '
      '(%), mean ± std over seeds (Δ: against FedAvg in the same runs); '
      'the paper\'s in the next column. Each method distils with its own '
      'recipe (`Method.distill_defaults`). This report: `python -m '
      'studies.table1.table1 ' + ' '.join(sys.argv[1:]) + '` (the runs\' '
      'commands: `alpha<a>/meta.json` or `alpha<a>/summary.md`).', '',
      '| method | ' + ' | '.join(f'Dir({a}) ours | Δ | paper'
                                 for a in alphas) + ' | s/round |',
      '|---' * (1 + 3 * len(alphas) + 1) + '|']
  total = 0.0
  for variant, (label, paper_key) in ROWS.items():
    row, seconds = [label], []
    for a in alphas:
      records = results[a].get(variant)
      c = cell(records) if records else None
      base = cell(results[a]['fedavg']) if 'fedavg' in results[a] else None
      if c is None:
        row += ['', '']
      elif 'error' in c:
        row += [f'failed: {c["error"][:60]}', '']
      else:
        total += c['wall']
        seconds.append(c['seconds'])
        row.append(f'{c["mean"]:.2f} ± {c["std"]:.2f}')
        row.append('' if not base or 'mean' not in base else
                   f'{c["mean"] - base["mean"]:+.2f}')
      paper = PAPER.get(a, {}).get(paper_key) if paper_key else None
      row.append(f'{paper[0]:.2f} ± {paper[1]:.2f}' if paper else '')
    row.append(f'{_mean(seconds):.1f}' if seconds else '')
    lines.append('| ' + ' | '.join(row) + ' |')
  lines += ['', f'Run time of all runs: {total / 3600:.2f} h (2 cores).', '',
            '## Link tables (server\'s labeled images; mean over rounds and '
            'seeds)', '',
            'raised / lowered: the share of rounds whose server step raised '
            '/ lowered the labeled accuracy (after vs before).', '',
            '| Dir | method | ' + ' | '.join(n for n, _ in LINKS) +
            ' | raised | lowered |', '|---' * (len(LINKS) + 4) + '|']
  for a in alphas:
    for variant, (label, _) in ROWS.items():
      table = links(results[a].get(variant, []))
      if table:
        lines.append(f'| {a} | {label} | ' + ' | '.join(
            _link(table[n]) for n, _ in LINKS) +
                     f' | {table["raised"]:.2f} | {table["lowered"]:.2f} |')
  return '\n'.join(lines) + '\n'


def plot(results: dict[str, dict[str, list[dict]]], path: str) -> None:
  """Mean test-accuracy curves with +- std bands, one panel per alpha."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4),
                           squeeze=False)
  for ax, (a, runs) in zip(axes[0], results.items()):
    for variant, (label, _) in ROWS.items():
      curves = [r['accuracy'] for r in runs.get(variant, [])
                if 'accuracy' in r]
      if not curves:
        continue
      n = min(map(len, curves))
      mean = [_mean(c[i] for c in curves) for i in range(n)]
      std = [_std([c[i] for c in curves]) for i in range(n)]
      x = range(1, n + 1)
      ax.plot(x, mean, label=label)
      ax.fill_between(x, [m - s for m, s in zip(mean, std)],
                      [m + s for m, s in zip(mean, std)], alpha=0.15)
    ax.set_title(f'MNIST, Dir({a})')
    ax.set_xlabel('round')
    ax.set_ylabel('test accuracy')
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def decompose(pairs: list[str]) -> str:
  """The Markdown rows of each labeled folder: accuracy and links."""
  lines = ['| recipe | final test acc (%) | per seed | ' +
           ' | '.join(n for n, _ in LINKS) + ' | raised | lowered |',
           '|---' * (len(LINKS) + 5) + '|']
  for pair in pairs:
    label, folder = pair.rsplit('=', 1)
    runs = load_runs(folder)
    if not runs:
      raise app.UsageError(f'no runs in {folder}/runs')
    for variant, records in runs.items():
      name = label if len(runs) == 1 else f'{label} ({variant})'
      c, table = cell(records), links(records)
      if 'error' in c:
        lines.append(f'| {name} | failed: {c["error"][:80]} |' +
                     ' |' * (len(LINKS) + 3))
        continue
      seeds = ' / '.join(f'{f:.2f}' for f in c['finals'])
      row = [name, f'{c["mean"]:.2f} ± {c["std"]:.2f}', seeds]
      row += ([_link(table[n]) for n, _ in LINKS] +
              [f'{table["raised"]:.2f}', f'{table["lowered"]:.2f}']
              if table else [''] * (len(LINKS) + 2))
      lines.append('| ' + ' | '.join(row) + ' |')
  return '\n'.join(lines) + '\n'


def run_alpha(alpha: str, folder: str) -> None:
  """Runs (or resumes) the rows at Dir(alpha) with the library's `compare`
  run loop in `--root_dir`, writes its summary in `folder` and copies each
  finished run's record, metrics and config to `folder/runs/`."""
  config = common.config_module(_CONFIG.value).get_config()
  config.dataset.manual_dir = _MANUAL_DIR.value
  config.partition.alpha = float(alpha)
  if _ROUNDS.value:
    config.checkpoint_every = _ROUNDS.value
  common.apply_overrides(config, _OVERRIDES.value)
  plan = experiment.plan_study(
      config, experiment.study_entries(_METHODS.value),
      experiment.parse_seeds(_SEEDS.value), rounds=_ROUNDS.value,
      clients=_CLIENTS.value)
  root = os.path.join(_ROOT.value, f'alpha{alpha}')
  experiment.run_study(plan, root)
  for run in plan:
    source = os.path.join(root, 'runs', run.name)
    target = os.path.join(folder, 'runs', run.name)
    os.makedirs(target, exist_ok=True)
    for name in _KEPT:
      if os.path.exists(os.path.join(source, name)):
        shutil.copy(os.path.join(source, name), target)
  experiment.write_study_summary(
      plan, folder, command=' '.join(['python -m studies.table1.table1',
                                      *sys.argv[1:]]),
      title=f'Table 1 at CPU size, Dir({alpha})')


def main(argv):
  del argv
  if _DECOMPOSE.value:
    os.makedirs(_OUT.value, exist_ok=True)
    text = decompose(_DECOMPOSE.value)
    with open(os.path.join(_OUT.value, 'decompose.md'), 'w') as f:
      f.write(text)
    print(text)
    return
  unknown = [m for m in _METHODS.value if m not in ROWS]
  if unknown:
    raise app.UsageError(f'unknown methods {unknown}; choose from '
                         f'{", ".join(ROWS)}')
  t0 = time.perf_counter()
  results = {}
  for a in _ALPHAS.value:
    folder = os.path.join(_OUT.value, f'alpha{a}')
    if not _REPORT_ONLY.value:
      run_alpha(a, folder)
    results[a] = load_runs(folder)
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, 'table1.md'), 'w') as f:
    f.write(report(results, _SEEDS.value))
  plot(results, os.path.join(_OUT.value, 'table1.png'))
  print(open(os.path.join(_OUT.value, 'table1.md')).read())
  print(f'{time.perf_counter() - t0:.0f} s')


if __name__ == '__main__':
  app.run(main)
