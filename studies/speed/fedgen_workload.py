r"""FedAvg or FedGen on the FedGen reference workload: time and accuracy.

The workload (shared REFERENCE_NOTES, "A speed and accuracy anchor"): MNIST,
20 users, 1,500 training samples per class split by Dir(0.1), 10 users per
round doing 20 SGD steps of batch 32 (lr 0.01 * 0.99**round), the 26k CNN,
evaluation every round. Its PyTorch reference does 0.405 s per round on
this kind of machine (local training 0.35 s, evaluation 0.05 s) and reaches
79.5% after 20 rounds and 91.5% after 200 (mean of 3 runs); its FedGen
does 0.711 s per round and reaches 88.7% and 95.6% (`--method=fedgen`).

What is timed, per round, from the real `train` program loop:
  * `tff`: `process.next` in TFF's local C++ runtime (client datasets built
    from file keys inside the runtime, 10 x 20 local steps, aggregation);
  * `eval`: the global model on the whole MNIST test set (10,000) and on the
    union of the per-user test slices the reference reports (5,307);
  * `checkpoint`: off except after the last round (the reference keeps none).

To split `tff` into compute and runtime overhead, the same run also times
the identical local work (10 clients x 20 steps x batch 32, same model and
`train_locally` tf.function) executed directly by TensorFlow in this process,
with no TFF. Both numbers come from one run, so their ratio is meaningful on
a noisy machine. `--pure_tf_rounds=0` skips that baseline entirely (no
tracing of it), so the process does only what `train` does:
`studies/speed/sidebyside.py` runs it that way.

The run is `train`'s through the public API: `experiment.prepare`, then
`experiment.run_experiment` on the prepared experiment. Each run records,
per round, the loop's own timed parts (`round_times`: `process.next`,
evaluation, checkpoint and their sum), and the start-up parts of the
process: imports, context creation, `experiment.prepare`, and the time
`run_experiment` spends outside its rounds' timed parts (warm-up,
initialisation, the round-0 checkpoint, sampling and metric release). The
results before 2026-11-28 timed the round from one round's start to the
next by wrapping the program's functions; studies no longer do that.

Usage:
  .venv/bin/python -m studies.speed.fedgen_workload \
      --manual_dir=../shared/data/mnist --rounds=200 --seeds=0,1,2 \
      [--method=fedgen]
"""

import json
import os
import statistics
import tempfile
import time
from typing import Optional

_T_IMPORTS = time.perf_counter()  # Before TensorFlow / TFF / tff_kd imports.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from tff_kd.runtime import context  # pylint: disable=g-import-not-at-top
context.install()  # The program opts in to tff_kd's process set-up.
from tff_kd.program import experiment

from absl import app  # pylint: disable=g-bad-import-order
from absl import flags
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from studies import common
from configs import fedgen_mnist
from tff_kd.core import local_training

_IMPORTS_S = time.perf_counter() - _T_IMPORTS

_MANUAL_DIR = flags.DEFINE_string('manual_dir', '../shared/data/mnist',
                                  'Raw MNIST IDX files for the offline build.')
_DATA_DIR = flags.DEFINE_string('data_dir', '~/tensorflow_datasets',
                                'tfds data_dir.')
_ROUNDS = flags.DEFINE_integer('rounds', 200, 'Rounds per seed.')
_SEEDS = flags.DEFINE_list('seeds', ['0'], 'Seeds, one run each.')
_PURE_TF_ROUNDS = flags.DEFINE_integer(
    'pure_tf_rounds', 20, 'Rounds of the no-TFF compute baseline.')
_METHOD = flags.DEFINE_enum('method', 'fedavg', ['fedavg', 'fedgen'],
                            'Method run on the workload.')
_CONCURRENT_CLIENTS = flags.DEFINE_integer(
    'concurrent_clients', 0, 'runtime.concurrent_clients (0: one per core; '
    "-1: no limit, TFF's default).")
_INTRA_OP_THREADS = flags.DEFINE_integer(
    'intra_op_threads', 1, "runtime.intra_op_threads (0: TensorFlow's "
    'default, every core).')
_CLIENTS_PER_CALL = flags.DEFINE_integer(
    'clients_per_call', 1, 'runtime.clients_per_call (FedAvg and FedGen: '
    'G clients per TFF call).')
_FUSE_CLIENTS = flags.DEFINE_bool(
    'fuse_clients', False, "runtime.client_execution='fused' (FedAvg and "
    "FedGen): each call's clients trained as one batched computation.")
_OUT = flags.DEFINE_string(
    'out', '', 'Result file (default: results/fedgen_workload.json for '
    'fedavg, results/fedgen_workload_fedgen.json for fedgen).')
_OVERRIDES = common.define_overrides_flag()

# The FedGen PyTorch reference on this workload (2 CPU cores; accuracy on
# the users' test slices, mean of 3 runs; ../shared/docs/REFERENCE_NOTES.md).
_REFERENCE = {
    'fedavg': dict(seconds_per_round=0.405, local_training_s=0.35,
                   eval_s=0.05, acc_20=0.795, acc_200=0.915),
    'fedgen': dict(seconds_per_round=0.711, local_training_s=0.51,
                   server_generator_s=0.15, acc_20=0.887, acc_200=0.956),
}


def _config(seed: int, rounds: int):
  c = fedgen_mnist.get_config()
  c.method = _METHOD.value
  c.seed = seed
  c.rounds = rounds
  c.dataset.manual_dir = _MANUAL_DIR.value
  c.dataset.data_dir = _DATA_DIR.value
  c.checkpoint_every = rounds
  c.export = False
  c.runtime.concurrent_clients = _CONCURRENT_CLIENTS.value
  c.runtime.intra_op_threads = _INTRA_OP_THREADS.value
  c.runtime.clients_per_call = _CLIENTS_PER_CALL.value
  c.runtime.client_execution = ('fused' if _FUSE_CLIENTS.value
                                else 'sequential')
  common.apply_overrides(c, _OVERRIDES.value)
  return c


def _pure_tf_round_seconds(exp: experiment.Experiment, rounds: int) -> list:
  """The same local work run by TensorFlow directly (no TFF)."""
  if rounds <= 0:
    return []
  model = exp.model_fn()
  optimizer = tff.learning.optimizers.build_sgdm(0.01)
  weights = tf.nest.map_structure(lambda v: v.numpy(),
                                  local_training.model_weights(model))
  s = exp.settings
  times = []
  for r in range(rounds + 1):
    clients = experiment.sample_clients(
        s.partition.num_clients, s.run.clients_per_round, seed=s.run.seed,
        round_num=r)
    keys = exp.client_data.keys(clients, seed=s.run.seed, round_num=r)
    local = s.local_work
    datasets = [exp.client_data.dataset_from_key(tf.constant(k), local)
                for k in keys]
    t0 = time.perf_counter()
    for ds in datasets:
      local_training.train_locally(model, optimizer, weights, ds,
                                   tf.constant(0.01))
    if r > 0:  # Round 0 includes tracing.
      times.append(time.perf_counter() - t0)
  return times


def _summary(values: list) -> Optional[dict]:
  """mean / median / p90 of `values`; None when there are none (e.g.
  --pure_tf_rounds=0, or a run of 2 rounds or fewer)."""
  if not values:
    return None
  return dict(mean=statistics.fmean(values), median=statistics.median(values),
              p90=float(np.percentile(values, 90)))


def _round_times(hist: list) -> list:
  """Per round: process.next, evaluation, checkpoint and their sum (wall_s:
  the round's timed work, as the loop records it in its metrics; sampling
  and the metric release between them are not in it)."""
  rows = []
  for h in hist:
    parts = dict(train_s=h['time/train_s'], eval_s=h.get('time/eval_s'),
                 checkpoint_s=h.get('time/checkpoint_s'))
    rows.append(dict(round=h['round'], **parts,
                     wall_s=sum(v for v in parts.values() if v is not None)))
  return rows


def main(argv):
  del argv
  context.freeze_imported_objects()  # As the `train` binary does.
  t0 = time.perf_counter()
  context.set_local_context(concurrent_clients=_CONCURRENT_CLIENTS.value,
                            intra_op_threads=_INTRA_OP_THREADS.value)
  context_s = time.perf_counter() - t0
  results = dict(
      command=common.command('speed.fedgen_workload'), machine=common.machine(),
      method=_METHOD.value,
      reference=_REFERENCE[_METHOD.value],
      runs=[])
  for seed in (int(s) for s in _SEEDS.value):
    with tempfile.TemporaryDirectory() as root:
      config = _config(seed, _ROUNDS.value)
      t0 = time.perf_counter()
      exp = experiment.prepare(config, root)
      prepare_s = time.perf_counter() - t0
      pure = _pure_tf_round_seconds(exp, _PURE_TF_ROUNDS.value)
      t0 = time.perf_counter()
      result = experiment.run_experiment(exp, root, progress=False)
      wall = time.perf_counter() - t0
    hist = result.history
    steady = hist[1:-1]  # Round 1 traces; the last one checkpoints.
    tff_s = [h['time/train_s'] for h in steady]
    eval_s = [h['time/eval_s'] for h in steady]
    acc = lambda r, key: hist[r - 1][key] if len(hist) >= r else None  # noqa: E731
    round_times = _round_times(hist)
    run = dict(
        seed=seed, rounds=len(hist), prepare_s=prepare_s, run_wall_s=wall,
        imports_s=_IMPORTS_S, context_s=context_s,
        run_outside_rounds_s=wall - sum(r['wall_s'] for r in round_times),
        first_round_tff_s=hist[0]['time/train_s'] if hist else None,
        seconds_per_round=_summary([a + b for a, b in zip(tff_s, eval_s)]),
        tff_next_s=_summary(tff_s), eval_s=_summary(eval_s),
        pure_tf_local_work_s=_summary(pure),
        tff_overhead_ratio=(statistics.median(tff_s) / statistics.median(pure)
                            if tff_s and pure else None),
        test_accuracy={r: acc(r, 'test/accuracy') for r in (20, 200)},
        slices_accuracy={r: acc(r, 'test_slices/accuracy')
                         for r in (20, 200)},
        curve=[(h['round'], round(h['test/accuracy'], 4),
                round(h['test_slices/accuracy'], 4)) for h in hist],
        round_times=round_times)
    results['runs'].append(run)
    print(json.dumps({k: v for k, v in run.items()
                      if k not in ('curve', 'round_times')},
                     indent=1), flush=True)
  out = _OUT.value or (
      'studies/speed/results/fedgen_workload.json' if _METHOD.value == 'fedavg'
      else f'studies/speed/results/fedgen_workload_{_METHOD.value}.json')
  os.makedirs(os.path.dirname(out) or '.', exist_ok=True)
  with open(out, 'w') as f:
    json.dump(results, f, indent=1)


if __name__ == '__main__':
  app.run(main)
