r"""Peak memory of the stacking aggregator against the clients per round.

The KD methods collect every client's value at the server with
`tff_kd.federated.stacking.build_stacking_aggregator`. This measures one
call of its `next` on K clients (all with weight 1, M = K slots), each
value P float32 numbers split over `--leaves` tensors, under the local C++
context that the library uses (`tff_kd.runtime.context.set_local_context`,
a `worker_binary` child process), for two formulations:

* `dense`: `build_dense_stacking_aggregator`, one [M, ...] `Stack` as the
  `tff.federated_aggregate` accumulator (the formulation before
  2026-11-26);
* `slots`: `build_stacking_aggregator`, the M slots as separate values that
  each accumulate step passes through.

Each (formulation, P, K) runs in its own Python process with its own
worker. It reports the worker's peak RSS (`VmHWM` from /proc, exact), its
RSS before the call, the Python process's peak RSS, and the peak of the
two summed (polled every 20 ms), plus the call's wall time. Then it fits
`peak = c + a K + b K^2` per formulation and P; `b / (4 P)` counts how many
P-sized copies each extra client squared adds (1.0: one [K, P] stack per
client).

Settings whose dense prediction (4 K^2 P bytes) exceeds `--max_dense_gb`
are skipped for `dense`.

Usage:
  .venv/bin/python -m studies.speed.stack_memory --params=250000,1000000 \
      --clients=10,25,50,100 --out=studies/speed/results/stack_memory
"""

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any, Optional, Sequence

from absl import app
from absl import flags
import numpy as np

from studies import common

_PARAMS = flags.DEFINE_list('params', ['250000', '1000000'],
                            'P: float32 numbers per client value.')
_CLIENTS = flags.DEFINE_list('clients', ['10', '25', '50', '100'],
                             'K: clients per round (= slots M).')
_VARIANTS = flags.DEFINE_list('variants', ['dense', 'slots'],
                              'Formulations to measure.')
_LEAVES = flags.DEFINE_integer('leaves', 4,
                               'Tensors one client value is split over.')
_MAX_DENSE_GB = flags.DEFINE_float(
    'max_dense_gb', 6.0, 'Skip dense settings predicted (4 K^2 P bytes) '
    'above this.')
_TIMEOUT_S = flags.DEFINE_integer('timeout_s', 600, 'Per setting.')
_OUT = flags.DEFINE_string('out', 'studies/speed/results/stack_memory',
                           'Output prefix (<out>.json, <out>.md).')
# One setting, in a child process (set by the parent).
_CHILD = flags.DEFINE_string('child', None,
                             'variant,P,K: measure one setting, print JSON.')

_MB = 1 << 20


def _status_kb(pid: int, field: str) -> int:
  """A `VmHWM`/`VmRSS`-like field of /proc/<pid>/status, in KiB."""
  with open(f'/proc/{pid}/status') as f:
    for line in f:
      if line.startswith(field + ':'):
        return int(line.split()[1])
  raise KeyError(field)


def _workers() -> list[int]:
  """Pids of this process's live `worker_binary` children."""
  import psutil  # pylint: disable=g-import-not-at-top
  return [p.pid for p in psutil.Process().children(recursive=True)
          if 'worker_binary' in p.name()
          and p.status() != psutil.STATUS_ZOMBIE]


class _TreePoller:
  """Polls the summed RSS of this process and its children."""

  def __init__(self, period_s: float = 0.02):
    self._period_s = period_s
    self._stop = threading.Event()
    self.peak_bytes = 0
    self._thread = threading.Thread(target=self._run, daemon=True)

  def _run(self) -> None:
    import psutil  # pylint: disable=g-import-not-at-top
    me = psutil.Process()
    while not self._stop.is_set():
      total = 0
      for p in [me] + me.children(recursive=True):
        try:
          total += p.memory_info().rss
        except psutil.Error:
          pass
      self.peak_bytes = max(self.peak_bytes, total)
      time.sleep(self._period_s)

  def __enter__(self) -> '_TreePoller':
    self._thread.start()
    return self

  def __exit__(self, *unused_exc: Any) -> None:
    self._stop.set()
    self._thread.join()


def measure_one(variant: str, params: int, clients: int,
                leaves: int) -> dict[str, Any]:
  """Runs one aggregator `next` under the local C++ context.

  Args:
    variant: 'dense' or 'slots'.
    params: P, float32 numbers per client value.
    clients: K clients, and M = K slots.
    leaves: Tensors the value is split over.

  Returns:
    The setting and its memory and time figures (MB, seconds).
  """
  from tff_kd.runtime import context  # pylint: disable=g-import-not-at-top
  context.install()
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_kd.federated import stacking  # pylint: disable=g-import-not-at-top

  context.set_local_context()
  sizes = [params // leaves + (i < params % leaves) for i in range(leaves)]
  value_type = tff.types.to_type(
      tuple(tff.TensorType(np.float32, [n]) for n in sizes))
  build = {'dense': stacking.build_dense_stacking_aggregator,
           'slots': stacking.build_stacking_aggregator}[variant]
  start = time.perf_counter()
  process = build(value_type, clients)
  build_s = time.perf_counter() - start
  rng = np.random.default_rng(0)
  values = [tuple(rng.standard_normal(n, dtype=np.float32) for n in sizes)
            for _ in range(clients)]
  weights = [1.0] * clients
  state = process.initialize()  # Starts the worker if it is not up.
  workers = _workers()
  if len(workers) != 1:
    raise RuntimeError(f'expected one worker_binary child, got {workers}')
  worker = workers[0]
  worker_before_kb = _status_kb(worker, 'VmRSS')
  with _TreePoller() as poller:
    start = time.perf_counter()
    output = process.next(state, values, weights)
    call_s = time.perf_counter() - start
  count = int(output.result.count)
  if count != clients:
    raise RuntimeError(f'stacked {count} of {clients} clients')
  row = int(np.argmax(np.asarray(output.result.weights)))  # Any filled row.
  np.testing.assert_array_equal(output.result.values[0][row], values[row][0])
  result = dict(
      variant=variant, params=params, clients=clients, leaves=leaves,
      worker_before_mb=worker_before_kb / 1024,
      worker_peak_mb=_status_kb(worker, 'VmHWM') / 1024,
      python_peak_mb=_status_kb(os.getpid(), 'VmHWM') / 1024,
      tree_peak_polled_mb=poller.peak_bytes / _MB,
      build_s=build_s, call_s=call_s)
  context.shutdown()
  return result


def _run_child(variant: str, params: int, clients: int,
               leaves: int) -> dict[str, Any]:
  """`measure_one` in a fresh Python process (and so a fresh worker)."""
  proc = subprocess.run(
      [sys.executable, '-m', 'studies.speed.stack_memory',
       f'--child={variant},{params},{clients}', f'--leaves={leaves}'],
      capture_output=True, text=True, timeout=_TIMEOUT_S.value,
      env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'})
  if proc.returncode != 0:
    return dict(variant=variant, params=params, clients=clients,
                error=proc.stderr.strip().splitlines()[-1:])
  return json.loads(proc.stdout.strip().splitlines()[-1])


def fit(ks: Sequence[int], peaks: Sequence[float]) -> Optional[dict]:
  """Least squares of peak = c + a K + b K^2 (needs 3 points or more)."""
  if len(ks) < 3:
    return None
  k = np.asarray(ks, float)
  design = np.stack([np.ones_like(k), k, k * k], axis=1)
  (c, a, b), *_ = np.linalg.lstsq(design, np.asarray(peaks, float),
                                  rcond=None)
  return dict(c_mb=c, a_mb=a, b_mb=b)


def _markdown(result: dict[str, Any]) -> str:
  """The report: one row per setting, then the fits."""
  lines = [
      '# Stacking aggregator: peak memory against the clients per round',
      '', f'Machine: {result["machine"]}.', '',
      'Command:', '', '```', result['command'], '```', '',
      'One `next` call on K clients (weight 1 each), M = K slots, each '
      f'client value P float32 numbers in {result["leaves"]} tensors, '
      'under the local C++ context (`worker_binary`); each setting in a '
      'fresh process. Worker peak is its `VmHWM` (exact); tree peak is '
      'Python + worker RSS polled every 20 ms. MB = 2^20 bytes.', '',
      '| variant | P | K | worker before MB | worker peak MB | Python peak MB'
      ' | tree peak (polled) MB | call s | build s |',
      '|---|---|---|---|---|---|---|---|---|']
  for r in result['runs']:
    if 'error' in r:
      lines.append(f'| {r["variant"]} | {r["params"]} | {r["clients"]} | '
                   f'error: {" ".join(r["error"])} |||||||')
    elif 'skipped' in r:
      lines.append(f'| {r["variant"]} | {r["params"]} | {r["clients"]} | '
                   f'skipped: {r["skipped"]} |||||||')
    else:
      lines.append(
          f'| {r["variant"]} | {r["params"]} | {r["clients"]} | '
          f'{r["worker_before_mb"]:.0f} | {r["worker_peak_mb"]:.0f} | '
          f'{r["python_peak_mb"]:.0f} | {r["tree_peak_polled_mb"]:.0f} | '
          f'{r["call_s"]:.2f} | {r["build_s"]:.2f} |')
  lines += ['', 'Fit of the worker peak, peak = c + a K + b K^2 (MB); '
            '`b / 4P` is b in units of 4 P bytes (one P-sized float32 '
            'copy per K^2):', '',
            '| variant | P | K used | c MB | a MB | b MB | b / 4P |',
            '|---|---|---|---|---|---|---|']
  for f in result['fits']:
    if f['fit'] is None:
      continue
    lines.append(
        f'| {f["variant"]} | {f["params"]} | {f["clients"]} | '
        f'{f["fit"]["c_mb"]:.0f} | {f["fit"]["a_mb"]:.2f} | '
        f'{f["fit"]["b_mb"]:.4f} | '
        f'{f["fit"]["b_mb"] * _MB / (4 * f["params"]):.2f} |')
  return '\n'.join(lines) + '\n'


def main(argv: Sequence[str]) -> None:
  del argv
  if _CHILD.value:
    variant, params, clients = _CHILD.value.split(',')
    print(json.dumps(measure_one(variant, int(params), int(clients),
                                 _LEAVES.value)))
    return
  runs = []
  for params in map(int, _PARAMS.value):
    for clients in map(int, _CLIENTS.value):
      for variant in _VARIANTS.value:
        predicted_gb = 4 * clients**2 * params / 1e9
        if variant == 'dense' and predicted_gb > _MAX_DENSE_GB.value:
          runs.append(dict(variant=variant, params=params, clients=clients,
                           skipped=f'predicted {predicted_gb:.1f} GB'))
          continue
        run = _run_child(variant, params, clients, _LEAVES.value)
        print(json.dumps(run), flush=True)
        runs.append(run)
  fits = []
  for params in map(int, _PARAMS.value):
    for variant in _VARIANTS.value:
      done = [r for r in runs if r['params'] == params
              and r['variant'] == variant and 'worker_peak_mb' in r]
      ks = [r['clients'] for r in done]
      fits.append(dict(variant=variant, params=params, clients=ks,
                       fit=fit(ks, [r['worker_peak_mb'] for r in done])))
  result = dict(command=common.command('speed.stack_memory'),
                machine=common.machine(), leaves=_LEAVES.value, runs=runs,
                fits=fits)
  common.write_result(_OUT.value, result, _markdown)


if __name__ == '__main__':
  app.run(main)
