r"""DaFKD's link table from `studies/compare_methods/compare_methods.py` run records.

Decomposes a DaFKD variant's result into its links, each a mean over seeds
of the per-round diagnostics over the last `--last` rounds (Wang et al.,
CVPR 2023: the generator's pool, eq. 7's weights on it, the weighted
ensemble, the student before and after eq. 8's distillation):

* pool: `label_fidelity` (the share of G(z, y) the averaged classifier
  calls y) and the pool's top-class share;
* weights on the pool: `pool_holder_ratio` (eq. 7's mass on the teachers
  that hold a sample's pseudo label y, over uniform weights' mass on them);
* ensemble on the pool: the share of the pool whose weighted / uniform /
  holders-only ensemble predicts y, and the mean probability the weighted /
  uniform ensemble (teachers at T = 1) puts on y ("mass"; runs from
  2026-11-26 on);
* weights on real images: the holder ratio and the weighted / uniform
  ensemble accuracy on the server's 500 labeled images, scored as the pool
  is (a projection discriminator is scored with the images' true labels
  there, which a server does not have for unlabeled data: only its pool
  columns compare across discriminators);
* student: the labeled (validation) accuracy of the averaged model before
  and after distillation, and after distillation on the uniform ensemble
  instead, from the same start (`dafkd.twin_student`; "twin val after");
* result: final test accuracy and the mean of the last 5 rounds.

Usage:
  python -m studies.dafkd_pool.dafkd_links --runs=studies/dafkd_pool/results/dafkd_pool/runs \
      --out=studies/dafkd_pool/results/dafkd_pool/links.md [--per_seed]
"""

import collections
import glob
import json
import math
import os
import statistics

from absl import app
from absl import flags

_RUNS = flags.DEFINE_string('runs', None, 'Folder of <variant>_s<seed>.json.')
_OUT = flags.DEFINE_string('out', '', 'Markdown file (default: print).')
_LAST = flags.DEFINE_integer('last', 5, 'Rounds averaged (the last ones).')
_PER_SEED = flags.DEFINE_bool('per_seed', False,
                              'One row per (variant, seed) instead of means '
                              'over seeds.')

# (column, metric key or a function of the run record).
_COLUMNS = (
    ('final test', lambda r, n: r['final_accuracy']),
    ('last-5 test', lambda r, n: _mean(r['accuracy'][-5:])),
    ('val before', 'distill/labeled_accuracy_before'),
    ('val after', 'distill/labeled_accuracy_after'),
    ('twin val after', 'distill/twin_labeled_accuracy_after'),
    ('label fidelity', 'distill/label_fidelity'),
    ('pool top class', 'distill/pool_top_class_share'),
    ('pool holder ratio', 'distill/pool_holder_ratio'),
    ('pool ens. weighted', 'distill/pool_ensemble_agreement_weighted'),
    ('pool ens. uniform', 'distill/pool_ensemble_agreement_uniform'),
    ('pool ens. holders', 'distill/pool_ensemble_agreement_oracle'),
    ('pool mass weighted', 'distill/pool_label_mass_weighted'),
    ('pool mass uniform', 'distill/pool_label_mass_uniform'),
    ('real holder ratio', 'distill/holder_ratio'),
    ('real ens. weighted', 'distill/ensemble_accuracy_weighted'),
    ('real ens. uniform', 'distill/ensemble_accuracy_uniform'),
)


def _mean(values) -> float:
  values = [v for v in values if v is not None and math.isfinite(v)]
  return statistics.fmean(values) if values else float('nan')


def link_table(runs: list[dict], last: int,
               per_seed: bool = False) -> tuple[list[str], dict]:
  """variant -> {column: (mean over seeds, seeds)} of the link columns.

  With `per_seed`, the rows are (variant, seed) pairs, named
  '<variant> s<seed>'.
  """
  by_variant = collections.defaultdict(list)
  for r in runs:
    if 'error' not in r:
      name = f"{r['variant']} s{r['seed']}" if per_seed else r['variant']
      by_variant[name].append(r)
  table = {}
  for variant, rs in sorted(by_variant.items()):
    row = {}
    for name, key in _COLUMNS:
      per_seed = []
      for r in rs:
        if callable(key):
          per_seed.append(key(r, last))
        elif key in r['metrics']:
          per_seed.append(_mean(r['metrics'][key][-last:]))
      row[name] = (_mean(per_seed), len(per_seed))
    row['seeds'] = sorted(r['seed'] for r in rs)
    table[variant] = row
  return [name for name, _ in _COLUMNS], table


def markdown(columns: list[str], table: dict, last: int) -> str:
  lines = [f'Means over seeds of the last {last} rounds (test accuracy: '
           'final and last-5 mean); "-": not measured for that variant.', '',
           '| variant | seeds | ' + ' | '.join(columns) + ' |',
           '|---' * (len(columns) + 2) + '|']
  for variant, row in table.items():
    cells = []
    for name in columns:
      value, count = row[name]
      cells.append('-' if not count or math.isnan(value) or value == -1
                   else f'{value:.3f}')
    lines.append(f"| {variant} | {','.join(map(str, row['seeds']))} | "
                 + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  runs = []
  for path in sorted(glob.glob(os.path.join(_RUNS.value, '*.json'))):
    with open(path) as f:
      runs.append(json.load(f))
  text = markdown(*link_table(runs, _LAST.value, _PER_SEED.value),
                  _LAST.value)
  if _OUT.value:
    with open(_OUT.value, 'w') as f:
      f.write(text)
  print(text)


if __name__ == '__main__':
  flags.mark_flag_as_required('runs')
  app.run(main)
