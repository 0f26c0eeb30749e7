r"""FedDF vs FedAvg on MNIST with client drift, in one script run.

FedDF: Lin et al., "Ensemble Distillation for Robust Model Fusion in
Federated Learning", NeurIPS 2020. Setting (the issue's "done" criterion):
MNIST, 20 clients, 8 per round, Dir(alpha) label skew (default 0.1), the
small CNN, 30 rounds, the same seed, client sample, client data and local
work for both methods. Long local work (default 10 epochs, SGD lr 0.05,
batch 32) makes the clients drift apart, which is where FedAvg's average
suffers and FedDF's ensemble distillation is meant to help; with short local
work every method ties.

Both runs hold the same server slices out of MNIST-train before
partitioning (`configs/feddf_mnist.py`): an unlabeled proxy pool
(`--proxy=split`, 10,000 images; same-domain, the easy case for FedDF) or
another dataset's images (`--proxy=fashion_mnist`, harder), and 500 labeled
images for drop-worst. FedAvg ignores them, so it trains on exactly the
clients FedDF trains on.

Reported (JSON and markdown under studies/feddf_vs_fedavg/results/): both test-accuracy
curves, final accuracies, wall seconds per round (`process.next`) per
method, and FedDF's server distillation throughput in samples/s on this
CPU (optimiser steps x batch / wall time of the distillation loops).

Usage:
  TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -m studies.feddf_vs_fedavg.feddf_vs_fedavg \
      --manual_dir=../shared/data/mnist --rounds=30
"""

import os
import statistics
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from tff_kd.runtime import context  # pylint: disable=g-import-not-at-top
context.install()  # The program opts in to tff_kd's process set-up.
from tff_kd.program import experiment

from absl import app  # pylint: disable=g-bad-import-order
from absl import flags

from studies import common
from configs import feddf_mnist

_MANUAL_DIR = flags.DEFINE_string('manual_dir', '../shared/data',
                                  'Raw IDX files (mnist/, fashion_mnist/).')
_DATA_DIR = flags.DEFINE_string('data_dir', '~/tensorflow_datasets',
                                'tfds data_dir.')
_ROUNDS = flags.DEFINE_integer('rounds', 30, 'Rounds per method.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of both runs.')
_ALPHA = flags.DEFINE_float('alpha', 0.1, 'Dirichlet label skew.')
_EPOCHS = flags.DEFINE_integer('local_epochs', 10, 'Local epochs per round.')
_PROXY = flags.DEFINE_string('proxy', 'split',
                             "'split' (unlabeled MNIST-train slice) or a "
                             'dataset name, e.g. fashion_mnist.')
_PROXY_SIZE = flags.DEFINE_integer('proxy_size', 10_000, 'Proxy pool size.')
_STEPS = flags.DEFINE_integer('distill_steps', 200,
                              'Max distillation steps per round.')
_DROP_WORST = flags.DEFINE_bool('drop_worst', True, 'FedDF drop-worst.')
_METHODS = flags.DEFINE_list('methods', ['fedavg', 'feddf'],
                             'Methods to run, in order.')
_ROOT = flags.DEFINE_string('root_dir', '', 'Run folders (default: temp).')
_OUT = flags.DEFINE_string('out', 'studies/feddf_vs_fedavg/results/feddf_vs_fedavg',
                           'Result path prefix (.json and .md).')
_OVERRIDES = common.define_overrides_flag()


def _config(method: str):
  c = feddf_mnist.get_config()
  c.method = method
  c.seed = _SEED.value
  c.rounds = _ROUNDS.value
  c.dataset.manual_dir = _MANUAL_DIR.value
  c.dataset.data_dir = _DATA_DIR.value
  c.partition.alpha = _ALPHA.value
  c.local.amount = _EPOCHS.value
  c.server_data.proxy = _PROXY.value
  c.server_data.proxy_size = _PROXY_SIZE.value
  c.distill.steps = _STEPS.value
  c.feddf.drop_worst = _DROP_WORST.value
  c.checkpoint_every = c.rounds  # Only the final state; not timed here.
  c.export = False
  common.apply_overrides(c, _OVERRIDES.value)
  return c


def _mean(values: list) -> float:
  return statistics.fmean(values) if values else float('nan')


def _markdown(result: dict) -> str:
  s = result['setting']
  lines = [
      '# FedDF vs FedAvg on MNIST (one run of studies/feddf_vs_fedavg/feddf_vs_fedavg.py)',
      '',
      f"MNIST, {s['num_clients']} clients, {s['clients_per_round']} per "
      f"round, Dir({s['alpha']}), CNN ({s['model']}), {s['local_epochs']} "
      f"local epochs (SGD lr {s['client_lr']}, batch {s['batch_size']}), "
      f"{s['rounds']} rounds, seed {s['seed']}. Proxy: {s['proxy']} "
      f"({s['proxy_size']} unlabeled images); {s['val_size']} labeled "
      f"validation images; FedDF: AVGLOGITS, drop-worst={s['drop_worst']}, "
      f"<= {s['distill_steps']} Adam steps of batch {s['distill_batch']} "
      'per round. Both methods train the same clients on the same data.',
      '',
      f"Command: `{result['command']}`. Machine: {result['machine']}. "
      f"Total wall time {result['total_seconds']:.0f} s.",
      '',
      '| method | final test acc | mean of last 5 rounds | best | '
      's/round (process.next) |',
      '|---|---|---|---|---|',
  ]
  for name, r in result['methods'].items():
    lines.append(f"| {name} | {r['final_accuracy']:.4f} | "
                 f"{_mean(r['accuracy'][-5:]):.4f} | "
                 f"{max(r['accuracy']):.4f} | {r['seconds_per_round']:.1f} |")
  if {'fedavg', 'feddf'} <= set(result['methods']):
    a = result['methods']['fedavg']['accuracy']
    d = result['methods']['feddf']['accuracy']
    ahead = sum(x > y for x, y in zip(d, a))
    lines += ['', f'FedDF is ahead of FedAvg after {ahead} of {len(a)} '
              'rounds.']
  if 'feddf' in result['methods']:
    d = result['methods']['feddf']
    lines += [
        '',
        f"FedDF server distillation on CPU: {d['distill_samples_per_s']:.0f} "
        f"samples/s (mean over rounds), {d['distill_seconds_per_round']:.2f} "
        f"s distillation + {d['teacher_seconds_per_round']:.2f} s teacher "
        f"inference per round, {d['mean_distill_steps']:.0f} steps per round "
        f"on average; teachers kept by drop-worst: "
        f"{d['mean_teachers_kept']:.2f} of {s['clients_per_round']}.",
    ]
  lines += ['', '## Test accuracy per round', '',
            '| round | ' + ' | '.join(result['methods']) + ' |',
            '|---' * (1 + len(result['methods'])) + '|']
  for i in range(s['rounds']):
    row = [f"{r['accuracy'][i]:.4f}" for r in result['methods'].values()]
    lines.append(f'| {i + 1} | ' + ' | '.join(row) + ' |')
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  context.set_local_context()
  root = _ROOT.value or tempfile.mkdtemp(prefix='feddf_bench_')
  base = _config('feddf')
  result = dict(
      command=common.command('feddf_vs_fedavg.feddf_vs_fedavg'),
      setting=dict(
          rounds=base.rounds, seed=base.seed, alpha=base.partition.alpha,
          num_clients=base.partition.num_clients,
          clients_per_round=base.clients_per_round, model=base.model.name,
          local_epochs=base.local.amount, batch_size=base.local.batch_size,
          client_lr=base.client_optimizer.learning_rate,
          proxy=base.server_data.proxy,
          proxy_size=base.server_data.proxy_size,
          val_size=base.server_data.val_size,
          drop_worst=base.feddf.drop_worst,
          distill_steps=base.distill.steps,
          distill_batch=base.distill.batch_size),
      machine=common.machine(),
      methods={})
  t_start = time.perf_counter()
  for method in _METHODS.value:
    t0 = time.perf_counter()
    run = experiment.run(_config(method), os.path.join(root, method),
                         progress=False)
    h = run.history
    times = [x['time/train_s'] for x in h]
    entry = dict(
        accuracy=[x['test/accuracy'] for x in h],
        train_loss=[x['train/loss'] for x in h],
        final_accuracy=run.final['test/accuracy'],
        seconds_per_round=_mean(times[1:] or times),  # Round 1 compiles.
        first_round_seconds=times[0],
        wall_seconds=time.perf_counter() - t0)
    if method == 'feddf':
      entry.update(
          distill_samples_per_s=_mean(
              [x['distill/samples_per_second'] for x in h]),
          distill_seconds_per_round=_mean(
              [x['distill/distill_seconds'] for x in h]),
          teacher_seconds_per_round=_mean(
              [x['distill/teacher_seconds'] for x in h]),
          mean_distill_steps=_mean([x['distill/steps'] for x in h]),
          mean_teachers_kept=_mean([x['distill/teachers_kept'] for x in h]),
          ensemble_val_accuracy=[x['distill/ensemble_labeled_accuracy']
                                 for x in h],
          student_val_before=[x['distill/labeled_accuracy_before']
                              for x in h],
          student_val_after=[x['distill/labeled_accuracy_after'] for x in h])
    result['methods'][method] = entry
    print(f'{method}: final {entry["final_accuracy"]:.4f}, '
          f'{entry["seconds_per_round"]:.1f} s/round', flush=True)
  result['total_seconds'] = time.perf_counter() - t_start
  print(common.write_result(_OUT.value, result, _markdown))


if __name__ == '__main__':
  app.run(main)
