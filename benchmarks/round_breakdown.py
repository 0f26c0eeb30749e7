r"""Where a FedAvg round and the start-up go, on the FedGen reference workload.

Workload: `configs/fedgen_mnist.py` (the FedGen reference's MNIST example:
20 users, Dir(0.1), 1,500 training images per class, 10 users per round
doing 20 SGD steps of batch 32, the 26k CNN) with `method=fedavg`.

Start-up, in the order a `train` run does it, each part timed on its own
in this one fresh process:
  * imports: tensorflow, tensorflow_federated, tff_kd (program modules);
  * data: a cold tfds build of MNIST from the raw IDX files into an empty
    data_dir (what a first run pays; `--cold_data=false` skips it), then the
    load a normal run does (`tff_kd.data.load_dataset`);
  * `experiment.prepare` as a whole, and inside it (its own functions,
    wrapped with timers while it runs, nothing edited): data load,
    partition, writing the client arrays, the method's process build
    (tracing of every TF / federated computation), evaluators;
  * context creation (`set_local_context`);
  * what `experiment.run` does before its first round: `initialize` (the
    first call into the runtime, which starts `worker_binary`),
    `set_model_weights`, saving the round-0 checkpoint;
  * the first `process.next` (listed as round 1 below).

A round, repeated `--rounds` times, all stages interleaved in each round so
the machine's noise spreads over all of them:
  * the program's round as `experiment.run` does it: sampling and keys,
    `process.next`, metrics to Python, `get_model_weights` + whole-test-set
    and slice evaluation, metric release (CSV, TensorBoard, log: each
    release manager timed on its own), checkpoint (`checkpoint_every=1`, the
    base config's default; fedgen_workload.py checkpoints only at the end);
  * the same round's four stages, each called on its own through the same
    runtime, on the same inputs (the round's starting state and keys):
    broadcast, client work (10 clients x 20 steps), aggregation, finalizer;
    their result is checked against `process.next`'s;
  * the same local work run by TensorFlow directly in this process (no
    TFF): the `train_locally` tf.function over the same 10 clients' datasets
    (dataset construction timed apart).

Round 1 (first calls: tracing, runtime compilation) is reported apart from
the median over rounds 2..N.

Usage:
  .venv/bin/python -m benchmarks.round_breakdown \
      --manual_dir=../shared/data/mnist --rounds=12
"""

import time

_T0 = time.perf_counter()

# pylint: disable=g-import-not-at-top,wrong-import-position
import os
import statistics
import tempfile
from typing import Any, Callable

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
_IMPORTS = {}
_t = time.perf_counter()
import numpy as np
import tensorflow as tf
_IMPORTS['tensorflow (+numpy)'] = time.perf_counter() - _t
_t = time.perf_counter()
import tensorflow_federated as tff
_IMPORTS['tensorflow_federated'] = time.perf_counter() - _t
_t = time.perf_counter()
from tff_kd.core import local_training
from tff_kd.data import datasets as datasets_lib
from tff_kd.federated import client_data as client_data_lib
from tff_kd.federated import client_works
from tff_kd.federated import finalizers
from tff_kd.federated import learning
from tff_kd.methods import registry
from tff_kd.runtime import context
context.install()  # The program opts in to tff_kd's process set-up.
from tff_kd.methods import common
from tff_kd.program import checkpoints
from tff_kd.program import evaluation
from tff_kd.program import experiment
from tff_kd.program import loop
from tff_kd.program import sampling
from tff_kd.program import setup
from tff_kd.program import validation
from tff_kd.runtime import aio
from tff_kd.runtime import server_stage
_IMPORTS['tff_kd (program, algorithms)'] = time.perf_counter() - _t
_t = time.perf_counter()
from absl import app
from absl import flags
from benchmarks import common as benchmark_common
from configs import fedgen_mnist
_IMPORTS['absl, configs'] = time.perf_counter() - _t
_IMPORTS_TOTAL = time.perf_counter() - _T0
# pylint: enable=g-import-not-at-top,wrong-import-position

_MANUAL_DIR = flags.DEFINE_string('manual_dir', '../shared/data/mnist',
                                  'Raw MNIST IDX files.')
_DATA_DIR = flags.DEFINE_string('data_dir', '~/tensorflow_datasets',
                                'tfds data_dir of the normal (warm) load.')
_COLD_DATA = flags.DEFINE_bool(
    'cold_data', True, 'Also time a tfds build into an empty data_dir.')
_ROUNDS = flags.DEFINE_integer('rounds', 12, 'Rounds timed.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed.')
_NOTE = flags.DEFINE_string('note', '', 'Text added to the Markdown.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results/round_breakdown',
                           'Output prefix (.json and .md).')


class _Timers:
  """Wraps module attributes with timers for the duration of a block."""

  def __init__(self):
    self.seconds: dict[str, float] = {}
    self._undo = []

  def wrap(self, owner, name: str, label: str) -> None:
    fn = getattr(owner, name)

    def timed(*args, **kwargs):
      t0 = time.perf_counter()
      try:
        return fn(*args, **kwargs)
      finally:
        self.seconds[label] = (self.seconds.get(label, 0.0) +
                               time.perf_counter() - t0)

    setattr(owner, name, timed)
    self._undo.append((owner, name, fn))

  def restore(self) -> None:
    for owner, name, fn in reversed(self._undo):
      setattr(owner, name, fn)
    self._undo.clear()


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
  t0 = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - t0


def _config(root_data_dir: str):
  c = fedgen_mnist.get_config()
  c.method = 'fedavg'
  c.seed = _SEED.value
  c.rounds = _ROUNDS.value
  c.dataset.manual_dir = _MANUAL_DIR.value
  c.dataset.data_dir = root_data_dir
  c.export = False
  return c


def _max_abs_diff(a, b) -> float:
  fa = [np.asarray(x) for x in tf.nest.flatten(a)]
  fb = [np.asarray(x) for x in tf.nest.flatten(b)]
  return float(max(np.max(np.abs(x - y)) for x, y in zip(fa, fb)))


def _stats(values: list) -> dict:
  return dict(first=values[0] if values else None,
              median_rest=statistics.median(values[1:]) if len(values) > 1
              else None,
              mean_rest=statistics.fmean(values[1:]) if len(values) > 1
              else None)


def main(argv):
  del argv
  startup = dict(imports=dict(_IMPORTS, total=_IMPORTS_TOTAL))
  config = _config(_DATA_DIR.value)

  # -- Data: a cold tfds build (first run on a machine), then a warm load.
  if _COLD_DATA.value:
    with tempfile.TemporaryDirectory() as cold:
      _, startup['data_cold_build_and_load_s'] = _timed(
          lambda: datasets_lib.load_dataset(
              'mnist', data_dir=cold, manual_dir=_MANUAL_DIR.value))
  _, startup['data_warm_load_s'] = _timed(
      lambda: datasets_lib.load_dataset(
          'mnist', data_dir=os.path.expanduser(_DATA_DIR.value),
          manual_dir=_MANUAL_DIR.value))

  root_holder = tempfile.TemporaryDirectory(prefix='round_breakdown_')
  root = root_holder.name
  # -- experiment.prepare, with its own parts timed while it runs.
  timers = _Timers()
  timers.wrap(validation, 'validate_config', 'validate_config')
  timers.wrap(setup.data_lib, 'load_dataset', 'load_dataset')
  timers.wrap(setup, '_partition', 'partition')
  timers.wrap(client_data_lib.FileClientData, 'create',
              'write_client_arrays')
  timers.wrap(evaluation.Evaluator, '__init__', 'evaluators')
  timers.wrap(server_stage, 'place_server', 'place_server')
  get_method = registry.get_method

  def timed_get_method(name):
    m = get_method(name)
    build = m.build

    def timed_build(*args, **kwargs):
      t0 = time.perf_counter()
      try:
        return build(*args, **kwargs)
      finally:
        timers.seconds['process_build_and_tracing'] = (
            timers.seconds.get('process_build_and_tracing', 0.0) +
            time.perf_counter() - t0)
    return m._replace(build=timed_build)

  registry.get_method = timed_get_method
  try:
    exp, startup['prepare_total_s'] = _timed(
        lambda: experiment.prepare(config, root))
  finally:
    registry.get_method = get_method
    timers.restore()
  startup['prepare_parts_s'] = dict(timers.seconds)

  # -- Context, then what run() does before its first round.
  _, startup['context_creation_s'] = _timed(context.set_local_context)
  process = exp.process
  initial, startup['initialize_first_runtime_call_s'] = _timed(
      process.initialize)
  seeded, startup['seeded_keras_weights_s'] = _timed(
      lambda: checkpoints.seeded_initial_weights(exp.model_fn))
  state, startup['set_model_weights_s'] = _timed(
      lambda: process.set_model_weights(initial, seeded))
  manager = tff.program.FileProgramStateManager(
      os.path.join(root, 'checkpoints'), keep_total=config.keep_checkpoints)
  _, startup['checkpoint_round0_s'] = _timed(
      lambda: aio.run_sync(manager.save(state, 0)))
  releasers = dict(
      csv=tff.program.CSVFileReleaseManager(
          os.path.join(root, 'metrics.csv'), key_fieldname='round'),
      tensorboard=tff.program.TensorBoardReleaseManager(
          os.path.join(root, 'tb')),
      log=tff.program.LoggingReleaseManager())

  # -- The four stages, built as registry/fedavg build them.
  t0 = time.perf_counter()
  weights_type = process.get_model_weights.type_signature.result
  inputs = exp.inputs
  distributor = tff.learning.templates.build_broadcast_process(weights_type)
  keys_type = tff.FederatedType(np.str_, tff.CLIENTS)

  # Called on its own, the broadcast returns CLIENTS-placed weights, which
  # the runtime can only return when it knows how many clients there are:
  # the round's keys ride along (unused) to tell it.
  @tff.federated_computation(distributor.next.type_signature.parameter[0],
                             distributor.next.type_signature.parameter[1],
                             keys_type)
  def broadcast(dist_state, weights, keys):
    del keys
    return distributor.next(dist_state, weights).result
  client_work = client_works.build_client_work(
      inputs.model_fn, inputs.element_spec,
      common.build_optimizer(config.client_optimizer),
      learning_rate=config.client_optimizer.learning_rate,
      learning_rate_decay=config.client_optimizer.lr_decay,
      dataset_fn=inputs.dataset_fn)
  aggregator = tff.aggregators.MeanFactory().create(
      weights_type, tff.TensorType(np.float32))
  finalizer = finalizers.build_weights_finalizer(
      weights_type, common.build_optimizer(config.server_optimizer))
  dist_state = distributor.initialize()
  agg_state = aggregator.initialize()
  fin_state = finalizer.initialize()
  stages_build_s = time.perf_counter() - t0

  # -- Pure TF in this process: same model, optimizer, tf.function.
  tf_model = exp.model_fn()
  tf_optimizer = common.build_optimizer(config.client_optimizer)
  local = experiment.local_work(config)

  rows = []
  max_diff = 0.0
  for r in range(config.rounds):
    row = {}
    t_round = time.perf_counter()
    # The program's round, as experiment.run does it.
    t0 = time.perf_counter()
    clients = sampling.sample_clients(
        config.partition.num_clients, config.clients_per_round,
        seed=config.seed, round_num=r)
    keys = exp.client_data.keys(clients, seed=config.seed, round_num=r)
    row['sample_and_keys'] = time.perf_counter() - t0
    start_state = state
    output, row['process_next'] = _timed(
        lambda: process.next(start_state, keys))  # pylint: disable=cell-var-from-loop
    metrics, row['metrics_to_python'] = _timed(
        lambda: loop._round_metrics(output, config))  # pylint: disable=protected-access,cell-var-from-loop
    state = output.state
    weights, row['get_model_weights'] = _timed(
        lambda: process.get_model_weights(state))  # pylint: disable=cell-var-from-loop
    test, row['eval_whole_test'] = _timed(
        lambda: exp.evaluations['test'](weights, state))  # pylint: disable=cell-var-from-loop
    sliced, row['eval_slices'] = _timed(
        lambda: exp.evaluations['test_slices'](weights, state))  # pylint: disable=cell-var-from-loop
    metrics.update({**test, **sliced, 'time/train_s': row['process_next']})
    for name, rm in releasers.items():
      _, row[f'release_{name}'] = _timed(
          lambda: aio.run_sync(rm.release(metrics, key=r + 1)))  # pylint: disable=cell-var-from-loop
    _, row['checkpoint'] = _timed(
        lambda: aio.run_sync(manager.save(state, r + 1)))  # pylint: disable=cell-var-from-loop
    row['program_round_total'] = time.perf_counter() - t_round

    # The same round, stage by stage, from the same starting state.
    gw = process.get_model_weights(start_state)
    client_weights, row['stage_broadcast'] = _timed(
        lambda: broadcast(dist_state, gw, list(keys)))  # pylint: disable=cell-var-from-loop
    if not isinstance(client_weights, list):  # all-equal: one value
      client_weights = [client_weights] * len(keys)
    work, row['stage_client_work'] = _timed(
        lambda: client_work.next(np.int32(r), client_weights, list(keys)))  # pylint: disable=cell-var-from-loop
    updates = [c.update for c in work.result]
    update_weights = [c.update_weight for c in work.result]
    agg, row['stage_aggregation'] = _timed(
        lambda: aggregator.next(agg_state, updates, update_weights))  # pylint: disable=cell-var-from-loop
    fin, row['stage_finalizer'] = _timed(
        lambda: finalizer.next(fin_state, gw, agg.result))  # pylint: disable=cell-var-from-loop
    max_diff = max(max_diff, _max_abs_diff(fin.result, weights))
    row['stages_sum'] = sum(row[k] for k in (
        'stage_broadcast', 'stage_client_work', 'stage_aggregation',
        'stage_finalizer'))

    # The same local work, pure TF in this process.
    t0 = time.perf_counter()
    datasets = [exp.client_data.dataset_from_key(tf.constant(k), local)
                for k in keys]
    row['pure_tf_datasets'] = time.perf_counter() - t0
    np_weights = tf.nest.map_structure(np.asarray, gw)
    lr = tf.constant(config.client_optimizer.learning_rate *
                     config.client_optimizer.lr_decay ** r, tf.float32)
    t0 = time.perf_counter()
    for ds in datasets:
      local_training.train_locally(tf_model, tf_optimizer, np_weights, ds,
                                   lr)
    row['pure_tf_local_work'] = time.perf_counter() - t0
    row['accuracy'] = acc
    row['slices_accuracy'] = sliced.accuracy
    rows.append(row)
    print(f'round {r + 1}: ' + ', '.join(
        f'{k}={v:.3f}' for k, v in row.items()), flush=True)

  stage_keys = [k for k in rows[0] if k not in ('accuracy',
                                                'slices_accuracy')]
  per_stage = {k: _stats([row[k] for row in rows]) for k in stage_keys}
  startup['stages_build_s'] = stages_build_s
  result = dict(
      command=benchmark_common.command('round_breakdown'),
      machine=benchmark_common.machine(),
      note=('Timed on a shared 2-core machine: another engineer ran tests at '
            'the same time, so absolute numbers are noisy; the stages of one '
            'round were interleaved so their ratios are comparable.'),
      config=dict(method='fedavg', rounds=config.rounds, seed=config.seed,
                  clients_per_round=config.clients_per_round,
                  local_steps=config.local.amount,
                  batch_size=config.local.batch_size,
                  eval_batch_size=config.eval_batch_size),
      startup=startup,
      per_stage=per_stage,
      stages_vs_process_next_max_abs_diff=max_diff,
      rounds=rows, extra_note=_NOTE.value,
      tff_kd_path=os.path.dirname(os.path.dirname(
          os.path.abspath(learning.__file__))))
  out = _OUT.value
  print(benchmark_common.write_result(out, result, _markdown, indent=1))
  root_holder.cleanup()


_ROUND_ROWS = (
    ('sample clients + keys', 'sample_and_keys'),
    ('`process.next` (broadcast + 10 clients x 20 steps + aggregation + '
     'finalizer, one runtime call)', 'process_next'),
    ('metrics to Python (`_round_metrics`)', 'metrics_to_python'),
    ('`get_model_weights` (a runtime call)', 'get_model_weights'),
    ('evaluation, whole test set (10,000)', 'eval_whole_test'),
    ('evaluation, users\' slices (5,307)', 'eval_slices'),
    ('release: CSV', 'release_csv'),
    ('release: TensorBoard', 'release_tensorboard'),
    ('release: log', 'release_log'),
    ('checkpoint (every round: the base config\'s default)', 'checkpoint'),
    ('**program round total**', 'program_round_total'),
    ('stage alone: broadcast', 'stage_broadcast'),
    ('stage alone: client work (10 clients, in the runtime)',
     'stage_client_work'),
    ('stage alone: aggregation', 'stage_aggregation'),
    ('stage alone: finalizer', 'stage_finalizer'),
    ('stages alone, sum', 'stages_sum'),
    ('same local work, pure TF in-process (10 clients, sequential)',
     'pure_tf_local_work'),
    ('pure TF: building the 10 datasets', 'pure_tf_datasets'),
)


def _f(v):
  return '-' if v is None else f'{v:.3f}'


def _markdown(result: dict) -> str:
  s = result['startup']
  p = result['per_stage']
  lines = [
      '# Where a FedAvg round and the start-up go (FedGen reference '
      'workload)', '',
      'Command:', '', f"    {result['command']}", '',
      f"Machine: {result['machine']}. {result['note']}", '',
      f"Config: {result['config']}. tff_kd from {result['tff_kd_path']}.",
      '',
  ] + ([result['extra_note'], ''] if result.get('extra_note') else []) + [
      '## One round (seconds)', '',
      '| stage | round 1 | median, rounds 2..N | mean, rounds 2..N |',
      '|---|---|---|---|']
  for label, key in _ROUND_ROWS:
    st = p.get(key)
    if st:
      lines.append(f"| {label} | {_f(st['first'])} | "
                   f"{_f(st['median_rest'])} | {_f(st['mean_rest'])} |")
  lines += [
      '',
      'The stages alone produce the same new global weights as '
      f"`process.next` (max abs difference "
      f"{result['stages_vs_process_next_max_abs_diff']:.2e}).",
      '',
      '## Start-up (seconds, once per process)', '',
      '| part | seconds |', '|---|---|']
  for k, v in s['imports'].items():
    lines.append(f'| import {k} | {_f(v)} |')
  for k in ('data_cold_build_and_load_s', 'data_warm_load_s'):
    if k in s:
      lines.append(f'| {k[:-2].replace("_", " ")} (outside prepare) | '
                   f'{_f(s[k])} |')
  lines.append(f"| `experiment.prepare` total | {_f(s['prepare_total_s'])} |")
  for k, v in s['prepare_parts_s'].items():
    lines.append(f'| &nbsp;&nbsp;of which {k.replace("_", " ")} | {_f(v)} |')
  for k in ('context_creation_s', 'initialize_first_runtime_call_s',
            'seeded_keras_weights_s', 'set_model_weights_s',
            'checkpoint_round0_s'):
    lines.append(f'| {k[:-2].replace("_", " ")} | {_f(s[k])} |')
  lines.append('| first `process.next` (round 1 above) | '
               f"{_f(p['process_next']['first'])} |")
  lines.append('')
  return '\n'.join(lines) + '\n'


if __name__ == '__main__':
  app.run(main)
