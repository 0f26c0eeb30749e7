r"""What one small client costs in TensorFlow itself, outside TFF's runtime.

At K = 100 clients of 2 local steps a FedAvg round costs 2-3x K = 10 clients
of 20 steps, for the same examples and steps (`scale.py`). This splits one
client's work, as the TFF client computation does it, into parts that each
run as a `tf.function` called once per client (one intra-op and one inter-op
thread, as the runtime's worker uses), over the same 100 clients of one
round of `scale.py`'s K = 100 setting:

  * call only: a `tf.function` that reads its key's length (the floor);
  * read files: the client's two tensor files, parsed (`read_arrays`);
  * dataset from key: `dataset_from_key` (read, shuffle, batch) iterated to
    the end with `loops.fold_batches`;
  * train, in-memory data: `train_locally` (2 steps) on a dataset of two
    in-memory batches;
  * full client: `train_locally` on `dataset_from_key` (the client
    computation's body).

Milliseconds per client: the fastest of `--repeats` passes over the 100
clients. The same full client is also timed on one round of the K = 10
setting (10 clients of 20 steps), and both rounds' sequential totals are
compared: their ratio is what the runtime cannot remove by grouping
clients (`runtime.clients_per_call`).

`--round_sizes=K_LARGE,K_SMALL` (default 100,10) changes the two rounds'
client counts, each client doing the round's examples' share of steps
(the smoke test runs it with a few clients).

Usage:
  .venv/bin/python -m studies.speed.client_cost --manual_dir=../shared/data/mnist
"""

import os
import tempfile
import time

from absl import app
from absl import flags

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from tff_kd.runtime import context  # pylint: disable=g-import-not-at-top
context.install()
import tensorflow as tf  # pylint: disable=g-import-not-at-top,g-bad-import-order
import tensorflow_federated as tff  # pylint: disable=g-bad-import-order

from studies import common  # pylint: disable=g-bad-import-order
from configs import mnist
from tff_kd.core import local_training
from tff_kd.core import loops
from tff_kd.program import experiment

_MANUAL_DIR = flags.DEFINE_string('manual_dir', '../shared/data/mnist',
                                  'Folder with the MNIST raw files.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Passes over the clients.')
_OUT = flags.DEFINE_string('out', 'studies/speed/results/client_cost',
                           'Result prefix (.json, .md).')
_ROUND_SIZES = flags.DEFINE_list(
    'round_sizes', ['100', '10'], 'Clients of the two rounds compared: '
    'the large K (every part timed) and the small K (full client only).')
_OVERRIDES = common.define_overrides_flag()

_NUM_CLIENTS = 1000
_EXAMPLES_PER_ROUND = 6400
_BATCH = 32


def _prepare(per_round: int):
  """FedAvg on `per_round` of the IID clients, `scale.py`'s local work."""
  config = mnist.get_config()
  config.method = 'fedavg'
  config.dataset.manual_dir = _MANUAL_DIR.value
  config.partition.kind = 'iid'
  config.partition.num_clients = _NUM_CLIENTS
  config.clients_per_round = per_round
  config.local.unit = 'steps'
  config.local.amount = _EXAMPLES_PER_ROUND // (per_round * _BATCH)
  config.local.batch_size = _BATCH
  common.apply_overrides(config, _OVERRIDES.value)
  exp = experiment.prepare(config, tempfile.mkdtemp(prefix='client_cost_'))
  keys = exp.client_data.keys(
      experiment.sample_clients(config.partition.num_clients, per_round,
                                 seed=0, round_num=1),
      seed=0, round_num=1)
  return config, exp, keys


def _time(fn, keys) -> float:
  """Milliseconds per key of `fn`: the fastest pass (traced before)."""
  fn(tf.constant(keys[0]))
  passes = []
  for _ in range(_REPEATS.value):
    t0 = time.perf_counter()
    for key in keys:
      fn(tf.constant(key))
    passes.append((time.perf_counter() - t0) / len(keys) * 1e3)
  return min(passes)


def _parts(exp, config) -> dict:
  """Name -> a one-key `tf.function` doing that part of a client's work."""
  data = exp.client_data
  local = experiment.from_config(config).local_work
  model = exp.model_fn()
  optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.05)
  start = tf.nest.map_structure(tf.identity,
                                local_training.model_weights(model))
  key0 = data.keys([0], seed=0, round_num=0)[0]
  x0, y0 = data.read_arrays(tf.constant(key0.split('|')[0]))
  in_memory = dict(x=x0[:2 * config.local.batch_size],
                   y=y0[:2 * config.local.batch_size])

  def count(total, batch):
    return total + tf.shape(batch['y'])[0]

  return {
      'call only': tf.function(tf.strings.length),
      'read files': tf.function(lambda key: tf.shape(data.read_arrays(
          tf.strings.split(key, '|')[0])[0])[0]),
      'dataset from key, iterated': tf.function(lambda key: loops.fold_batches(
          data.dataset_from_key(key, local), count, tf.constant(0))),
      'train 2 steps, in-memory data': tf.function(
          lambda key: local_training.train_locally(
              model, optimizer, start,
              tf.data.Dataset.from_tensor_slices(in_memory).batch(
                  config.local.batch_size), 0.05).num_examples),
      'full client': tf.function(lambda key: local_training.train_locally(
          model, optimizer, start, data.dataset_from_key(key, local),
          0.05).num_examples),
  }


def main(argv):
  del argv
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  large, small = (int(k) for k in _ROUND_SIZES.value)
  rows = []
  config, exp, keys = _prepare(large)
  for name, fn in _parts(exp, config).items():
    rows.append(dict(part=name, clients=large,
                     ms_per_client=_time(fn, keys)))
    print(rows[-1], flush=True)
  config_small, exp_small, keys_small = _prepare(small)
  full_small = _time(_parts(exp_small, config_small)['full client'],
                     keys_small)
  rows.append(dict(part='full client', clients=small,
                   ms_per_client=full_small))
  rounds = {k: r['ms_per_client'] * k for r in rows for k in (r['clients'],)
            if r['part'] == 'full client'}
  meta = dict(command=common.command('speed.client_cost'), machine=common.machine(),
              setting=(f'IID MNIST, {_NUM_CLIENTS} clients (~60 images '
                       f'each); {_EXAMPLES_PER_ROUND} examples per round '
                       f'in batches of {_BATCH}: K = {large} clients of '
                       f'{_EXAMPLES_PER_ROUND // (large * _BATCH)} steps '
                       f'or K = {small} of '
                       f'{_EXAMPLES_PER_ROUND // (small * _BATCH)} '
                       'steps; the small CNN, one '
                       'thread'),
              round_ms=rounds, round_ratio=rounds[large] / rounds[small])

  def markdown(result: dict) -> str:
    m = result['meta']
    lines = ['# One client\'s cost in TensorFlow (studies/speed/client_cost.py)',
             '', f"Command: `{m['command']}`. Machine: {m['machine']}.", '',
             m['setting'] + '.', '', '| part | clients per round | '
             'ms per client |', '|---|---|---|']
    lines += [f"| {r['part']} | {r['clients']} | {r['ms_per_client']:.2f} |"
              for r in result['rows']]
    lines += ['', 'A round\'s clients one after another: K = '
              f"{large} {m['round_ms'][large]:.0f} ms, K = {small} "
              f"{m['round_ms'][small]:.0f} "
              f"ms ({m['round_ratio']:.2f}x)."]
    return '\n'.join(lines) + '\n'

  print(common.write_result(_OUT.value, dict(meta=meta, rows=rows), markdown))


if __name__ == '__main__':
  app.run(main)
