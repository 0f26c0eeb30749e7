r"""Cost at cross-device scale: total clients N, clients per round K.

Each setting runs the `train` binary as its own process under
`/usr/bin/time -v` on `configs/mnist.py` (the small CNN, IID MNIST) with
`partition.num_clients=N`, `clients_per_round=K` and a fixed number of
examples per round (`--examples_per_round`, split as local SGD steps of
batch 32 over the K clients, so K = 10 and K = 100 do the same local work).
FedDF, FedD3A and DaFKD get a 2,000-image split server pool and a
200-image labeled set (`dafkd`: the paper's preset with the DCGAN
generator, GAN terms in every local step; `dafkd.real_pool`: the default
preset where the server has unlabeled images). A row is a method or
`<method>.<preset>`.

Reported per setting (from the run's `metrics.csv`, its folder and the
process's resource usage):
  * start-up: wall time before the first round's training (process start,
    data, partition and client files, tracing), i.e. the wall time minus
    every round's train, evaluation and checkpoint seconds;
  * seconds per round: the median `time/train_s` of rounds 2..R;
  * the server step: the median over rounds 2..R of the KD server's own
    wall time inside the round (FedDF: `distill/teacher_seconds +
    distill/distill_seconds`; DaFKD: `distill/server_seconds`, the pool,
    the teachers, the diagnostics and the distillation);
  * peak RSS: the largest process of the run's tree (`worker_binary` or the
    driver), "Maximum resident set size";
  * bytes per round: `comm/bytes_down + comm/bytes_up` of round 1;
  * checkpoint size: the newest checkpoint folder on disk;
  * client files: the size of the run's client data folder.

`--clients_per_call=1,10` also runs the methods that group clients (all
but DaFKD) with `runtime.clients_per_call` G = 10 (the column G): ten
clients per TFF client call. `--fuse_clients=0,1` runs each of those
settings also with `runtime.client_execution='fused'` (the column "fused":
the call's clients trained as one batched computation) for the methods
that fuse clients (all but FedGen and DaFKD). `scale.png` plots seconds
per round against K, one line per method and execution (run one N).

Usage (about 15 minutes for the default grid on 2 cores):
  .venv/bin/python -m studies.scale.scale --manual_dir=../shared/data/mnist \
      --out=studies/scale/results/scale
"""

import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from studies import common

_METHODS = flags.DEFINE_list('methods', ['fedavg', 'feddf', 'dafkd'],
                             'Methods.')
_CLIENTS = flags.DEFINE_list('num_clients', ['100', '1000', '5000'],
                             'Total clients N.')
_PER_ROUND = flags.DEFINE_list('clients_per_round', ['10', '100'],
                               'Clients per round K.')
_PER_CALL = flags.DEFINE_list(
    'clients_per_call', ['1'],
    'runtime.clients_per_call values; those > 1 run for the methods that '
    'group clients (all but DaFKD) only.')
_FUSE = flags.DEFINE_list(
    'fuse_clients', ['0'],
    "runtime.client_execution='fused' (1) or not (0); 1 runs for the "
    'methods that fuse clients (all but FedGen and DaFKD) only.')
_EXECUTIONS = flags.DEFINE_list(
    'executions', [],
    'Instead of --clients_per_call x --fuse_clients: a list of G (in turn) '
    'or <G>f (fused where the method fuses clients, in turn where it only '
    'groups them), e.g. 1,10f, or fast: compare\'s default, G = min(10, '
    'ceil(K / 2)) fused where the method fuses clients; G > 1 runs for the '
    'methods that group clients only.')
_EXAMPLES = flags.DEFINE_integer(
    'examples_per_round', 6400,
    'Local examples per round over all K clients (batch 32 steps).')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Rounds per setting.')
_MANUAL_DIR = flags.DEFINE_string('manual_dir', '../shared/data/mnist',
                                  'Raw MNIST IDX files.')
_TIMEOUT = flags.DEFINE_integer('timeout_s', 900,
                                'Seconds before a setting is stopped.')
_PLOT_FROM = flags.DEFINE_list(
    'plot_from', [], 'Run nothing: plot the records of these scale.json '
    'files together into <out>/scale.png (e.g. a study whose DaFKD rows '
    'ran one per call in a second command).')
_OUT = flags.DEFINE_string('out', 'studies/scale/results/scale',
                           'Result folder (scale.json, scale.md).')
_OVERRIDES = common.define_overrides_flag()

_BATCH = 32
_KD = ('--config.server_data.proxy=split',
       '--config.server_data.proxy_size=2000',
       '--config.server_data.val_size=200', '--config.distill.steps=50')
# A row's name is a method, or `<method>.<preset>` (its named preset).
_METHOD_FLAGS = {
    'fedavg': (),
    'fedprox': (),
    'feddf': _KD,
    'fedd3a': _KD,
    'fedftg': (),
    'fedgen': (),
    'dafkd': _KD + ('--config.dafkd.variant=paper',
                    '--config.dafkd.generator=dcgan',
                    '--config.dafkd.aggregation=examples'),
    # The default preset where the server has unlabeled images.
    'dafkd.real_pool': _KD + ('--config.dafkd.variant=real_pool',),
}


def _du(path: str) -> int:
  total = 0
  for root, _, files in os.walk(path):
    total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
  return total


def _newest_checkpoint(root: str) -> str | None:
  folder = os.path.join(root, 'checkpoints')
  if not os.path.isdir(folder):
    return None
  states = [d for d in os.listdir(folder) if re.fullmatch(r'program_state_\d+',
                                                          d)]
  if not states:
    return None
  return os.path.join(folder, max(states, key=lambda d: int(d.split('_')[-1])))


def _local_steps(k: int) -> int:
  """Local steps per client that spread the round's examples over K."""
  return max(1, _EXAMPLES.value // (k * _BATCH))


def run_setting(method: str, n: int, k: int, root: str,
                per_call: int = 1, fuse: bool = False) -> dict:
  """One `train` run; its costs (or an error)."""
  steps = _local_steps(k)
  command = [
      '/usr/bin/time', '-v', os.path.join(os.path.dirname(sys.executable),
                                          'train'),
      '--config=configs/mnist.py', f'--method={method.split(".")[0]}',
      f'--root_dir={root}',
      f'--config.dataset.manual_dir={_MANUAL_DIR.value}',
      '--config.partition.kind=iid', f'--config.partition.num_clients={n}',
      f'--config.clients_per_round={k}', f'--config.rounds={_ROUNDS.value}',
      '--config.local.unit=steps', f'--config.local.amount={steps}',
      f'--config.local.batch_size={_BATCH}', '--config.export=false',
      f'--config.checkpoint_every={_ROUNDS.value}', '--noplot',
      f'--config.runtime.clients_per_call={per_call}',
      '--config.runtime.client_execution='
      + ('fused' if fuse else 'sequential'),
      '--noprogress', *_METHOD_FLAGS[method],
      *(f'--config.{item}' for item in _OVERRIDES.value)]
  t0 = time.perf_counter()
  proc = subprocess.run(command, capture_output=True, text=True,
                        timeout=_TIMEOUT.value,
                        env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'})
  wall = time.perf_counter() - t0
  record = dict(method=method, num_clients=n, clients_per_round=k,
                clients_per_call=per_call, fuse_clients=fuse,
                local_steps=steps, wall_s=wall, returncode=proc.returncode)
  match = re.search(r'Maximum resident set size \(kbytes\): (\d+)',
                    proc.stderr)
  record['peak_rss_gb'] = int(match.group(1)) / 2**20 if match else None
  if proc.returncode != 0:
    record['error'] = common.error_line(proc.stderr)
    return record
  with open(os.path.join(root, 'metrics.csv')) as f:
    rows = list(csv.DictReader(f))
  train = [float(r['time/train_s']) for r in rows]
  spent = sum(float(r.get(key) or 0.0) for r in rows
              for key in ('time/train_s', 'time/eval_s', 'time/checkpoint_s'))
  checkpoint = _newest_checkpoint(root)
  record.update(
      startup_s=wall - spent,
      seconds_per_round=statistics.median(train[1:] or train),
      server_step_s=_server_step_s(rows),
      first_round_s=train[0],
      bytes_per_round=(float(rows[0]['comm/bytes_down']) +
                       float(rows[0]['comm/bytes_up'])),
      checkpoint_mb=_du(checkpoint) / 2**20 if checkpoint else None,
      client_files_mb=_du(os.path.join(root, 'client_data')) / 2**20,
      final_accuracy=float(rows[-1]['test/accuracy']))
  return record


# Methods of `--methods` whose clients may be grouped
# (`runtime.clients_per_call`; `Method.groups_clients`, which `train`
# checks: this driver does not import the library), and fused
# (`Method.fuses_clients`).
_FUSES = ('fedavg', 'fedprox', 'feddf', 'fedd3a', 'fedftg', 'fedgen')
_GROUPS = _FUSES

# The metrics that time a method's server step, summed per round.
_SERVER_STEP_KEYS = (('distill/server_seconds',),
                     ('distill/teacher_seconds', 'distill/distill_seconds'))


def _executions(method: str, k: int) -> list[tuple[int, int, str]]:
  """(G, fused, the plot's label) settings to run for a method at K
  clients per round."""
  if not _EXECUTIONS.value:
    return [(g, f, f"G = {g}{', fused' if f else ''}")
            for g in map(int, _PER_CALL.value)
            for f in map(int, _FUSE.value)]
  out = []
  for item in _EXECUTIONS.value:
    label = item
    if item == 'fast':
      item = f'{min(10, -(-k // 2))}f'
    fused = int(item.endswith('f') and method in _FUSES)
    g = int(item.rstrip('f'))
    if label != 'fast':
      label = f"G = {g}{', fused' if fused else ''}"
    out.append((g, fused, label))
  return out


def _server_step_s(rows: list[dict]) -> float | None:
  """The median server step of rounds 2..R, or None (no KD server step)."""
  for keys in _SERVER_STEP_KEYS:
    if all(k in rows[0] for k in keys):
      per_round = [sum(float(r[k]) for k in keys) for r in rows]
      return statistics.median(per_round[1:] or per_round)
  return None


def _fused(record: dict) -> str:
  return 'yes' if record.get('fuse_clients') else 'no'


def _cell(value, fmt: str) -> str:
  return '-' if value is None else format(value, fmt)


def markdown(records: list[dict], meta: dict) -> str:
  lines = ['# Cost at scale (studies/scale/scale.py)', '',
           f"Command: `{meta['command']}`. Machine: {meta['machine']}.", '',
           meta['setting'], '',
           '| method | N | K | G | fused | local steps | start-up s | '
           's/round | server step s | round 1 s | peak RSS GB | '
           'MB per round | checkpoint MB | client files MB |',
           '|---' * 14 + '|']
  for r in records:
    if 'error' in r:
      lines.append(f"| {r['method']} | {r['num_clients']} | "
                   f"{r['clients_per_round']} | "
                   f"{r.get('clients_per_call', 1)} | {_fused(r)} | "
                   f"{r['local_steps']} | failed "
                   f"(exit {r['returncode']}, {r['wall_s']:.0f} s, peak "
                   f"{_cell(r['peak_rss_gb'], '.2f')} GB): "
                   f"{r['error'][:120]} | | | | | | | |")
      continue
    lines.append(
        f"| {r['method']} | {r['num_clients']} | {r['clients_per_round']} | "
        f"{r.get('clients_per_call', 1)} | {_fused(r)} | "
        f"{r['local_steps']} | {r['startup_s']:.1f} | "
        f"{r['seconds_per_round']:.2f} | "
        f"{_cell(r.get('server_step_s'), '.2f')} | {r['first_round_s']:.2f} | "
        f"{r['peak_rss_gb']:.2f} | {r['bytes_per_round'] / 2**20:.1f} | "
        f"{_cell(r['checkpoint_mb'], '.1f')} | "
        f"{r['client_files_mb']:.1f} |")
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  os.makedirs(_OUT.value, exist_ok=True)
  if _PLOT_FROM.value:
    records = []
    for path in _PLOT_FROM.value:
      with open(path) as f:
        records += json.load(f)['records']
    plot(records, os.path.join(_OUT.value, 'scale.png'))
    return
  records = []
  scratch = tempfile.mkdtemp(prefix='scale_')
  try:
    for method in _METHODS.value:
      for n in map(int, _CLIENTS.value):
        for k in map(int, _PER_ROUND.value):
          for g, fuse, label in _executions(method, k):
            if k > n or (g > 1 and method not in _GROUPS) or (
                fuse and method not in _FUSES):
              continue
            root = os.path.join(scratch, f'{method}_{n}_{k}_{g}_{fuse}')
            try:
              record = run_setting(method, n, k, root, g, bool(fuse))
            except subprocess.TimeoutExpired:
              record = dict(
                  method=method, num_clients=n, clients_per_round=k,
                  clients_per_call=g, fuse_clients=bool(fuse),
                  local_steps=_local_steps(k),
                  wall_s=float(_TIMEOUT.value), returncode=None,
                  peak_rss_gb=None,
                  error=f'not finished in {_TIMEOUT.value} s')
            shutil.rmtree(root, ignore_errors=True)
            record['execution'] = label
            records.append(record)
            print(json.dumps(record), flush=True)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  meta = dict(
      command=common.command('scale.scale'), machine=common.machine(),
      setting=(f'IID MNIST, the small CNN, {_ROUNDS.value} rounds, '
               f'{_EXAMPLES.value} local examples per round in batches of '
               f'{_BATCH} over the K clients; FedDF, FedD3A and DaFKD with '
               'a 2,000-image server pool, a 200-image labeled set and 50 '
               'distillation steps; `dafkd`: the paper preset, with the DCGAN '
               'generator and GAN terms in every local step; '
               '`dafkd.real_pool`: the default preset.'))
  print(common.write_result(
      os.path.join(_OUT.value, 'scale'), dict(meta=meta, records=records),
      lambda result: markdown(result['records'], result['meta'])))
  plot(records, os.path.join(_OUT.value, 'scale.png'))


def plot(records: list[dict], path: str) -> None:
  """Seconds per round against K: one line per method and execution
  (G, fused), at the first N of each."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
  lines: dict[str, list[tuple[int, float]]] = {}
  for r in records:
    if 'error' in r:
      continue
    label = f"{r['method']} ({r.get('execution', '?')})"
    lines.setdefault(label, []).append((r['clients_per_round'],
                                        r['seconds_per_round']))
  figure, axes = pyplot.subplots(figsize=(7, 4.5))
  methods = list(dict.fromkeys(label.split(' (')[0] for label in lines))
  colours = pyplot.get_cmap('tab10')
  for label, points in lines.items():
    ks, seconds = zip(*sorted(points))
    method = label.split(' (')[0]
    axes.plot(ks, seconds, marker='o', label=label,
              color=colours(methods.index(method) % 10),
              linestyle='-' if label.endswith('(G = 1)') else '--')
  axes.set_xlabel('clients per round K (the same 6,400 local examples)')
  axes.set_ylabel('seconds per round (median, log scale)')
  axes.set_xscale('log')
  axes.set_yscale('log')
  axes.grid(alpha=0.3)
  axes.legend(fontsize=7)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  pyplot.close(figure)


if __name__ == '__main__':
  app.run(main)
