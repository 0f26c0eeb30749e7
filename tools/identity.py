r"""Fingerprints of short runs of every method configuration, to diff.

A refactor that must not change any number is checked by running this
before and after it and comparing the two files: each case (a method and
its variants, e.g. DaFKD's ablations, heterogeneous FedDF and FedD3A, the
driver-side server step) trains 2 rounds of `train`'s program on
scikit-learn's bundled digits (6 clients, 3 per round) and records every
logged per-round metric except the timings (`time/*`, `*seconds*`) and a
SHA-256 of every leaf of the final process state (global weights and each
method's own state: generators, optimiser states, per-client stores).

Usage:
  .venv/bin/python -m tools.identity --out=/tmp/before.json
  (change the code)
  .venv/bin/python -m tools.identity --out=/tmp/after.json
  .venv/bin/python -m tools.identity --compare=/tmp/before.json,/tmp/after.json

`--cases=a,b` runs a subset; `--overrides=key=value,...` changes every
case (e.g. a runtime setting, to see what it changes). The comparison
prints each case as identical, or the metrics and state leaves that differ
(with the largest metric difference), and exits 1 if any case differs.
"""

import hashlib
import json
import os
import sys
import tempfile
from typing import Any, Sequence

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import numpy as np
import tensorflow as tf

from configs import digits
from tff_kd.runtime import context
context.install()  # The program opts in to tff_kd's process set-up.
from tff_kd.program import experiment
from tff_kd.program import settings

_OUT = flags.DEFINE_string('out', '', 'JSON file to write the fingerprints to.')
_CASES = flags.DEFINE_list('cases', [], 'Cases to run (default: all).')
_COMPARE = flags.DEFINE_list('compare', [],
                             'Two fingerprint files to compare: BEFORE,AFTER.')
_OVERRIDES = flags.DEFINE_list(
    'overrides', [], 'key=value config overrides for every case (e.g. '
    'runtime.concurrent_clients=1, to see what a runtime setting changes).')

_SERVER = {'server_data.proxy': 'split', 'server_data.proxy_size': 100,
           'server_data.val_size': 60, 'distill.steps': 6,
           'distill.batch_size': 32, 'distill.eval_every': 3,
           'distill.val_fraction': 0.2}
# DaFKD's cases pin the paper's preset (the class defaults), which was the
# default before `dafkd.variant`.
_DAFKD = {'method': 'dafkd', 'dafkd.variant': 'paper', 'dafkd.pool_size': 32,
          'dafkd.noise_dim': 8, 'dafkd.generator_hidden': '16', **_SERVER}
# FedD3A's cases pin eq. 7's probabilities, its default before presets.
_FEDD3A = {'method': 'fedd3a', 'fedd3a.variant': 'paper', **_SERVER}

# case -> config overrides (dotted keys) on the small digits setting.
CASES: dict[str, dict[str, Any]] = {
    'fedavg': {},
    'fedprox': {'method': 'fedprox', 'fedprox.mu': 0.1},
    'feddf': {'method': 'feddf', **_SERVER},
    'feddf_drop_worst': {'method': 'feddf', 'feddf.drop_worst': True,
                         **_SERVER},
    'feddf_hetero': {'method': 'feddf', 'feddf.prototypes': 'cnn,cnn:group',
                     **_SERVER},
    'feddf_driver': {'method': 'feddf', 'runtime.server_device': 'driver',
                     **_SERVER},
    'fedd3a': _FEDD3A,
    'fedd3a_avg': {**_FEDD3A, 'fedd3a.weighting': 'avg'},
    'fedd3a_guard': {**_FEDD3A, 'distill.accept': 'no_worse',
                     'distill.validation': 'labeled'},
    'fedd3a_hetero': {**_FEDD3A, 'fedd3a.client_models': 'cnn,cnn:group'},
    'fedgen': {'method': 'fedgen', 'fedgen.generator_steps': 3,
               'fedgen.hidden': 16},
    'fedftg': {'method': 'fedftg', 'fedftg.iterations': 2,
               'fedftg.batch_size': 16, 'fedftg.noise_dim': 8},
    'dafkd': _DAFKD,
    'dafkd_gan_window': {**_DAFKD, 'dafkd.gan_steps': 1},
    'dafkd_no_sharing': {**_DAFKD, 'dafkd.no_sharing': True},
    'dafkd_no_correlation': {**_DAFKD, 'dafkd.no_correlation': True},
    'dafkd_dcgan': {**_DAFKD, 'dafkd.generator': 'dcgan'},
    'dafkd_real_pool': {**_DAFKD, 'dafkd.pool': 'real'},
    'dafkd_private': {**_DAFKD, 'dafkd.private': True},
    'dafkd_examples': {**_DAFKD, 'dafkd.aggregation': 'examples'},
}


def config_for(overrides: dict[str, Any]):
  """The small digits setting with `overrides` (dotted keys) applied."""
  c = digits.get_config()
  c.rounds = 2
  c.export = False
  c.partition.num_clients = 6
  c.clients_per_round = 3
  c.local.amount = 2
  return settings.with_overrides(c, overrides)


def _is_timing(key: str) -> bool:
  """Whether a metric measures time (e.g. `time/train_s`,
  `distill/teacher_seconds`, `distill/samples_per_second`)."""
  return key.startswith('time/') or 'seconds' in key or 'per_second' in key


def _digest(value) -> str:
  array = np.asarray(value)
  h = hashlib.sha256(str(array.dtype).encode() + str(array.shape).encode())
  h.update(np.ascontiguousarray(array).tobytes())
  return h.hexdigest()[:16]



def fingerprint(case: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
  """Runs one case (plus `key=value` overrides) and returns its metrics and
  state digests."""
  extra = {key: settings.parse_value(value) for key, value in (
      item.partition('=')[::2] for item in overrides)}
  config = config_for({**CASES[case], **extra})
  # DaFKD's private mode: the test context.
  experiment.set_context(experiment.from_config(config))
  with tempfile.TemporaryDirectory() as root:
    result = experiment.run(config, root, progress=False)
    state, _ = experiment.load_state(config, root)
  rounds = [{k: float(v) for k, v in row.items()
             if not _is_timing(k) and np.ndim(v) == 0}
            for row in result.history]
  return {'rounds': rounds,
          'state': [_digest(leaf) for leaf in tf.nest.flatten(state)]}


def compare(before: dict, after: dict) -> bool:
  """Prints the differences per case; True if every common case matches."""
  same = True
  for case in sorted(set(before) | set(after)):
    if case not in before or case not in after:
      print(f'{case}: only in {"after" if case in after else "before"}')
      continue
    a, b = before[case], after[case]
    problems = []
    if len(a['state']) != len(b['state']):
      problems.append(f"{len(a['state'])} vs {len(b['state'])} state leaves")
    else:
      leaves = [i for i, (x, y) in enumerate(zip(a['state'], b['state']))
                if x != y]
      if leaves:
        problems.append(f'{len(leaves)} state leaves differ (first {leaves[:5]})')
    worst = 0.0
    for r, (ra, rb) in enumerate(zip(a['rounds'], b['rounds']), 1):
      keys = set(ra) | set(rb)
      missing = sorted(k for k in keys
                       if (k in ra) != (k in rb) and not _is_timing(k))
      if missing:
        problems.append(f'round {r}: keys only on one side {missing[:5]}')
      for k in sorted(k for k in set(ra) & set(rb) if not _is_timing(k)):
        if ra[k] != rb[k] and not (np.isnan(ra[k]) and np.isnan(rb[k])):
          worst = max(worst, abs(ra[k] - rb[k]))
          problems.append(f'round {r}: {k} {ra[k]!r} -> {rb[k]!r}')
    if len(a['rounds']) != len(b['rounds']):
      problems.append('different number of rounds')
    same = same and not problems
    print(f'{case}: ' + ('identical' if not problems else
                         f'DIFFERS (largest metric change {worst:.3g})'))
    for p in problems[:12]:
      print(f'    {p}')
  return same


def main(argv):
  del argv
  if _COMPARE.value:
    if len(_COMPARE.value) != 2:
      raise app.UsageError('--compare takes BEFORE,AFTER')
    files = []
    for path in _COMPARE.value:
      with open(path) as f:
        files.append(json.load(f))
    sys.exit(0 if compare(*files) else 1)
  if not _OUT.value:
    raise app.UsageError('--out is required (or --compare)')
  cases = _CASES.value or list(CASES)
  unknown = sorted(set(cases) - set(CASES))
  if unknown:
    raise app.UsageError(f'unknown cases {unknown}; choose from {list(CASES)}')
  results = {}
  try:
    for case in cases:
      results[case] = fingerprint(case, _OVERRIDES.value)
      print(f'{case}: {len(results[case]["state"])} state leaves', flush=True)
      with open(_OUT.value, 'w') as f:
        json.dump(results, f, indent=1, sort_keys=True)
  finally:
    context.shutdown()


if __name__ == '__main__':
  app.run(main)
