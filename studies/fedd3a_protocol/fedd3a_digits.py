r"""FedAvg, FedProx, FedDF and FedD3A on digit domains, several seeds.

FedD3A: Su, Li, Xue, "Domain Discrepancy Aware Distillation for Model
Aggregation in Federated Learning", AAAI 2023. Two parts:

1. The cross-silo comparison (the paper's Figure 3 setting on digits,
   `configs/fedd3a_digits_silo.py`): one client per domain (default MNIST,
   USPS, MNIST-M; SVHN and SynthDigits are not available offline), the
   server's unlabeled pool a held-out domain (default scikit-learn's 8x8
   digits), all images 32x32x3. Every method runs with the same seed,
   clients, data, local work and rounds; FedDF and FedD3A distil on the same
   pool with the same settings. Reported per round: the mean over client
   domains of the global model's test accuracy (`test/accuracy`) and each
   domain's accuracy; for FedD3A also each client's mean teacher weight on
   the pool.
2. The Table 2 check ("classification ability of subspace projection"): on
   MNIST, one client per class; each class's P (eq. 5, batch means of the
   backbone's features) and mean feature (the prototype) classify the test
   images by argmax_k cos(f, P_k f) vs the nearest prototype. The backbone
   is the small CNN, trained centrally for `--table2_epochs` epochs (and,
   for contrast, at its random initialisation).

Results (JSON and markdown, with the command that produced them) are
written after every method. Defaults are sized for about 15 minutes on 2
CPU cores.

Usage:
  TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -m studies.fedd3a_protocol.fedd3a_digits
  # Another server domain:
  ... --domains=mnist,mnist_m,digits --proxy=usps --proxy_size=5000
"""

import os
import statistics
import tempfile
import time
from typing import Optional, Sequence

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from tff_kd.runtime import context  # pylint: disable=g-import-not-at-top
context.install()  # The program opts in to tff_kd's process set-up.
from tff_kd.program import experiment

from absl import app  # pylint: disable=g-bad-import-order
from absl import flags
import numpy as np
import tensorflow as tf

from studies import common
from configs import fedd3a_digits_device
from configs import fedd3a_digits_silo
from tff_kd import data as data_lib
from tff_kd import models
from tff_kd.methods.fedd3a import projection_tf as projection

_MANUAL_DIR = flags.DEFINE_string('manual_dir', fedd3a_digits_silo.SHARED_DATA,
                                  'Raw files (mnist/, usps/, mnist_m/).')
_DATA_DIR = flags.DEFINE_string('data_dir', '~/tensorflow_datasets',
                                'tfds data_dir and decoded caches.')
_DOMAINS = flags.DEFINE_string('domains', 'mnist,usps,mnist_m',
                               'Client domains (one client each).')
_PROXY = flags.DEFINE_string('proxy', 'digits', 'Server (unlabeled) domain.')
_PROXY_SIZE = flags.DEFINE_integer('proxy_size', 1_437, 'Server pool size.')
_TRAIN_LIMIT = flags.DEFINE_integer('train_limit', 5_000,
                                    'Training images per client domain.')
_ROUNDS = flags.DEFINE_integer('rounds', 15, 'Rounds per method.')
_SEEDS = flags.DEFINE_list('seeds', ['0'], 'Seeds; every variant runs each.')
_VAL_SIZE = flags.DEFINE_integer(
    'val_size', 300, 'Labeled images held out of the client domains for the '
    "server's diagnostics (ensemble vs student accuracy); 0: none.")
_STEPS = flags.DEFINE_integer('distill_steps', 100,
                              'Max distillation steps per round.')
_ALPHA = flags.DEFINE_float('fedd3a_alpha', 10.0, 'FedD3A eq. 5 ridge.')
# variant -> (method, config overrides). `_bn_update`: the student trains
# in BatchNorm training mode, the pool's statistics replace the averaged
# model's (FedDF's code; the default keeps them); `fedd3a_aggregated`: eq. 6
# scores with the averaged model's backbone instead of the broadcast one the
# clients built P_k in; `fedd3a_avg`: uniform weights (FedD3A's ablation).
VARIANTS = {
    'fedavg': ('fedavg', {}),
    'fedprox': ('fedprox', {}),
    'feddf': ('feddf', {}),
    'feddf_bn_update': ('feddf', {'distill.student_training': True}),
    'fedd3a': ('fedd3a', {}),
    'fedd3a_avg': ('fedd3a', {'fedd3a.weighting': 'avg'}),
    # Table 1's other strategies: each sample's best-scoring teacher only,
    # and seeded random weights.
    'fedd3a_onehot': ('fedd3a', {'fedd3a.weighting': 'onehot'}),
    'fedd3a_random': ('fedd3a', {'fedd3a.weighting': 'random'}),
    # FedDF's logit average instead of eq. 7's probability average: with avg
    # weights, FedD3A is then FedDF bit for bit
    # (tests/methods/fedd3a/test_fedd3a_vs_feddf.py).
    'fedd3a_avg_logits': ('fedd3a', {'fedd3a.weighting': 'avg',
                                     'fedd3a.ensemble': 'logits'}),
    'fedd3a_logits': ('fedd3a', {'fedd3a.ensemble': 'logits'}),
    'fedd3a_aggregated': ('fedd3a', {'fedd3a.score_backbone': 'aggregated'}),
    'fedd3a_bn_update': ('fedd3a', {'distill.student_training': True}),
    # The labeled guard: keep the student only if its accuracy on the
    # server's labeled images does not drop (needs --val_size > 0).
    'feddf_guard': ('feddf', {'distill.accept': 'no_worse'}),
    'fedd3a_guard': ('fedd3a', {'distill.accept': 'no_worse'}),
}
_METHODS = flags.DEFINE_list('methods', ['fedavg', 'fedprox', 'feddf',
                                         'fedd3a'],
                             f'Variants, in order, from {", ".join(VARIANTS)}.')
_PER_DOMAIN = flags.DEFINE_integer(
    'clients_per_domain', 1, '1: cross-silo; > 1: cross-device, each domain '
    'split by Dir(beta) (configs/fedd3a_digits_device.py).')
_BETA = flags.DEFINE_float('beta', 0.2, 'Cross-device label skew Dir(beta).')
_PER_ROUND = flags.DEFINE_integer(
    'clients_per_round', 0, 'Cross-device clients per round (0: 5, the '
    "paper's; cross-silo always takes every client).")
_TABLE2 = flags.DEFINE_bool('table2', True, 'Run the Table 2 check.')
_T2_EPOCHS = flags.DEFINE_integer('table2_epochs', 2,
                                  'Backbone training epochs (Table 2).')
_T2_TRAIN = flags.DEFINE_integer('table2_train', 20_000,
                                 'MNIST training images (Table 2).')
_T2_ALPHAS = flags.DEFINE_list('table2_alphas', ['1', '10', '100'],
                               'Eq. 5 alphas tried in Table 2.')
_T2_BATCH = flags.DEFINE_integer('table2_batch', 32,
                                 'Batch size of the batch means (Table 2).')
_WEIGHTS = flags.DEFINE_string(
    'model_weights', '', "Every variant's initial weights (`model.weights`): "
    "'' seeded; a weights file; or 'pretrain:fashion_mnist', the CNN "
    'pretrained on Fashion-MNIST (configs/fedd3a_digits_pretrained.py).')
_ROOT = flags.DEFINE_string('root_dir', '', 'Run folders (default: temp).')
_OUT = flags.DEFINE_string('out', 'studies/fedd3a_protocol/results/fedd3a_digits',
                           'Result path prefix (.json and .md).')


def make_config(variant: str, seed: int, *, domains: Sequence[str] = (),
            proxy: str = '', extra: Optional[dict] = None):
  """A variant's config from the flags.

  Args:
    variant: A key of `VARIANTS`.
    seed: The run's seed.
    domains: Client domains (default `--domains`).
    proxy: The server's pool domain (default `--proxy`).
    extra: Overrides applied after the variant's own.

  Returns:
    The validated config.
  """
  method, overrides = VARIANTS[variant]
  if _PER_DOMAIN.value > 1:
    c = fedd3a_digits_device.get_config()
    c.partition.clients_per_domain = _PER_DOMAIN.value
    c.partition.alpha = _BETA.value
  else:
    c = fedd3a_digits_silo.get_config()
  names = list(domains) or [d.strip() for d in _DOMAINS.value.split(',')
                            if d.strip()]
  c.method = method
  c.seed = seed
  c.rounds = _ROUNDS.value
  c.dataset.domains = ','.join(names)
  c.dataset.manual_dir = _MANUAL_DIR.value
  c.dataset.data_dir = _DATA_DIR.value
  c.dataset.train_limit = _TRAIN_LIMIT.value
  c.partition.num_clients = len(names) * _PER_DOMAIN.value
  c.clients_per_round = (len(names) if _PER_DOMAIN.value == 1 else
                         _PER_ROUND.value or 5)
  c.server_data.proxy = proxy or _PROXY.value
  c.server_data.proxy_size = _PROXY_SIZE.value
  c.distill.steps = _STEPS.value
  c.fedd3a.alpha = _ALPHA.value
  c.server_data.val_size = _VAL_SIZE.value
  c.model.weights = os.path.expanduser(_WEIGHTS.value)
  c.checkpoint_every = c.rounds
  c.export = False
  return experiment.with_overrides(experiment.with_overrides(c, overrides),
                                 extra or {})


def mean(values) -> float:
  values = list(values)
  return statistics.fmean(values) if values else float('nan')


def std(values) -> float:
  values = list(values)
  return statistics.stdev(values) if len(values) > 1 else 0.0


def run_variant(variant: str, seed: int, root: str,
                config=None) -> dict:
  """Runs one variant and seed in `root`; its per-round record."""
  config = config or make_config(variant, seed)
  method = config.method
  names = experiment.from_config(config).dataset.domain_names
  t0 = time.perf_counter()
  run = experiment.run(config, os.path.join(root, f'{variant}_s{seed}'),
                       progress=False)
  h = run.history
  times = [x['time/train_s'] for x in h]
  entry = dict(
      seed=seed,
      accuracy=[x['test/accuracy'] for x in h],
      domain_accuracy={n: [x[f'test/accuracy_{n}'] for x in h]
                       for n in names},
      train_loss=[x['train/loss'] for x in h],
      final_accuracy=run.final['test/accuracy'],
      seconds_per_round=mean(times[1:] or times),  # Round 1 compiles.
      first_round_seconds=times[0],
      wall_seconds=time.perf_counter() - t0)
  if method in ('feddf', 'fedd3a'):
    entry['distill_steps'] = [x['distill/steps'] for x in h]
    for key in ('ensemble_labeled_accuracy', 'ensemble_accuracy',
                'uniform_accuracy', 'labeled_accuracy_before',
                'labeled_accuracy_after'):
      if f'distill/{key}' in h[-1]:
        entry[key] = [x[f'distill/{key}'] for x in h]
  if method == 'fedd3a':
    entry['client_weight'] = {
        n: [x[f'distill/client_weight_{k}'] for x in h]
        for k, n in enumerate(names)}
    entry['weight_entropy'] = [x['distill/weight_entropy'] for x in h]
  return entry


def summarize(runs: dict) -> dict:
  """Per variant, mean +- std over seeds (runs: variant -> seed -> entry)."""
  out = {}
  for variant, by_seed in runs.items():
    rs = [by_seed[k] for k in sorted(by_seed)]
    finals = [r['final_accuracy'] for r in rs]
    last5 = [mean(r['accuracy'][-5:]) for r in rs]
    row = dict(seeds=sorted(by_seed), finals=finals, final_mean=mean(finals),
               final_std=std(finals), last5_mean=mean(last5),
               last5_std=std(last5),
               domain_final={d: mean(r['domain_accuracy'][d][-1]
                                      for r in rs)
                             for d in rs[0]['domain_accuracy']},
               seconds_per_round=mean(r['seconds_per_round'] for r in rs),
               curve=[mean(r['accuracy'][i] for r in rs)
                      for i in range(min(len(r['accuracy']) for r in rs))])
    for key in ('ensemble_accuracy', 'uniform_accuracy',
                'labeled_accuracy_before', 'labeled_accuracy_after',
                'ensemble_labeled_accuracy', 'ensemble_val_accuracy',
                'val_accuracy_before', 'val_accuracy_after'):
      if key in rs[0]:
        row[key] = mean(mean(r[key]) for r in rs)
    if 'client_weight' in rs[0]:
      row['client_weight'] = {d: mean(mean(r['client_weight'][d])
                                       for r in rs)
                              for d in rs[0]['client_weight']}
    out[variant] = row
  return out


def _table2(seed: int) -> dict:
  """Projection vs prototype classification, one client per MNIST class."""
  ds = data_lib.load_dataset('mnist', data_dir=_DATA_DIR.value,
                             manual_dir=_MANUAL_DIR.value,
                             train_limit=_T2_TRAIN.value)
  tf.keras.utils.set_random_seed(seed)
  clf = models.build_classifier('cnn', input_shape=ds.x_train.shape[1:],
                                num_classes=10, seed=seed)
  clf.model.compile(
      tf.keras.optimizers.SGD(0.05),
      tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  rng = np.random.default_rng(seed)
  out = {}
  for epochs in (0, _T2_EPOCHS.value):
    if epochs:
      clf.model.fit(ds.x_train, ds.y_train, batch_size=32, epochs=epochs,
                    verbose=0, shuffle=True)
    train_f = clf.features.predict(ds.x_train, batch_size=1000, verbose=0)
    test_f = clf.features.predict(ds.x_test, batch_size=1000, verbose=0)
    protos, means = [], []
    for c in range(10):
      f = train_f[rng.permutation(np.flatnonzero(ds.y_train == c))]
      protos.append(f.mean(0))
      means.append(projection.batch_mean_features(f, _T2_BATCH.value))
    proto_pred = projection.classify_by_prototype(test_f, np.stack(protos))
    row = dict(prototype=float(np.mean(proto_pred.numpy() == ds.y_test)))
    for a in _T2_ALPHAS.value:
      ps = tf.stack([projection.recursive_projection(m, float(a))
                     for m in means])
      pred = projection.classify_by_projection(test_f, ps)
      row[f'projection_alpha_{a}'] = float(np.mean(pred.numpy() == ds.y_test))
    out[f'epochs_{epochs}'] = row
  return out


def _markdown(result: dict) -> str:
  s = result['setting']
  methods = result['methods']
  lines = [
      '# FedAvg / FedProx / FedDF / FedD3A on digit domains',
      '',
      (f"Clients: {s['domains']} (one client per domain, "
       f"{s['train_limit']} training images each, all {s['rounds']} rounds "
       f"with every client)"
       if s.get('clients_per_domain', 1) == 1 else
       f"Clients: {s['domains']}, each domain's first {s['train_limit']} "
       f"training images split over {s['clients_per_domain']} clients by "
       f"Dir({s['beta']}) (cross-device), {s['clients_per_round']} clients "
       f"per round, {s['rounds']} rounds") +
      f"; server pool: {s['proxy_size']} unlabeled "
      f"`{s['proxy']}` images; 32x32x3; CNN; 1 local epoch (SGD lr "
      f"{s['client_lr']}, momentum {s['momentum']}, batch {s['batch_size']})"
      f"; FedProx mu {s['mu']}; FedDF/FedD3A <= {s['distill_steps']} Adam "
      f"steps of batch {s['distill_batch']}; FedD3A alpha {s['alpha']}, "
      f"weighting {s['weighting']}; seeds {s['seed']}; "
      f"{s.get('val_size', 0)} labeled images held out of the client "
      'domains for the server\'s diagnostics. Accuracy: the global '
      'model on each client domain\'s test set, mean over domains.',
      '',
      f"Command: `{result['command']}`. Machine: {result['machine']}. "
      f"Wall time so far {result['total_seconds']:.0f} s.",
      '',
  ]
  if methods:
    summary = summarize(methods)
    domains = s['domains'].split(',')
    lines += ['| variant | seeds | final mean acc (mean ± std) | last-5 mean '
              '| ' + ' | '.join(f'final {d}' for d in domains) +
              ' | s/round |', '|---' * (5 + len(domains)) + '|']
    for name, r in summary.items():
      lines.append(
          f"| {name} | {','.join(map(str, r['seeds']))} | "
          f"{100 * r['final_mean']:.2f} ± {100 * r['final_std']:.2f} "
          f"({', '.join(f'{f:.4f}' for f in r['finals'])}) | "
          f"{100 * r['last5_mean']:.2f} ± {100 * r['last5_std']:.2f} | " +
          ' | '.join(f"{r['domain_final'][d]:.4f}" for d in domains) +
          f" | {r['seconds_per_round']:.1f} |")
    diag = [(n, r) for n, r in summary.items()
            if 'labeled_accuracy_after' in r or 'val_accuracy_after' in r]
    if diag:
      lines += ['', '## Server diagnostics on the labeled held-out client '
                'images (mean over rounds and seeds)', '',
                '| variant | ensemble (its weights) | uniform ensemble | '
                'student before | student after |', '|---|---|---|---|---|']
      for n, r in diag:
        # FedDF's own ensemble is the uniform one (older runs: *_val_*).
        feddf = r.get('ensemble_labeled_accuracy',
                      r.get('ensemble_val_accuracy'))
        ens = r.get('ensemble_accuracy', feddf)
        uni = r.get('uniform_accuracy', feddf)
        before = r.get('labeled_accuracy_before', r.get('val_accuracy_before'))
        after = r.get('labeled_accuracy_after', r.get('val_accuracy_after'))
        lines.append(f'| {n} | {ens:.4f} | {uni:.4f} | {before:.4f} | '
                     f'{after:.4f} |')
    for n, r in summary.items():
      if 'client_weight' in r:
        lines += ['', f'{n}: mean teacher weight of each client on the pool '
                  '(mean over rounds and seeds): ' + ', '.join(
                      f'{d} {v:.3f}' for d, v in r['client_weight'].items()) +
                  '.']
    lines += ['', '## Mean client-domain test accuracy per round (over '
              'seeds)', '', '| round | ' + ' | '.join(summary) + ' |',
              '|---' * (1 + len(summary)) + '|']
    for i in range(s['rounds']):
      row = [f"{r['curve'][i]:.4f}" if i < len(r['curve']) else ''
             for r in summary.values()]
      lines.append(f'| {i + 1} | ' + ' | '.join(row) + ' |')
  if result.get('table2'):
    t2 = result['table2']
    lines += ['', '## Table 2 check: MNIST, one client per class', '',
              f"CNN backbone; P from batch means (batch {s['table2_batch']})"
              f" of each class's {s['table2_train']}-image share; test: all "
              '10,000 MNIST test images. Paper (3-layer MLP): prototype '
              '0.693, projection 0.907.', '',
              '| backbone | prototype | ' + ' | '.join(
                  f'projection a={a}' for a in s['table2_alphas']) + ' |',
              '|---' * (2 + len(s['table2_alphas'])) + '|']
    for key, row in t2.items():
      lines.append(f'| {key.replace("_", " ")} | {row["prototype"]:.4f} | ' +
                   ' | '.join(f"{row[f'projection_alpha_{a}']:.4f}"
                              for a in s['table2_alphas']) + ' |')
  return '\n'.join(lines) + '\n'


def _histories(methods: dict) -> dict[str, list[dict]]:
  """variant -> per-seed histories (metrics.csv keys) for the figure."""
  keys = {'ensemble_accuracy': 'distill/ensemble_accuracy',
          'uniform_accuracy': 'distill/uniform_accuracy',
          'weight_entropy': 'distill/weight_entropy'}
  return {variant: [dict({'test/accuracy': r['accuracy'],
                          'train/loss': r['train_loss']},
                         **{keys[k]: r[k] for k in keys if k in r})
                    for _, r in sorted(by_seed.items())]
          for variant, by_seed in methods.items()}


def _write(result: dict) -> None:
  common.write_result(_OUT.value, result, _markdown)
  if result['methods']:
    experiment.plot_histories(_histories(result['methods']), _OUT.value + '.png',
                         title='mean client-domain accuracy, mean ± std '
                         'over seeds')


def main(argv):
  del argv
  context.set_local_context()
  unknown = [v for v in _METHODS.value if v not in VARIANTS]
  if unknown:
    raise app.UsageError(f'unknown variants {unknown}; choose from '
                         f'{", ".join(VARIANTS)}')
  root = _ROOT.value or tempfile.mkdtemp(prefix='fedd3a_bench_')
  seeds = [int(v) for v in _SEEDS.value]
  base = make_config('fedd3a', seeds[0])
  result = dict(
      command=common.command('fedd3a_protocol.fedd3a_digits'),
      setting=dict(
          domains=base.dataset.domains, proxy=base.server_data.proxy,
          proxy_size=base.server_data.proxy_size,
          train_limit=base.dataset.train_limit, rounds=base.rounds,
          seed=','.join(map(str, seeds)), val_size=_VAL_SIZE.value,
          client_lr=base.client_optimizer.learning_rate,
          momentum=base.client_optimizer.momentum,
          batch_size=base.local.batch_size, mu=base.fedprox.mu,
          distill_steps=base.distill.steps,
          distill_batch=experiment.from_config(base).distill.batch_size,
          alpha=base.fedd3a.alpha,
          weighting=base.fedd3a.weighting,
          clients_per_domain=base.partition.clients_per_domain,
          beta=base.partition.alpha, clients_per_round=base.clients_per_round,
          table2_epochs=_T2_EPOCHS.value, table2_train=_T2_TRAIN.value,
          table2_batch=_T2_BATCH.value, table2_alphas=_T2_ALPHAS.value),
      machine=common.machine(),
      methods={}, table2={})
  t_start = time.perf_counter()
  try:
    if _TABLE2.value:
      result['table2'] = _table2(seeds[0])
      result['total_seconds'] = time.perf_counter() - t_start
      _write(result)
      print('table 2:', result['table2'], flush=True)
    for seed in seeds:
      for variant in _METHODS.value:
        entry = run_variant(variant, seed, root)
        result['methods'].setdefault(variant, {})[seed] = entry
        result['total_seconds'] = time.perf_counter() - t_start
        _write(result)
        print(f'{variant} seed {seed}: final {entry["final_accuracy"]:.4f}, '
              f'{entry["seconds_per_round"]:.1f} s/round', flush=True)
  finally:
    context.shutdown()


if __name__ == '__main__':
  app.run(main)
