r"""Where the early accuracy gap to the FedGen reference comes from.

On the FedGen reference workload (`configs/fedgen_mnist.py`, FedAvg) the
PyTorch reference reports 77-79% after 20 rounds and tff_kd 68%. The two
numbers are not the same metric:

* tff_kd: the global model (averaged weights *and* averaged BatchNorm
  statistics) on the union of the users' test slices;
* the reference (`Server.evaluate` -> `User.test`): each user's model on its
  own test slice, summed over users. `User.set_parameters` copies only
  `model.parameters()`, and `aggregate_parameters` averages only them, so
  BatchNorm's running statistics (buffers) are never averaged: each user
  evaluates the global weights with the statistics of its own last local
  training (the initial 0 / 1 if it was never selected).

This benchmark runs tff_kd's FedAvg round by round (the real process in
TFF's runtime) and, next to it, replays each selected client's local
training in this process from the same broadcast weights and the same data
key (`tff_kd.core.local_training.train_locally`), to keep every user's own
BatchNorm statistics as the reference does. After every round it reports:

* `ours`: tff_kd's metric (global model, averaged statistics, slices);
* `reference_semantics`: the same global weights, each user with its own
  statistics, on its own slice (the reference's metric);
* `pooled_statistics`: the global weights with BatchNorm statistics
  recomputed on all users' training data (one pass, exact means and
  variances), on the slices: what averaging the statistics costs.

The replay's check: the example-weighted mean of the replayed clients'
final weights must equal the process's new global weights (`replay_max_abs`
per round; FedAvg's server step is SGD with lr 1).

Usage:
  .venv/bin/python -m benchmarks.accuracy_gap \
      --manual_dir=../shared/data/mnist --rounds=20 \
      --out=benchmarks/results/accuracy_gap
"""

import json
import os
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from benchmarks import common
from configs import fedgen_mnist
from tff_kd.core import local_training
from tff_kd.runtime import context
context.install()  # The program opts in to tff_kd's process set-up.
from tff_kd.program import checkpoints
from tff_kd.program import setup
from tff_kd.program import experiment
from tff_kd.program import sampling

_MANUAL_DIR = flags.DEFINE_string('manual_dir', '../shared/data/mnist',
                                  'Raw MNIST IDX files for the offline build.')
_DATA_DIR = flags.DEFINE_string('data_dir', '~/tensorflow_datasets',
                                'tfds data_dir.')
_ROUNDS = flags.DEFINE_integer('rounds', 20, 'Rounds.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results/accuracy_gap',
                           'Output prefix (<out>.json, <out>.md).')
_INIT = flags.DEFINE_enum(
    'init', 'keras', ['keras', 'torch'],
    "Initial weights: tff_kd's (He-normal convolutions, Glorot dense "
    "layers, zero biases) or PyTorch's defaults, as the reference's model "
    'starts: every kernel and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)) '
    '(kaiming_uniform with a=sqrt(5)); BatchNorm the same in both.')
_WEIGHTING = flags.DEFINE_enum(
    'weighting', 'round_examples', ['round_examples', 'dataset_size'],
    "How the round's client models are averaged: by the examples each "
    "trained on this round (tff_kd's FedAvg; 20 x 32 for every client "
    "here, so uniform) or by each client's training-set size (the "
    "reference's `aggregate_parameters`). dataset_size replaces the "
    "process's new global weights by the replayed clients' average "
    'weighted that way.')
_SUMMARISE = flags.DEFINE_list(
    'summarise', [], 'Run nothing: write <out>.md, a table of the given '
    "result JSONs of this benchmark (seed, weighting, init, accuracy after "
    'rounds 10 and 20 in each semantics, mean of the last 5 rounds).')
_REFERENCE = flags.DEFINE_string(
    'reference_json', 'benchmarks/results/sidebyside_fedavg.json',
    "A benchmarks/sidebyside.py result: its reference runs' accuracy curves "
    'are printed beside ours (optional).')


def _set(model: tf.keras.Model, trainable, non_trainable) -> None:
  for v, t in zip(model.trainable_weights, trainable):
    v.assign(t)
  for v, t in zip(model.non_trainable_weights, non_trainable):
    v.assign(t)


def _correct(model: tf.keras.Model, x: np.ndarray, y: np.ndarray) -> int:
  logits = model(x, training=False)
  return int(np.sum(np.argmax(logits, -1) == y))


def _pooled_statistics(model: tf.keras.Model, x: np.ndarray) -> list:
  """Exact BatchNorm statistics of `x` under the model's current weights:
  every BN layer's batch mean and variance over all of `x` at once, layer
  after layer (each layer normalised with its new statistics)."""
  stats = []
  h = tf.constant(x)
  for layer in _flat_layers(model):
    if isinstance(layer, tf.keras.layers.InputLayer):
      continue
    if isinstance(layer, tf.keras.layers.BatchNormalization):
      axes = list(range(len(h.shape) - 1))
      mean, var = tf.nn.moments(h, axes)
      layer.moving_mean.assign(mean)
      layer.moving_variance.assign(var)
      stats += [mean.numpy(), var.numpy()]
    h = layer(h, training=False)
  return stats


def _torch_initial_weights(model: tf.keras.Model,
                           seed: int) -> tff.learning.models.ModelWeights:
  """PyTorch's default initialisation of the model's kernels and biases."""
  rng = np.random.default_rng([seed, 7])
  fan_in = {}
  for layer in _flat_layers(model):
    if isinstance(layer, (tf.keras.layers.Conv2D, tf.keras.layers.Dense)):
      fan_in[id(layer.kernel)] = int(np.prod(layer.kernel.shape[:-1]))
      if layer.bias is not None:
        fan_in[id(layer.bias)] = fan_in[id(layer.kernel)]
  trainable = []
  for v in model.trainable_weights:
    if id(v) in fan_in:
      bound = 1.0 / np.sqrt(fan_in[id(v)])
      trainable.append(rng.uniform(-bound, bound, v.shape).astype(np.float32))
    else:
      trainable.append(v.numpy())
  return tff.learning.models.ModelWeights(
      trainable=trainable,
      non_trainable=[v.numpy() for v in model.non_trainable_weights])


def _flat_layers(model: tf.keras.Model) -> list:
  out = []
  for layer in model.layers:
    out += (_flat_layers(layer) if isinstance(layer, tf.keras.Model)
            else [layer])
  return out


def _summarise(paths: list[str], out: str) -> None:
  lines = ['# The early accuracy gap: every run of benchmarks/accuracy_gap.py',
           '', 'Command:', '',
           '    ' + common.command('accuracy_gap'),
           '', 'Accuracy on the union of the users\' test slices. "ours": '
           'global model with averaged BatchNorm statistics; "reference '
           'semantics": each user with its own statistics on its own slice.',
           '', '| run | seed | init | weighting | ours, round 10 | ours, '
           'round 20 | reference semantics, round 20 | ours, mean of the '
           'last 5 rounds |', '|---|---|---|---|---|---|---|---|']
  for path in paths:
    with open(path) as f:
      d = json.load(f)
    rows, cmd = d['rows'], d['command']
    flag = lambda name, default: next(  # noqa: E731
        (a.split('=', 1)[1] for a in cmd.split() if a.startswith(f'--{name}=')),
        default)
    last = rows[-5:]
    lines.append(
        f'| {os.path.basename(path)} | {flag("seed", "0")} | '
        f'{flag("init", "keras")} | {flag("weighting", "round_examples")} | '
        f"{rows[9]['ours']:.4f} | {rows[-1]['ours']:.4f} | "
        f"{rows[-1]['reference_semantics']:.4f} | "
        f"{sum(r['ours'] for r in last) / len(last):.4f} |")
  with open(out + '.md', 'w') as f:
    f.write('\n'.join(lines) + '\n')


def main(argv):
  del argv
  if _SUMMARISE.value:
    _summarise(_SUMMARISE.value, _OUT.value)
    return
  config = fedgen_mnist.get_config()
  config.method = 'fedavg'
  config.seed = _SEED.value
  config.rounds = _ROUNDS.value
  config.dataset.manual_dir = _MANUAL_DIR.value
  config.dataset.data_dir = _DATA_DIR.value
  experiment.set_context(config)
  root = tempfile.mkdtemp()
  exp = experiment.prepare(config, root)
  parts, slices = setup._partition(config, exp.dataset)  # pylint: disable=protected-access
  x_test, y_test = exp.dataset.x_test, exp.dataset.y_test
  x_train = exp.dataset.x_train
  local = experiment.local_work(config)

  model = exp.model_fn()
  replay = exp.model_fn()
  optimizer = tff.learning.optimizers.build_sgdm(
      config.client_optimizer.learning_rate)
  init = exp.model_fn()
  # Users never selected keep a fresh model's statistics, as in the reference.
  user_stats = {u: [v.numpy() for v in init.non_trainable_weights]
                for u in range(config.partition.num_clients)}
  state = exp.process.initialize()  # As `experiment.run` starts a run.
  initial = (checkpoints.seeded_initial_weights(exp.model_fn)
             if _INIT.value == 'keras'
             else _torch_initial_weights(init, config.seed))
  state = exp.process.set_model_weights(state, initial)
  rows = []
  for r in range(config.rounds):
    clients = sampling.sample_clients(config.partition.num_clients,
                                      config.clients_per_round,
                                      seed=config.seed, round_num=r)
    keys = exp.client_data.keys(clients, seed=config.seed, round_num=r)
    before = exp.process.get_model_weights(state)
    output = exp.process.next(state, keys)
    state = output.state
    lr = float(output.metrics['client_work']['train']['learning_rate'])
    after = exp.process.get_model_weights(state)

    finals, sizes = [], []
    for u, key in zip(clients, keys):
      ds = exp.client_data.dataset_from_key(tf.constant(key), local)
      result = local_training.train_locally(
          replay, optimizer, before, ds, tf.constant(lr, tf.float32))
      user_stats[int(u)] = [v.numpy() for v in replay.non_trainable_weights]
      finals.append([v.numpy() for v in replay.weights])
      sizes.append(float(result.num_examples))
    mean = [np.average(np.stack(vs), axis=0, weights=sizes)
            for vs in zip(*finals)]
    _set(replay, after.trainable, after.non_trainable)
    replay_max_abs = max(float(np.max(np.abs(m - v.numpy())))
                         for m, v in zip(mean, replay.weights))
    if _WEIGHTING.value == 'dataset_size':
      sizes = [exp.client_data.num_examples[int(u)] for u in clients]
      mean = [np.average(np.stack(vs), axis=0, weights=sizes)
              .astype(np.float32) for vs in zip(*finals)]
      by_size = {id(v): m for v, m in zip(replay.weights, mean)}
      after = tff.learning.models.ModelWeights(
          trainable=[by_size[id(v)] for v in replay.trainable_weights],
          non_trainable=[by_size[id(v)]
                         for v in replay.non_trainable_weights])
      state = exp.process.set_model_weights(state, after)

    total = sum(len(s) for s in slices)
    _set(model, after.trainable, after.non_trainable)
    ours = sum(_correct(model, x_test[s], y_test[s]) for s in slices) / total
    ref = 0
    for u, s in enumerate(slices):
      _set(model, after.trainable, user_stats[u])
      ref += _correct(model, x_test[s], y_test[s])
    _set(model, after.trainable, after.non_trainable)
    _pooled_statistics(model, x_train[np.concatenate(parts)])
    pooled = sum(_correct(model, x_test[s], y_test[s]) for s in slices) / total
    row = dict(round=r + 1, weighting=_WEIGHTING.value, ours=ours, reference_semantics=ref / total,
               pooled_statistics=pooled, replay_max_abs=replay_max_abs)
    rows.append(row)
    print(json.dumps(row), flush=True)

  reference_curves = []
  if _REFERENCE.value and os.path.exists(_REFERENCE.value):
    with open(_REFERENCE.value) as f:
      sbs = json.load(f)
    for run in sbs['runs']:
      if run['side'] == 'reference':
        reference_curves.append([r.get('acc') for r in run['per_round']] +
                                [run['final_accuracy']])
  results = dict(
      command=common.command('accuracy_gap'), machine=common.machine(),
      rows=rows, reference_curves=reference_curves)
  lines = [
      '# The early accuracy gap to the FedGen reference, decomposed', '',
      'Command:', '', f"    {results['command']}", '',
      'FedAvg on the FedGen reference workload, seed '
      f'{config.seed}. Accuracy on the union of the users\' test slices '
      f'({sum(len(s) for s in slices)} images) after each round:', '',
      '* ours: the global model with averaged BatchNorm statistics '
      "(tff_kd's metric);",
      '* reference semantics: the same global weights, each user with the '
      'BatchNorm statistics of its own last local training (a fresh '
      "model's if never selected), on its own slice (the reference's "
      'metric);',
      '* pooled statistics: the global weights with statistics recomputed '
      "on all users' training data.", '',
      '| round | ours | reference semantics | pooled statistics | '
      'replay check (max abs) |', '|---|---|---|---|---|']
  for row in rows:
    lines.append(f"| {row['round']} | {row['ours']:.4f} | "
                 f"{row['reference_semantics']:.4f} | "
                 f"{row['pooled_statistics']:.4f} | "
                 f"{row['replay_max_abs']:.1e} |")
  if reference_curves:
    lines += ['', 'The reference\'s own accuracy (at the start of each round, '
              'i.e. after the previous one; last value: after the last '
              f'round), from {_REFERENCE.value}:', '']
    for curve in reference_curves:
      lines.append('* ' + ' '.join('-' if a is None else f'{a:.3f}'
                                   for a in curve))
  common.write_result(_OUT.value, results, '\n'.join(lines) + '\n', indent=1)
  context.shutdown()


if __name__ == '__main__':
  app.run(main)
