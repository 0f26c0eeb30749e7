r"""All methods on one MNIST setting, several seeds, resumable.

The comparison that the DaFKD paper's Table 1 makes (Wang et al., CVPR 2023)
and that the FedDF, FedGen and FedFTG issues ask for: every method (and
ablation) starts from `configs/compare_mnist.py` (MNIST, 20 clients, 8 per
round, Dir(0.1), the small CNN, 30 rounds, 10 local epochs), so all train
the same clients with the same seeds, client samples and local work. A
variant is a method plus config overrides (`VARIANTS`).

The runs are the library's `compare` runs (`experiment.plan_study`,
`run_study`: every run's config validated before any runs, one progress
bar, each run in its own folder under `--root_dir`, resumed from its last
checkpoint after an interruption). Each finished (variant, seed) run is
then written to `<out>/runs/<variant>_s<seed>.json`, this study's record,
and runs already there are skipped, so the script can be re-invoked to add
methods or seeds; `<out>/summary.{json,md}` is rebuilt from all run files
each time. The summary reports, per variant, mean +- std over seeds of the final
test accuracy and of the mean of the last 5 rounds, the mean curve, seconds
per round (`process.next`, round 1 excluded: it traces), and the
method-specific server metrics.

The library's `compare` command (docs/compare.md) runs methods and named
variants over seeds for any config; this script is its run loop with a
fixed set of research variants (`VARIANTS`) and its own run records, which
studies/table1 and studies/dafkd_pool read, and it shares the command's
statistics over seeds (`experiment.mean_std`, `last_mean`, `mean_curve`,
`finite_mean`, `seconds_per_round`).

Usage (about 3-8 minutes per variant and seed on 2 CPU cores):
  TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -m studies.compare_methods.compare_methods \
      --manual_dir=../shared/data/mnist --seeds=0,1,2 \
      --variants=fedavg,feddf
"""

import json
import os
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from tff_kd.runtime import context  # pylint: disable=g-import-not-at-top
context.install()  # The program opts in to tff_kd's process set-up.
from tff_kd.program import experiment

from absl import app  # pylint: disable=g-bad-import-order
from absl import flags

from studies import common

# variant -> (method, config overrides as dotted keys).
# DaFKD distils on generated images with the shared config's settings for it
# (compare_mnist's METHOD_OVERRIDES: T = 20, Adam lr 1e-4, BatchNorm
# statistics frozen) and averages by examples as FedAvg does (the paper's plain mean is
# dafkd.aggregation=mean), so that the comparison isolates distillation;
# the local work stays the shared one. Its discriminators score real and
# generated images in inference mode (the server's mode); the GAN terms
# (DCGAN generator, the reference code's; non-saturating loss) are active
# in the last 100 local steps of a round (about a third of an average
# client's round; BUILD_NOTES "DaFKD mechanism"). `_oracle` variants
# train the discriminators against, and distil on, the server's 5,000 real
# unlabeled images instead of generated ones (Theorem 1's p_g = p by
# construction); `_no_correlation` uses uniform teacher weights.
_DAFKD = {'dafkd.variant': 'paper', 'dafkd.gan_steps': 100,
          'dafkd.gan_window': 'last',
          'dafkd.generator': 'dcgan', 'dafkd.aggregation': 'examples'}
_ORACLE = {**_DAFKD, 'dafkd.pool': 'real'}
# Generated-pool candidates (issue: a pool that carries domain knowledge):
# the generator step draws its labels from the client's own batch
# ('local'), and/or adds the client classifier's cross-entropy on
# (g(z, y), y) (`aux`, ACGAN-style), so that g(., y) has to look like
# class y to the clients that hold y.
_LOCAL = {**_DAFKD, 'dafkd.generator_labels': 'local'}
_AUX = {**_DAFKD, 'dafkd.aux_weight': 1.0}
_LOCAL_AUX = {**_LOCAL, 'dafkd.aux_weight': 1.0}
# ... and a projection discriminator f_k(x, y), which eq. 7 reads with the
# pool's pseudo labels.
_LOCAL_AUX_PROJ = {**_LOCAL_AUX, 'dafkd.discriminator': 'projection'}
# The hard pool (`dafkd.pool_candidates`, variants dafkd_hard*) and two
# generator steps per GAN step (`dafkd.generator_steps`, *_g2) measured
# negative and left the library (tff_kd/methods/dafkd/NOTES.md); their
# results stay in results/dafkd_paper_cpu_alpha*_hard, *_generator and
# dafkd_pool.
# Appendix A (Fig. 7): the conditional generator makes the extractor's
# features; the discriminators and teachers read them with their heads and
# the server distils the averaged classifier's head.
_FEATURE = {**_LOCAL_AUX_PROJ, 'dafkd.generator': 'feature'}
# ... with eq. 2's real term kept out of the shared extractor.
_FEATURE_DETACH = {**_FEATURE, 'dafkd.detach_extractor': True}
VARIANTS: dict[str, tuple[str, dict]] = {
    'fedavg': ('fedavg', {}),
    'fedprox': ('fedprox', {}),
    'feddf': ('feddf', {}),
    'feddf_student_training': ('feddf', {'distill.student_training': True}),
    'dafkd': ('dafkd', _DAFKD),
    'dafkd_no_sharing': ('dafkd', {**_DAFKD, 'dafkd.shared_extractor': False}),
    'dafkd_no_correlation': ('dafkd', {**_DAFKD,
                                       'dafkd.weighting': 'uniform'}),
    'dafkd_guard': ('dafkd', {**_DAFKD, 'distill.accept': 'no_worse'}),
    'dafkd_oracle': ('dafkd', _ORACLE),
    'dafkd_oracle_no_correlation': ('dafkd', {**_ORACLE,
                                              'dafkd.weighting': 'uniform'}),
    'dafkd_local': ('dafkd', _LOCAL),
    'dafkd_aux': ('dafkd', _AUX),
    'dafkd_local_aux': ('dafkd', _LOCAL_AUX),
    'dafkd_local_aux_no_correlation': ('dafkd', {
        **_LOCAL_AUX, 'dafkd.weighting': 'uniform'}),
    'dafkd_local_aux_proj': ('dafkd', _LOCAL_AUX_PROJ),
    'dafkd_aux_proj': ('dafkd', {**_AUX, 'dafkd.discriminator': 'projection'}),
    'dafkd_local_aux_proj_no_correlation': ('dafkd', {
        **_LOCAL_AUX_PROJ, 'dafkd.weighting': 'uniform'}),
    # Generator capacity, on the conditional pool.
    'dafkd_local_aux_proj_w128': ('dafkd', {**_LOCAL_AUX_PROJ,
                                            'dafkd.generator_width': 128}),
    'dafkd_feature': ('dafkd', _FEATURE),
    'dafkd_feature_no_correlation': ('dafkd', {**_FEATURE,
                                               'dafkd.weighting': 'uniform'}),
    'dafkd_feature_detach': ('dafkd', _FEATURE_DETACH),
    'dafkd_feature_detach_no_correlation': ('dafkd', {
        **_FEATURE_DETACH, 'dafkd.weighting': 'uniform'}),
    'dafkd_feature_paper': ('dafkd', {**_DAFKD,
                                      'dafkd.generator': 'feature'}),
    'fedgen': ('fedgen', {}),
    'fedftg': ('fedftg', {}),
}

_MANUAL_DIR = flags.DEFINE_string('manual_dir', '../shared/data/mnist',
                                  'Raw MNIST IDX files.')
_DATA_DIR = flags.DEFINE_string('data_dir', '~/tensorflow_datasets',
                                'tfds data_dir.')
_CONFIG = flags.DEFINE_string(
    'config', 'configs/compare_mnist.py',
    'The shared config (a module of configs/ with get_config(); its '
    'METHOD_OVERRIDES, if any, are applied per method before the '
    "variant's own).")
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds.')
_VARIANTS = flags.DEFINE_list('variants', ['fedavg', 'feddf'],
                              f'Variants, from: {", ".join(VARIANTS)}.')
_ROUNDS = flags.DEFINE_integer('rounds', None,
                               'Rounds (default: the config\'s).')
_OVERRIDES = flags.DEFINE_list(
    'overrides', [], 'Extra key=value config overrides for every variant '
    '(e.g. local.amount=2 for a smoke test); recorded in the summary.')
_ROOT = flags.DEFINE_string('root_dir', '', 'Run folders (default: temp).')
_OUT = flags.DEFINE_string('out', 'studies/compare_methods/results/compare_mnist',
                           'Result folder.')



def base_config():
  """The shared config every run starts from, with the data folders."""
  c = common.config_module(_CONFIG.value).get_config()
  c.dataset.manual_dir = _MANUAL_DIR.value
  c.dataset.data_dir = _DATA_DIR.value
  if _ROUNDS.value:
    c.checkpoint_every = _ROUNDS.value
  return c


def entry(variant: str):
  """A variant as a `compare` study entry: its method, then the config's
  METHOD_OVERRIDES for that method, the variant's own overrides and
  `--overrides`, in that order."""
  method, own = VARIANTS[variant]
  module = common.config_module(_CONFIG.value)
  return experiment.StudyEntry(variant, method, {
      **getattr(module, 'METHOD_OVERRIDES', {}).get(method, {}),
      **own, **common.parse_overrides(_OVERRIDES.value)})


def title(dataset: str) -> str:
  """The report's title: the comparison on `dataset`."""
  return f'Method comparison on {dataset} (studies/compare_methods/compare_methods.py)'


def summarize(runs: list[dict]) -> dict:
  """Mean +- std over seeds per variant, from run records.

  The statistics are the `compare` command's (`experiment.mean_std`,
  `last_mean`, `mean_curve`, `finite_mean`); the summary's keys are this
  study's own.
  """
  by_variant: dict[str, list[dict]] = {}
  for r in runs:
    by_variant.setdefault(r['variant'], []).append(r)
  summary = {}
  for variant, rs in by_variant.items():
    rs.sort(key=lambda r: r['seed'])
    if any('error' in r for r in rs):
      summary[variant] = dict(
          seeds=[r['seed'] for r in rs],
          errors=[r.get('error', '') for r in rs])
      continue
    finals = [r['final_accuracy'] for r in rs]
    final_mean, final_std = experiment.mean_std(finals)
    last5_mean, last5_std = experiment.mean_std(
        experiment.last_mean(r['accuracy'], 5) for r in rs)
    summary[variant] = dict(
        seeds=[r['seed'] for r in rs],
        final_mean=final_mean, final_std=final_std, finals=finals,
        last5_mean=last5_mean, last5_std=last5_std,
        curve=experiment.mean_curve([r['accuracy'] for r in rs]),
        seconds_per_round=experiment.finite_mean(
            r['seconds_per_round'] for r in rs),
        server_metrics={
            k: experiment.finite_mean(
                experiment.finite_mean(r['metrics'][k]) for r in rs)
            for k in rs[0]['metrics']})
  return summary


def histories(runs: list[dict]) -> dict[str, list[dict]]:
  """variant -> per-seed histories (metrics.csv keys) for the figures."""
  out: dict[str, list[dict]] = {}
  for r in sorted(runs, key=lambda r: (r['variant'], r['seed'])):
    if 'error' in r:
      continue
    history = {'test/accuracy': r['accuracy'], 'train/loss': r['train_loss'],
               **r['metrics']}
    if 'train_seconds' in r:  # Runs recorded before per-round times: none.
      history['time/train_s'] = r['train_seconds']
      history['time/eval_s'] = r['eval_seconds']
    out.setdefault(r['variant'], []).append(history)
  return out


def markdown(summary: dict, meta: dict) -> str:
  lines = [
      f"# {title(meta['dataset'])}", '',
      f"Config: `{meta.get('config', 'configs/compare_mnist.py')}`.", '',
      meta['setting'], '',
      f"Commands: {'; '.join(f'`{c}`' for c in meta['commands'])}. "
      f"Machine: {meta['machine']}.", '',
      '| variant | seeds | final test acc (mean ± std) | last-5 mean '
      '(mean ± std) | s/round |', '|---|---|---|---|---|']
  for variant, s in summary.items():
    if 'errors' in s:
      lines.append(f"| {variant} | {s['seeds']} | failed: "
                   f"{s['errors'][0][:80]} | | |")
      continue
    finals = ', '.join(f'{f:.4f}' for f in s['finals'])
    lines.append(
        f"| {variant} | {','.join(map(str, s['seeds']))} | "
        f"{100 * s['final_mean']:.2f} ± {100 * s['final_std']:.2f} "
        f"({finals}) | {100 * s['last5_mean']:.2f} ± "
        f"{100 * s['last5_std']:.2f} | {s['seconds_per_round']:.1f} |")
  ok = {v: s for v, s in summary.items() if 'curve' in s}
  if ok:
    n = min(len(s['curve']) for s in ok.values())
    lines += ['', '## Mean test accuracy per round (over seeds)', '',
              '| round | ' + ' | '.join(ok) + ' |',
              '|---' * (1 + len(ok)) + '|']
    for i in range(n):
      lines.append(f'| {i + 1} | ' + ' | '.join(
          f"{s['curve'][i]:.4f}" for s in ok.values()) + ' |')
    lines += ['', '## Server / client metrics (mean over rounds and seeds)',
              '']
    for variant, s in ok.items():
      if s['server_metrics']:
        items = ', '.join(f'{k} {v:.4g}'
                          for k, v in sorted(s['server_metrics'].items()))
        lines.append(f'* {variant}: {items}')
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  unknown = [v for v in _VARIANTS.value if v not in VARIANTS]
  if unknown:
    raise app.UsageError(f'unknown variants {unknown}; choose from '
                         f'{", ".join(VARIANTS)}')
  root = _ROOT.value or tempfile.mkdtemp(prefix='compare_')
  run_dir = os.path.join(_OUT.value, 'runs')
  os.makedirs(run_dir, exist_ok=True)
  meta_path = os.path.join(_OUT.value, 'meta.json')
  meta = dict(commands=[], machine=common.machine())
  if os.path.exists(meta_path):
    with open(meta_path) as f:
      meta = json.load(f)
  meta['commands'].append(common.command('compare_methods.compare_methods'))
  meta['config'] = _CONFIG.value
  c = base_config()
  common.apply_overrides(c, _OVERRIDES.value)
  meta['dataset'] = c.dataset.domains or c.dataset.name
  meta['setting'] = (
      f"{meta['dataset']} (first {c.dataset.train_limit} training images), "
      f'{c.partition.num_clients} clients, {c.clients_per_round} per round, '
      f'Dir({c.partition.alpha}), model {c.model.name}, {c.local.amount} '
      f'local {c.local.unit} ({c.client_optimizer.name} lr '
      f'{c.client_optimizer.learning_rate}, weight decay '
      f'{c.client_optimizer.weight_decay}, batch {c.local.batch_size}), '
      f'{_ROUNDS.value or c.rounds} rounds; server pool '
      f'{c.server_data.proxy_size} unlabeled + {c.server_data.val_size} '
      f'labeled images held out of every method\'s client data. Extra '
      f'overrides: {_OVERRIDES.value or "none"}.')
  with open(meta_path, 'w') as f:
    json.dump(meta, f, indent=2)

  # Every run is a `compare` run in <root> (resumable where it stopped);
  # a run with a record in <out>/runs is done.
  plan = [run for run in experiment.plan_study(
      base_config(), [entry(v) for v in _VARIANTS.value],
      experiment.parse_seeds(_SEEDS.value), rounds=_ROUNDS.value)
          if not os.path.exists(os.path.join(run_dir, f'{run.name}.json'))]
  experiment.run_study(plan, root)
  for run in plan:
    result = common.study_record(os.path.join(root, 'runs', run.name))
    with open(os.path.join(run_dir, f'{run.name}.json'), 'w') as f:
      json.dump(result, f, indent=2)

  runs = []
  for name in sorted(os.listdir(run_dir)):
    with open(os.path.join(run_dir, name)) as f:
      runs.append(json.load(f))
  summary = summarize(runs)
  common.write_result(os.path.join(_OUT.value, 'summary'), summary,
                      lambda s: markdown(s, meta))
  by_variant = histories(runs)
  if by_variant:
    experiment.plot_histories(by_variant, os.path.join(_OUT.value, 'curves.png'),
                         title=f'{os.path.basename(_CONFIG.value)}: mean ± '
                         'std over seeds')
  print(markdown(summary, meta))


if __name__ == '__main__':
  app.run(main)
