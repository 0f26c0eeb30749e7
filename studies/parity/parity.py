r"""Parity with the authors' code: theirs and ours on identical work.

Does a method miss its paper because of this implementation, or does the
method itself not reach the paper's number at this size? The judge is the
authors' own code run on the same work. Two methods have public PyTorch
code that runs on a CPU: DaFKD (haozhaowang/DaFKD2023) and FedGen
(zhuangdizhu/FedGen). For each study (`--study`) this command

1. exports, per seed, the split and client sample a library run of the
   study's config uses (`split.export`: the same loading, hold-out,
   partition and per-round sample), so both codes train on one partition,
   test on one test set and see the same clients each round;
2. runs the authors' code on it, each run a fresh process of
   `--reference_python` (a venv with torch; never the library's), from a
   work folder that holds the reference's files, checked against the
   pinned commit (`PINS`, git blob hashes), with this study's patch applied
   (`dafkd.patch`, `fedgen.patch`; every changed line is listed in the
   README) and the study's runner (`reference_dafkd.py`,
   `reference_fedgen.py`), which hands the reference the exported data,
   sample, seed and, where its own model cannot run on 2 cores, the
   library's small CNN through its own constructors;
3. runs ours on the same config and seeds with the library's `compare` run
   loop (one client per call, `--clients=config`);
4. writes `<out>/<study>/`: `rounds.csv` (per-round test accuracy and
   seconds of every run), `table.md` (final accuracy, per seed, the mean
   of the last 5 rounds, the gap to FedAvg in the same codebase, s/round;
   for DaFKD the link table of both codes), `curves.png` (mean test
   accuracy per method, ours solid and theirs dashed).

Runs resume: a finished run (ours: `compare`'s record; theirs: a JSON with
every round) is not run again; `--report_only` only rewrites the report.
Nothing is downloaded: `--reference_dir` is a checkout of the pinned
commit (e.g. `git clone https://github.com/haozhaowang/DaFKD2023 && git -C
DaFKD2023 checkout 39a536c`).

Usage (a DaFKD pair of runs takes about 35 minutes on 2 cores; FedGen's
a few minutes):
  python -m studies.parity.parity --study=dafkd --seeds=0,1,2 \
      --reference_dir=/path/to/DaFKD2023 --reference_python=/path/to/venv/bin/python \
      --manual_dir=../shared/data/mnist --work_dir=/tmp/parity
"""

import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
from typing import Any, NamedTuple, Optional, Sequence

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from tff_kd.runtime import context  # pylint: disable=g-import-not-at-top
context.install()  # The program opts in to tff_kd's process set-up.
from tff_kd.program import experiment  # pylint: disable=g-import-not-at-top

from absl import app  # pylint: disable=g-bad-import-order
from absl import flags

from studies import common
from studies.parity.pins import check_python
from studies.parity.pins import check_reference
from studies.parity.pins import Pin
from studies.parity.pins import PINS
from studies.parity.pins import StudyError

HERE = os.path.dirname(os.path.abspath(__file__))


class Regime(NamedTuple):
  """The local work a reference runner's `--regime` fixes, which the
  study's config must then have (`check_regime`)."""

  name: str
  unit: str
  amount: int
  optimizer: str
  learning_rate: float
  lr_decay: float
  weight_decay: float = 0.0


class Study(NamedTuple):
  """One comparison: a reference, a config, our rows and theirs.

  Attributes:
    reference: A key of `PINS`.
    config: The library config (`configs/...`) both codes run.
    overrides: `key=value` changes to it that make the work identical.
    ours: Our rows, `compare --methods` items (method or method.preset).
    theirs: The reference runner's `--method` values.
    variants: More of our rows, `compare --variant` items
      (`LABEL:METHOD:KEY=VALUE;...`).
    regime: The reference runner's fixed regime (FedGen's), or None: the
      runner takes the config's local work as flags (DaFKD's).
  """

  reference: str
  config: str
  overrides: tuple[str, ...]
  ours: tuple[str, ...]
  theirs: tuple[str, ...]
  variants: tuple[str, ...] = ()
  regime: Optional[Regime] = None


# The DaFKD reference's server learning rate (its script's `--es_lr`).
_AUTHORS_LR = 'distill.learning_rate=0.0001'

# The DaFKD reference's other choices the library can make, one key set
# each (docs/methods/dafkd.md, "The reference code against the paper").
_DAFKD_CHOICES = (
    ('student_bn', 'distill.student_training=True'),
    ('server_bn', 'dafkd.server_batchnorm=batch'),
    ('bn_update', 'dafkd.discriminator_mode=batch_update;'
     'dafkd.gan_passes=every_step'),
    ('gan_windows', 'dafkd.gan_steps=0;dafkd.gan_epochs=5;'
     'dafkd.disc_rounds=3;dafkd.generator_rounds=5'),
    ('logits', 'dafkd.ensemble=logits'),
    ('distill_steps', 'distill.steps=1600;distill.batch_size=32'),
    ('distill_plain', 'distill.clip_norm=0.0;distill.val_fraction=0.0;'
     'distill.cosine_decay=False;distill.kl_reduction=mean'),
    ('penalty', 'dafkd.gp_weight=0.3;dafkd.gp_norm=pixel;'
     'dafkd.adv_weight=2.0'),
    ('broadcast', 'dafkd.pool_generator=broadcast'),
    ('first_round', 'dafkd.first_distill_round=1'),
    ('global_head', 'dafkd.discriminator_sharing=global'),
)

STUDIES = {
    # DaFKD's drift regime: Dir(0.05), 20 clients, 8 per round, 20 local
    # epochs of batch 32, 20 rounds. The reference's clients run plain Adam
    # (no weight decay), so ours do too. The `reference` preset's GAN
    # window is in epochs, where the config's is 100 steps: its row sets
    # the steps' window off.
    'dafkd': Study(
        'dafkd', 'configs/dafkd_paper_cpu.py',
        ('client_optimizer.weight_decay=0',),
        ('fedavg', 'dafkd.paper_dcgan'), ('fedavg', 'dafkd'),
        variants=('dafkd.reference:dafkd:dafkd.variant=reference;'
                  'dafkd.gan_steps=0',)),
    # Our `paper_dcgan` with one of the reference code's choices at a time
    # (docs/methods/dafkd.md, "The reference code against the paper"):
    # which of them moves the paper's DaFKD, and through which link.
    # The `lr_<row>` rows add the same choice to `paper_dcgan` at the
    # authors' server learning rate (the `distill_lr` row): which of them
    # cost the ~11 points between that row and the `reference` preset.
    'dafkd_links': Study(
        'dafkd', 'configs/dafkd_paper_cpu.py',
        ('client_optimizer.weight_decay=0',),
        ('fedavg', 'dafkd.paper_dcgan'), (),
        variants=tuple(
            f'{label}:dafkd:dafkd.variant=paper_dcgan;{keys}'
            for label, keys in (
                (('distill_lr', _AUTHORS_LR),) + _DAFKD_CHOICES +
                tuple((f'lr_{label}', f'{_AUTHORS_LR};{keys}')
                      for label, keys in _DAFKD_CHOICES)))),
    # FedGen in DaFKD's drift regime, and in its own MNIST setting (its
    # README's: 20 users, Dir(0.1) over 1,500 images a class, 10 a round,
    # 20 SGD steps, 200 rounds). `fedgen.uniform` is ours with the
    # reference's noise U[0, 1) (the paper's, our default, is Gaussian).
    'fedgen_drift': Study(
        'fedgen', 'configs/dafkd_paper_cpu.py',
        ('client_optimizer.weight_decay=0',),
        ('fedavg', 'fedgen'), ('fedavg', 'fedgen'),
        variants=('fedgen.uniform:fedgen:fedgen.noise=uniform',),
        regime=Regime('drift', 'epochs', 20, 'adam', 1e-3, 1.0)),
    'fedgen_own': Study(
        'fedgen', 'configs/fedgen_mnist.py', (),
        ('fedavg', 'fedgen'), ('fedavg', 'fedgen'),
        variants=('fedgen.uniform:fedgen:fedgen.noise=uniform',),
        regime=Regime('fedgen', 'steps', 20, 'sgd', 0.01, 0.99)),
}

_STUDY = flags.DEFINE_enum('study', 'dafkd', list(STUDIES),
                           'Which comparison to run.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds.')
_REFERENCE_DIR = flags.DEFINE_string(
    'reference_dir', None, "A checkout of the reference's pinned commit.")
_REFERENCE_PYTHON = flags.DEFINE_string(
    'reference_python', None, 'A Python with torch and numpy, and tqdm and '
    'h5py for FedGen (the study\'s '
    'own venv; see the README).')
_MANUAL_DIR = flags.DEFINE_string('manual_dir', '../shared/data/mnist',
                                  'The raw MNIST files.')
_WORK_DIR = flags.DEFINE_string(
    'work_dir', '/tmp/tff_kd_parity', 'Splits, the reference\'s work '
    'folder and every run (resumable).')
_OUT = flags.DEFINE_string(
    'out', os.path.join(HERE, 'results'), 'Where the report goes '
    '(<out>/<study>/).')
_OURS = flags.DEFINE_list(
    'ours', None, 'Our rows, `compare --methods` items (default: the '
    'study\'s rows and variants).')
_THEIRS = flags.DEFINE_list('theirs', None,
                            'Their rows (default: the study\'s).')
_ROUNDS = flags.DEFINE_integer('rounds', None,
                               'Rounds of every run (default: the config\'s).')
_REPORT_ONLY = flags.DEFINE_boolean(
    'report_only', False, 'Rewrite the report from the finished runs.')
_ROWS = flags.DEFINE_list(
    'rows', None, 'Run only these of our rows (labels); the report still '
    'reads every finished run.')
_RUN = flags.DEFINE_enum(
    'run', 'both', ['both', 'ours', 'theirs'],
    'Which code to run (the report reads every finished run of both).')
_PIN_FILE = flags.DEFINE_string(
    'pin_file', None, 'A JSON pin ({"files": {path: blob hash}}) instead of '
    'the study\'s (the smoke test\'s stand-in reference).')
_OVERRIDES = common.define_overrides_flag()

LAST = 5


def prepare_work(directory: str, pin: Pin, work: str,
                 files: Optional[dict[str, str]] = None) -> None:
  """The reference's pinned files, patched, and the runner, in `work`."""
  if os.path.exists(work):
    shutil.rmtree(work)
  for name in (files or pin.files):
    os.makedirs(os.path.join(work, os.path.dirname(name)), exist_ok=True)
    shutil.copy(os.path.join(directory, name), os.path.join(work, name))
  if pin.patch is not None:
    proc = subprocess.run(
        ['patch', '-p1', '--quiet', '-i', os.path.join(HERE, pin.patch)],
        cwd=work, capture_output=True, text=True, check=False)
    if proc.returncode:
      raise StudyError(f'{pin.patch} does not apply to {directory}: '
                       f'{(proc.stdout + proc.stderr).strip()[:200]}')
  shutil.copy(os.path.join(HERE, pin.runner), work)


def study_config(study: Study, seed: Optional[int] = None) -> Any:
  """The study's config with its and the command line's overrides."""
  config = common.config_module(study.config).get_config()
  config.dataset.manual_dir = _MANUAL_DIR.value
  common.apply_overrides(config, [*study.overrides, *_OVERRIDES.value])
  if _ROUNDS.value:
    config.rounds = _ROUNDS.value
    config.checkpoint_every = _ROUNDS.value
  if seed is not None:
    config.seed = seed
  return config


def runner_args(study: Study, config: Any) -> list[str]:
  """The work of `config` as the reference runner's flags.

  Raises:
    StudyError: the config's local work is not what the runner can run.
  """
  local, opt = config.local, config.client_optimizer
  common_args = [f'--rounds={config.rounds}',
                 f'--batch_size={local.batch_size}']
  regime = study.regime
  if regime is None:  # The DaFKD runner: the config's epochs and Adam.
    if local.unit != 'epochs' or opt.name != 'adam' or opt.weight_decay:
      raise StudyError(
          f'the DaFKD runner trains epochs with plain Adam (the '
          f'reference\'s clients), not local.unit={local.unit!r} with '
          f'client_optimizer {opt.name!r}, weight decay {opt.weight_decay}')
    return [*common_args, f'--epochs={local.amount}',
            f'--lr={opt.learning_rate}']
  got = Regime(regime.name, local.unit, local.amount, opt.name,
               opt.learning_rate, opt.lr_decay, opt.weight_decay)
  if got != regime:
    raise StudyError(
        f'the FedGen runner\'s regime {regime.name!r} is {regime}, the '
        f'config has {got}: change the config back or the runner')
  return [*common_args, f'--regime={regime.name}']


def run_theirs(study: Study, python: str, work: str, split_path: str,
               method: str, seed: int, out: str, config: Any) -> None:
  """One run of the reference, unless `out` already has every round."""
  if finished_theirs(out, config.rounds):
    return
  log = out.removesuffix('.json') + '.log'
  cmd = [python, PINS[study.reference].runner, f'--split={split_path}',
         f'--out={out}', f'--method={method}', f'--seed={seed}',
         *runner_args(study, config)]
  print(f'theirs: {method} seed {seed} ...', flush=True)
  with open(log, 'w') as f:
    proc = subprocess.run(cmd, cwd=work, stdout=f, stderr=subprocess.STDOUT,
                          check=False)
  if proc.returncode:
    with open(log) as f:
      raise RuntimeError(f'the reference run {method} seed {seed} failed: '
                         f'{common.error_line(f.read())} (log: {log})')


def finished_theirs(path: str, rounds: int) -> Optional[dict[str, Any]]:
  """A reference run's JSON if it has `rounds` rounds, else None."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    record = json.load(f)
  return record if len(record['rounds']) == rounds else None


def run_ours(study: Study, seeds: Sequence[int], root: str) -> list:
  """Our rows on the study's config, with the `compare` run loop."""
  if _OURS.value:
    entries = experiment.study_entries(_OURS.value)
  else:  # The variants first: the slowest rows start early.
    entries = [*(experiment.study_entries([], study.variants)
                 if study.variants else []),
               *experiment.study_entries(study.ours)]
  plan = experiment.plan_study(study_config(study), entries, seeds,
                               clients='config')
  if not _REPORT_ONLY.value and _RUN.value in ('both', 'ours'):
    experiment.run_study([run for run in plan if not _ROWS.value or
                          run.entry.label in _ROWS.value], root)
  return plan


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
  values = [v for v in values if v is not None and math.isfinite(v)]
  if not values:
    return float('nan'), float('nan')
  mean = sum(values) / len(values)
  var = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)
         if len(values) > 1 else 0.0)
  return mean, math.sqrt(var)


def _who(code: str) -> str:
  return 'ours' if code == 'ours' else "authors'"


def _pct(pair: tuple[float, float]) -> str:
  return f'{100 * pair[0]:.2f} ± {100 * pair[1]:.2f}'


# The link columns: (title, our metric, their key); means over rounds >= 2
# (the reference distils from its second round) and seeds. DaFKD's runner
# records its server step's links, FedGen's its probes of the round's models.
DAFKD_LINKS = (
    ('averaged model, labeled', 'distill/labeled_accuracy_before',
     'avg_val_accuracy'),
    ('student, labeled', 'distill/labeled_accuracy_after',
     'student_val_accuracy'),
    ('teachers, labeled', 'distill/teacher_labeled_accuracy',
     'teacher_accuracy'),
    ('eq. 7 ensemble', 'distill/ensemble_accuracy_weighted',
     'ensemble_accuracy_weighted'),
    ('uniform ensemble', 'distill/ensemble_accuracy_uniform',
     'ensemble_accuracy_uniform'),
    ('holders\' ensemble', 'distill/ensemble_accuracy_oracle',
     'ensemble_accuracy_oracle'),
    ('holder ratio', 'distill/holder_ratio', 'holder_ratio'),
    ('pool top class share', 'distill/pool_top_class_share',
     'pool_top_class_share'),
    ('pool class entropy', 'distill/pool_class_entropy',
     'pool_class_entropy'),
    ('disc. score, real', 'distill/disc_score_real', 'disc_score_real'),
    ('disc. score, pool', 'distill/disc_score_pool', 'disc_score_pool'),
)
FEDGEN_LINKS = (
    ('averaged model, labeled', 'distill/labeled_accuracy_before',
     'avg_probe_accuracy'),
    ('teachers, labeled', 'distill/teacher_labeled_accuracy',
     'teacher_probe_accuracy'),
    ('label-weighted ensemble, labeled', 'distill/ensemble_labeled_accuracy',
     'ensemble_probe_accuracy'),
)
LINKS = {'dafkd': DAFKD_LINKS, 'fedgen': FEDGEN_LINKS}


class Row(NamedTuple):
  """One row of the report: a code's method over seeds."""

  code: str  # 'ours' or 'theirs'
  name: str
  curves: dict[int, list[float]]  # seed -> per-round test accuracy
  seconds: dict[int, list[float]]  # seed -> per-round seconds
  links: dict[int, dict[str, list[float]]]  # seed -> link -> per round

  @property
  def is_fedavg(self) -> bool:
    return self.name == 'fedavg'


def our_rows(plan: list, root: str, links: Sequence[tuple[str, str, str]]
             ) -> list[Row]:
  """Our finished runs as rows, in the plan's order."""
  rows: dict[str, Row] = {}
  for run in plan:
    folder = os.path.join(root, 'runs', run.name)
    if not os.path.exists(os.path.join(folder, 'record.json')):
      continue
    record = common.study_record(folder)
    if 'error' in record:
      raise RuntimeError(f'our run {run.name} failed: {record["error"]}')
    row = rows.setdefault(record['variant'],
                          Row('ours', record['variant'], {}, {}, {}))
    row.curves[run.seed] = record['accuracy']
    row.seconds[run.seed] = record['train_seconds']
    row.links[run.seed] = {title: record['metrics'].get(key, [])
                           for title, key, _ in links}
  return list(rows.values())


def their_rows(records: dict[tuple[str, int], dict],
               links: Sequence[tuple[str, str, str]]) -> list[Row]:
  """The reference's finished runs as rows."""
  rows: dict[str, Row] = {}
  for (method, seed), record in records.items():
    row = rows.setdefault(method, Row('theirs', method, {}, {}, {}))
    rounds = record['rounds']
    row.curves[seed] = [r['test_accuracy'] for r in rounds]
    row.seconds[seed] = [r['seconds'] for r in rounds]
    # FedGen's runner probes the first 1,000 test images where the split
    # has no labeled server images (its own regime): not a link here.
    on_labeled = record.get('probe', 'val') == 'val'
    row.links[seed] = {
        title: [r.get(key, float('nan')) if on_labeled else float('nan')
                for r in rounds]
        for title, _, key in links}
  return list(rows.values())


def _finals(row: Row) -> list[float]:
  return [row.curves[s][-1] for s in sorted(row.curves)]


def _mean(values: Sequence[float]) -> float:
  return sum(values) / len(values)


def _per_round(row: Row) -> float:
  """Seconds per round, without round 1 (tracing, warm-up)."""
  values = [t for s in row.seconds for t in row.seconds[s][1:]]
  return _mean(values) if values else float('nan')


# A run's number per statistic: its final round, its last 5, every round.
STATISTICS = (('final', lambda c: c[-1]),
              ('last 5', lambda c: _mean(c[-LAST:])),
              ('all rounds', _mean))


def table(rows: Sequence[Row]) -> str:
  """The Markdown comparison table: per statistic, the mean ± std over
  seeds and the mean gap to FedAvg of the same code and seed."""
  fedavg = {code: next((r for r in rows if r.code == code and r.is_fedavg),
                       None) for code in ('ours', 'theirs')}
  names = [name for name, _ in STATISTICS]
  lines = ['| code | method | seeds | per seed (final) | ' +
           ' | '.join(names) + ' | Δ FedAvg (same code): ' +
           ' / '.join(names) + ' | s/round |',
           '|---|---|---|---|' + '---|' * len(names) + '---|---|']
  for row in rows:
    seeds = sorted(row.curves)
    base = fedavg[row.code]
    cells = [_pct(_mean_std([stat(row.curves[s]) for s in seeds]))
             for _, stat in STATISTICS]
    delta = ''
    if base is not None and not row.is_fedavg:
      both = [s for s in seeds if s in base.curves]
      gaps = ([stat(row.curves[s]) - stat(base.curves[s]) for s in both]
              for _, stat in STATISTICS)
      delta = ' / '.join(f'{100 * _mean_std(g)[0]:+.2f}' for g in gaps)
    lines.append(
        f'| {_who(row.code)} | {row.name} | {", ".join(map(str, seeds))} | '
        f'{" / ".join(f"{100 * v:.2f}" for v in _finals(row))} | '
        + ' | '.join(cells) + f' | {delta} | {_per_round(row):.1f} |')
  return '\n'.join(lines) + '\n'


def links_table(rows: Sequence[Row],
                links: Sequence[tuple[str, str, str]]) -> str:
  """The link means (rounds >= 2, seeds) of the rows that distil."""
  kd = [r for r in rows if not r.is_fedavg]
  if not kd:
    return ''
  header = '| link | ' + ' | '.join(
      f'{_who(r.code)} {r.name}' for r in kd) + ' |'
  lines = [header, '|---|' + '---|' * len(kd)]
  for title, _, _ in links:
    cells = []
    for row in kd:
      values = [v for s in row.links for v in row.links[s][title][1:]
                if v is not None and math.isfinite(v) and v >= 0]
      cells.append(f'{_mean(values):.3f}' if values else '')
    lines.append(f'| {title} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


def write_rounds(rows: Sequence[Row], path: str) -> None:
  """Every run's per-round test accuracy and seconds as CSV."""
  with open(path, 'w', newline='') as f:
    w = csv.writer(f)
    w.writerow(['code', 'method', 'seed', 'round', 'test_accuracy',
                'seconds'])
    for row in rows:
      for seed in sorted(row.curves):
        for i, (acc, sec) in enumerate(zip(row.curves[seed],
                                           row.seconds[seed])):
          w.writerow([row.code, row.name, seed, i + 1, f'{acc:.4f}',
                      f'{sec:.2f}'])


def plot(rows: Sequence[Row], path: str, title: str) -> None:
  """Mean test accuracy per row: ours solid, theirs dashed."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(7, 4.5))
  colors = {}
  for row in rows:
    curves = [row.curves[s] for s in sorted(row.curves)]
    n = min(len(c) for c in curves)
    mean = [sum(c[i] for c in curves) / len(curves) for i in range(n)]
    key = row.name.split('.')[0]
    color = colors.setdefault(row.name if row.code == 'ours' else key,
                              f'C{len(colors)}')
    if row.code == 'theirs':
      color = colors.get(key, color)
    ax.plot(range(1, n + 1), mean, color=color,
            linestyle='-' if row.code == 'ours' else '--',
            label=f'{_who(row.code)} {row.name}')
  ax.set_xlabel('round')
  ax.set_ylabel('test accuracy')
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  del argv
  study = STUDIES[_STUDY.value]
  pin = PINS[study.reference]
  files = None
  if _PIN_FILE.value:
    with open(_PIN_FILE.value) as f:
      files = json.load(f)['files']
  seeds = [int(s) for s in _SEEDS.value]
  theirs = _THEIRS.value or list(study.theirs)
  work_dir = os.path.join(_WORK_DIR.value, _STUDY.value)
  runs_theirs = (not _REPORT_ONLY.value and _RUN.value in ('both', 'theirs')
                 and bool(theirs))
  try:
    if runs_theirs:
      check_reference(_REFERENCE_DIR.value, pin, files)
      check_python(_REFERENCE_PYTHON.value, pin.modules)
      if pin.patch is not None and shutil.which('patch') is None:
        raise StudyError('the study applies its patch with `patch`, which '
                         'is not on PATH')
      runner_args(study, study_config(study))
  except StudyError as e:
    sys.exit(f'parity: error: {e}')
  t0 = time.perf_counter()
  records = {}
  if runs_theirs:
    from studies.parity import split  # pylint: disable=g-import-not-at-top
    work = os.path.join(work_dir, 'reference')
    prepare_work(_REFERENCE_DIR.value, pin, work, files)
    os.makedirs(os.path.join(work_dir, 'theirs'), exist_ok=True)
    for seed in seeds:
      config = study_config(study, seed)
      split_path = os.path.join(work_dir, f'split_s{seed}.npz')
      if not os.path.exists(split_path):
        split.export(config, split_path)
      for method in theirs:
        out = os.path.join(work_dir, 'theirs', f'{method}_s{seed}.json')
        run_theirs(study, os.path.abspath(_REFERENCE_PYTHON.value), work,
                   split_path, method, seed, out, config)
  rounds = study_config(study).rounds
  for seed in seeds:
    for method in theirs:
      record = finished_theirs(
          os.path.join(work_dir, 'theirs', f'{method}_s{seed}.json'), rounds)
      if record is not None:
        records[(method, seed)] = record
  ours_root = os.path.join(work_dir, 'ours')
  plan = run_ours(study, seeds, ours_root)
  links = LINKS[study.reference]
  rows = our_rows(plan, ours_root, links) + their_rows(records, links)
  out = os.path.join(_OUT.value, _STUDY.value)
  os.makedirs(out, exist_ok=True)
  write_rounds(rows, os.path.join(out, 'rounds.csv'))
  text = (f'# Parity, study `{_STUDY.value}`: {pin.repository} at '
          f'{pin.commit[:7]} against tff_kd\n\n'
          f'Command: `{common.command("parity.parity")}`  \n'
          f'Machine: {common.machine()}  \nConfig: `{study.config}` with '
          f'{", ".join(study.overrides + tuple(_OVERRIDES.value)) or "-"}\n\n'
          + table(rows))
  link_text = links_table(rows, links)
  if link_text:
    text += ('\nLinks (means over rounds 2..R and seeds; labeled = the '
             "server's labeled images):\n\n" + link_text)
  with open(os.path.join(out, 'table.md'), 'w') as f:
    f.write(text)
  plot(rows, os.path.join(out, 'curves.png'),
       f'{pin.repository} (dashed) and tff_kd (solid)')
  print(text)
  print(f'{time.perf_counter() - t0:.0f} s')


if __name__ == '__main__':
  app.run(main)
