r"""Seconds per round on TFF's local runtime and on 1 and 2 remote workers.

The FedGen reference workload (`configs/fedgen_mnist.py`: MNIST, 20 users,
10 per round, 20 local steps of batch 32, evaluation every round) run by the
`train` program loop (`experiment.run`) under three contexts:

* `local`: TFF's local C++ runtime (one `worker_binary` child);
* `remote1`: one loopback `worker_binary` service through
  `tff_kd.runtime.workers.remote_context` (TFF's mergeable context);
* `remote2`: two loopback services; each runs half of a round's clients.

Runs alternate (local, remote1, remote2, local, ...) so that load drifts hit
every setting alike; the table reports the median of `time/train_s`
(`process.next`) over rounds 2..N per run, and the ratios to `local` taken
within one repetition. Every worker runs on the same machine, so two workers
can only help as far as the machine has idle cores.

Usage:
  .venv/bin/python -m studies.speed.remote_workers \
      --manual_dir=../shared/data/mnist --rounds=30 --repeats=2
"""

import os
import statistics
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import tensorflow_federated as tff

from studies import common
from configs import fedgen_mnist
from tff_kd.runtime import context
context.install()  # The program opts in to tff_kd's process set-up.
from tff_kd.program import experiment
from tff_kd.runtime import workers

_MANUAL_DIR = flags.DEFINE_string('manual_dir', '../shared/data/mnist',
                                  'Raw MNIST IDX files.')
_DATA_DIR = flags.DEFINE_string('data_dir', '~/tensorflow_datasets',
                                'tfds data_dir.')
_ROUNDS = flags.DEFINE_integer('rounds', 30, 'Rounds per run.')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Runs per setting.')
_METHODS = flags.DEFINE_list('methods', ['fedavg', 'fedgen'], 'Methods.')
_OUT = flags.DEFINE_string('out', 'studies/speed/results/remote_workers',
                           'Result path without extension (.json, .md).')
_OVERRIDES = common.define_overrides_flag()

SETTINGS = ('local', 'remote1', 'remote2')


def _config(method: str, rounds: int):
  c = fedgen_mnist.get_config()
  c.method = method
  c.rounds = rounds
  c.checkpoint_every = rounds
  c.export = False
  c.dataset.manual_dir = _MANUAL_DIR.value
  c.dataset.data_dir = _DATA_DIR.value
  common.apply_overrides(c, _OVERRIDES.value)
  return c


def _run(config, setting: str, addresses: list[str], root: str) -> dict:
  if setting == 'local':
    result = experiment.run(config, root, progress=False)
  else:
    group = addresses[:1] if setting == 'remote1' else addresses[1:3]
    with tff.framework.get_context_stack().install(
        workers.remote_context(group)):
      result = experiment.run(config, root, progress=False)
  times = [h['time/train_s'] for h in result.history[1:]]
  return dict(setting=setting, median_train_s=statistics.median(times),
              mean_train_s=statistics.mean(times),
              first_round_s=result.history[0]['time/train_s'],
              final_accuracy=result.final['test/accuracy'])


def _markdown(report: dict) -> str:
  lines = [
      '# Seconds per round: local runtime vs loopback workers',
      '', f"Command: `{report['command']}`. Machine: {report['machine']}.",
      '', 'Median `process.next` seconds over rounds 2..N of each run '
      '(FedGen reference workload, configs/fedgen_mnist.py); ratio to the '
      '`local` run of the same repetition in brackets.', '',
      '| method | repeat | local | remote, 1 worker | remote, 2 workers '
      '| final acc (local / 1 / 2) |', '|---|---|---|---|---|---|']
  for row in report['rows']:
    by = {r['setting']: r for r in row['runs']}
    base = by['local']['median_train_s']
    cells = [f"{by[s]['median_train_s']:.3f}" + (
        '' if s == 'local' else f" ({by[s]['median_train_s'] / base:.2f})")
             for s in SETTINGS]
    accs = ' / '.join(f"{by[s]['final_accuracy']:.4f}" for s in SETTINGS)
    lines.append(f"| {row['method']} | {row['repeat']} | "
                 f"{' | '.join(cells)} | {accs} |")
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  context.set_local_context()
  started = workers.start_local_workers(3)
  addresses = [a for a, _ in started]
  report = dict(
      command=common.command('speed.remote_workers'), machine=common.machine(),
      rows=[])
  try:
    root = tempfile.mkdtemp(prefix='remote_workers_')
    for method in _METHODS.value:
      for repeat in range(_REPEATS.value):
        runs = []
        for setting in SETTINGS:
          config = _config(method, _ROUNDS.value)
          runs.append(_run(config, setting, addresses, os.path.join(
              root, f'{method}_{setting}_{repeat}')))
          print(method, repeat, runs[-1], flush=True)
        report['rows'].append(dict(method=method, repeat=repeat, runs=runs))
  finally:
    workers.stop_workers(started)
  print(common.write_result(_OUT.value, report, _markdown))


if __name__ == '__main__':
  app.run(main)
