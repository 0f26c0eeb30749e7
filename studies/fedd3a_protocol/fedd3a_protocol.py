r"""FedD3A's cross-silo protocol and weighting table on four digit domains.

FedD3A: Su, Li, Xue, "Domain Discrepancy Aware Distillation for Model
Aggregation in Federated Learning", AAAI 2023.

1. Figure 3's protocol (Sec. 4, cross-silo): each domain of `--all_domains`
   (MNIST, USPS, MNIST-M and scikit-learn's 8x8 digits) in turn is the
   server's unlabeled pool and the other three are the clients, one client
   each. 1 local epoch per round, every client every round; FedDF and FedD3A
   distil about `--pool_epochs` passes over the pool per round (the paper's
   "one epoch"). Reported per server domain and as the mean over server
   domains: the global model's final accuracy, averaged over the client
   domains' test sets (the paper's "average performance on all clients").
2. Table 1's protocol (`--table1`): one round of `--table1_epochs` local
   epochs, then the server's aggregation with each weighting strategy
   (avg, random, onehot, soft = eq. 6), against a ceiling: the same model
   trained centrally, with the clients' optimiser, on the union of the
   client domains for the same number of epochs.

Both start from `--model_weights` (e.g. `studies/fedd3a_protocol/pretrain.py`'s
Fashion-MNIST CNN) or from the seeded initialisation. Every other setting
(data, clients' optimiser, FedProx's mu, alpha, the labeled held-out client
images of the server's diagnostics) is `studies/fedd3a_protocol/fedd3a_digits.py`'s, from
the same flags (`--seeds`, `--rounds`, `--train_limit`, `--proxy_size`,
`--val_size`, `--fedd3a_alpha`, `--model_weights`, `--methods`, `--out`,
`--root_dir`, `--manual_dir`, `--data_dir`). Nothing is tuned on the test
sets: alpha and the distillation settings are fedd3a_digits' defaults.

Results (JSON and markdown with the command) are rewritten after every run,
so a stopped run keeps what it finished.

Usage:
  TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -m studies.fedd3a_protocol.fedd3a_protocol \
    --rounds=30 --seeds=0 --train_limit=2000 \
    --methods=fedavg,fedprox,feddf,fedd3a,fedd3a_onehot,fedd3a_avg,fedd3a_random
  # Table 1, pretrained:
  ... --table1 --model_weights=~/tensorflow_datasets/tff_kd_pretrained/cnn_batch_32x32x3_fashion_mnist_seed0.weights.h5
"""

import json
import math
import os
import sys
import tempfile
import time
from typing import NoReturn

from studies import common
from studies.fedd3a_protocol import fedd3a_digits as digits  # Defines the shared flags.
from tff_kd.runtime import context

from absl import app  # pylint: disable=g-bad-import-order
from absl import flags
import numpy as np
import tensorflow as tf

from tff_kd import data as data_lib
from tff_kd import models
from tff_kd.models import pretrained
from tff_kd.program import experiment

_ALL = flags.DEFINE_list('all_domains', ['mnist', 'usps', 'mnist_m', 'digits'],
                         'The domains; each in turn is the server pool.')
_SERVERS = flags.DEFINE_list('server_domains', [],
                             'Server domains to run (default: all).')
_POOL_EPOCHS = flags.DEFINE_float(
    'pool_epochs', 1.0, 'Distillation passes over the pool per round.')
_TABLE1 = flags.DEFINE_bool('table1', False,
                            "Table 1's protocol instead of Figure 3's.")
_T1_EPOCHS = flags.DEFINE_integer('table1_epochs', 50,
                                  "Table 1's local epochs (one round).")

TABLE1_VARIANTS = ('fedd3a_avg', 'fedd3a_random', 'fedd3a_onehot', 'fedd3a')


def _distill_steps(pool_size: int) -> int:
  """Steps for `--pool_epochs` passes over the pool's training part."""
  # The resolved settings: the config leaves the method's defaults unset.
  distill = experiment.from_config(digits.make_config('fedd3a', 0)).distill
  train = pool_size * (1.0 - distill.val_fraction)
  return max(1, math.ceil(_POOL_EPOCHS.value * train / distill.batch_size))


def _server_config(variant: str, seed: int, server: str):
  """The config of `variant` with `server`'s pool and the others' clients."""
  clients = [d for d in _ALL.value if d != server]
  extra = {'distill.steps': _distill_steps(digits._PROXY_SIZE.value)}  # pylint: disable=protected-access
  if _TABLE1.value:
    extra.update({'rounds': 1, 'local.amount': _T1_EPOCHS.value,
                  'checkpoint_every': 1})
  return digits.make_config(variant, seed, domains=clients, proxy=server,
                            extra=extra)


def _ceiling(seed: int, server: str) -> dict:
  """Central training on the union of the client domains (Table 1)."""
  c = _server_config('fedavg', seed, server)
  shape = tuple(int(v) for v in c.dataset.image_shape.split(','))
  ds = data_lib.load_domains(c.dataset.domains.split(','), shape,
                             data_dir=c.dataset.data_dir,
                             manual_dir=c.dataset.manual_dir,
                             train_limit=c.dataset.train_limit)
  tf.keras.utils.set_random_seed(seed)
  clf = models.build_classifier(c.model.name, input_shape=shape,
                                num_classes=ds.num_classes, seed=seed,
                                norm=c.model.norm)
  if c.model.weights:
    pretrained.load_weights(clf.model, c.model.weights, 'model.weights')
  clf.model.compile(
      tf.keras.optimizers.SGD(c.client_optimizer.learning_rate,
                              momentum=c.client_optimizer.momentum),
      tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=['accuracy'])
  t0 = time.perf_counter()
  clf.model.fit(ds.x_train, ds.y_train, batch_size=c.local.batch_size,
                epochs=c.local.amount, shuffle=True, verbose=0)
  pred = np.argmax(clf.model.predict(ds.x_test, batch_size=1000, verbose=0),
                   -1)
  per_domain = {n: float(np.mean(pred[ds.test_domains == i] ==
                                 ds.y_test[ds.test_domains == i]))
                for i, n in enumerate(ds.domain_names)}
  return dict(seed=seed, final_accuracy=digits.mean(per_domain.values()),
              domain_accuracy={n: [a] for n, a in per_domain.items()},
              accuracy=[digits.mean(per_domain.values())],
              wall_seconds=time.perf_counter() - t0)


def _cell(by_seed: dict) -> str:
  finals = [by_seed[k]['final_accuracy'] for k in sorted(by_seed)]
  return (f'{100 * digits.mean(finals):.2f} ± {100 * digits.std(finals):.2f}'
          f' (n={len(finals)})')


def _markdown(result: dict) -> str:
  s = result['setting']
  runs = result['runs']
  servers = [d for d in s['all_domains'] if d in runs]
  variants = list(dict.fromkeys(v for d in servers for v in runs[d]))
  title = ("Table 1's protocol: one round of "
           f"{s['table1_epochs']} local epochs" if s['table1'] else
           f"Figure 3's protocol: {s['rounds']} rounds of 1 local epoch")
  lines = [
      f'# FedD3A on four digit domains, {title}', '',
      f"Each of {', '.join(s['all_domains'])} in turn is the server's "
      f"unlabeled pool ({s['proxy_size']} images); the other three are the "
      f"clients (one each, the first {s['train_limit']} training images of "
      f"the domain, {s['val_size']} of them held out as the server's labeled "
      f"diagnostics). Start: {s['start']}. CNN with BatchNorm, 32x32x3, SGD "
      f"lr {s['client_lr']} momentum {s['momentum']} batch {s['batch_size']}; "
      f"FedProx mu {s['mu']}; distillation {s['distill_steps']} Adam steps "
      f"of batch {s['distill_batch']} (about {s['pool_epochs']} pass over "
      f"the pool); FedD3A alpha {s['alpha']}. Accuracy: the final global "
      "model on each client domain's test set, mean over the client domains;"
      ' mean ± std over seeds.', '',
      'Commands: ' + '; '.join(f'`{c}`' for c in result['commands']) +
      f". Machine: {result['machine']}. "
      f"Wall time so far {result['total_seconds']:.0f} s.", '',
      '| variant | ' + ' | '.join(f'server {d}' for d in servers) +
      ' | mean over server domains | the same per seed |',
      '|---' * (3 + len(servers)) + '|']
  for v in variants:
    cells = [_cell(runs[d][v]) if v in runs[d] else '' for d in servers]
    done = [d for d in servers if v in runs[d]]
    overall = digits.mean(
        digits.mean(e['final_accuracy'] for e in runs[d][v].values())
        for d in done)
    # Seeds that every server domain ran: the mean over domains per seed.
    seeds = sorted(set.intersection(*(set(runs[d][v]) for d in done)))
    per_seed = ', '.join(
        f"s{k} {100 * digits.mean(runs[d][v][k]['final_accuracy'] for d in done):.2f}"
        for k in seeds)
    lines.append(f'| {v} | ' + ' | '.join(cells) +
                 f' | {100 * overall:.2f} ({len(done)} domains) | '
                 f'{per_seed} |')
  diag = []
  for d in servers:
    summary = digits.summarize({v: r for v, r in runs[d].items()
                                if v != 'ceiling'})
    for v, r in summary.items():
      if 'labeled_accuracy_after' in r or 'val_accuracy_after' in r:
        # FedDF's own ensemble is the uniform one (older runs: *_val_*).
        feddf = r.get('ensemble_labeled_accuracy',
                      r.get('ensemble_val_accuracy'))
        ens = r.get('ensemble_accuracy', feddf)
        uni = r.get('uniform_accuracy', feddf)
        before = r.get('labeled_accuracy_before', r.get('val_accuracy_before'))
        after = r.get('labeled_accuracy_after', r.get('val_accuracy_after'))
        weights = ', '.join(f'{c} {w:.3f}'
                            for c, w in r.get('client_weight', {}).items())
        diag.append(f'| {d} | {v} | {weights} | {ens:.4f} | {uni:.4f} | '
                    f'{before:.4f} | {after:.4f} |')
  if diag:
    lines += ['', '## Links: the weights, the ensembles and the student (on '
              'the labeled held-out client images; mean over rounds and '
              'seeds)', '',
              '| server | variant | mean teacher weight per client | '
              'ensemble (its weights) | uniform ensemble | student before | '
              'student after |', '|---' * 7 + '|'] + diag
  return '\n'.join(lines) + '\n'


def _write(result: dict) -> None:
  common.write_result(digits._OUT.value, result, _markdown)  # pylint: disable=protected-access


def _fail(message: str) -> NoReturn:
  """One line on stderr and a non-zero exit, before any run starts."""
  sys.exit(f'fedd3a_protocol: error: {message}')


def _previous(setting: dict) -> dict | None:
  """The record an earlier invocation left at `--out`, if any.

  Its runs are kept and skipped, so seeds, server domains and variants can
  be added by later invocations (or a stopped one continued). A record with
  other settings is refused in one line.
  """
  path = digits._OUT.value + '.json'  # pylint: disable=protected-access
  if not os.path.exists(path):
    return None
  with open(path) as f:
    result = json.load(f)
  if result.get('setting') != json.loads(json.dumps(setting)):
    _fail(f'{path} holds runs with other settings; choose another --out')
  result['runs'] = {server: {variant: {int(k): e for k, e in by_seed.items()}
                             for variant, by_seed in by_variant.items()}
                    for server, by_variant in result['runs'].items()}
  return result


def main(argv):
  del argv
  variants = (['ceiling', *TABLE1_VARIANTS] if _TABLE1.value else
              digits._METHODS.value)  # pylint: disable=protected-access
  unknown = [v for v in variants
             if v not in digits.VARIANTS and v != 'ceiling']
  if unknown:
    _fail(f'unknown variants {unknown}; choose from '
          f'{", ".join(digits.VARIANTS)}')
  servers = _SERVERS.value or _ALL.value
  if set(servers) - set(_ALL.value):
    _fail(f'--server_domains {servers} not all in --all_domains '
          f'{_ALL.value}')
  root = digits._ROOT.value or tempfile.mkdtemp(prefix='fedd3a_protocol_')  # pylint: disable=protected-access
  seeds = [int(v) for v in digits._SEEDS.value]  # pylint: disable=protected-access
  base = _server_config('fedd3a', seeds[0], servers[0])
  setting = dict(
      all_domains=_ALL.value, proxy_size=base.server_data.proxy_size,
      train_limit=base.dataset.train_limit, rounds=base.rounds,
      table1=_TABLE1.value, table1_epochs=_T1_EPOCHS.value,
      val_size=base.server_data.val_size,
      start=(f'weights {base.model.weights}' if base.model.weights
             else 'seeded initialisation'),
      client_lr=base.client_optimizer.learning_rate,
      momentum=base.client_optimizer.momentum,
      batch_size=base.local.batch_size, mu=base.fedprox.mu,
      distill_steps=base.distill.steps,
      distill_batch=experiment.from_config(base).distill.batch_size,
      pool_epochs=_POOL_EPOCHS.value, alpha=base.fedd3a.alpha)
  result = _previous(setting) or dict(
      commands=[], setting=setting,
      machine=common.machine(),
      runs={}, total_seconds=0.0)
  result['commands'].append(common.command('fedd3a_protocol.fedd3a_protocol'))
  context.set_local_context()
  done_before = result['total_seconds']
  t_start = time.perf_counter()
  try:
    for seed in seeds:
      for server in servers:
        for variant in variants:
          if seed in result['runs'].get(server, {}).get(variant, {}):
            continue  # Done by an earlier invocation with this --out.
          if variant == 'ceiling':
            entry = _ceiling(seed, server)
          else:
            entry = digits.run_variant(
                variant, seed, os.path.join(root, f'server_{server}'),
                _server_config(variant, seed, server))
          result['runs'].setdefault(server, {}).setdefault(
              variant, {})[seed] = entry
          result['total_seconds'] = (done_before + time.perf_counter() -
                                     t_start)
          _write(result)
          print(f'server {server}, {variant}, seed {seed}: final '
                f"{entry['final_accuracy']:.4f}", flush=True)
  finally:
    context.shutdown()


if __name__ == '__main__':
  app.run(main)
