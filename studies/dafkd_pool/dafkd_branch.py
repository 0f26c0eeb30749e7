r"""DaFKD's two-branch rounds: which student starts the next round better.

DaFKD (Wang et al., CVPR 2023) distils eq. (8)'s target, weighted by eq.
(7), into the averaged model after every round; its uniform-weight twin
distils the plain mean of the same teachers. Round by round, from the same
start, eq. 7's student can be the better one (`dafkd.twin_student`) while
the twin's whole run still ends higher. This benchmark separates the two
links, along DaFKD's own trajectory: for every round r, from DaFKD's state
after round r - 1,

* branch A runs round r with eq. 7's weights and branch B with uniform
  weights: the same clients, keys and client training (the clients do not
  read the server's weights), so only the server's distillation differs;
  "after" is each student's accuracy on the server's labeled images;
* then round r + 1 runs with DaFKD from both results, on the same clients;
  "next before" is the averaged model's labeled accuracy before that
  round's distillation: what the clients' next round makes of each
  distilled model.

DaFKD's trajectory continues from branch A, so branch A's numbers are the
DaFKD run's own (the same config and seed give the same rounds).

Usage:
  python -m studies.dafkd_pool.dafkd_branch --config=configs/dafkd_features_cpu.py \
      --overrides=partition.alpha=0.1,distill.temperature=20.0 --seeds=0 \
      --out=studies/dafkd_pool/results/dafkd_branch_alpha0.1_T20
"""

import os
import statistics
import tempfile

from absl import app
from absl import flags
import tensorflow_federated as tff

from studies import common as bench
from tff_kd.federated import tff_types
from tff_kd.program import experiment
from tff_kd.runtime import context

_CONFIG = flags.DEFINE_string('config', 'configs/dafkd_features_cpu.py',
                              'A DaFKD config module with get_config().')
_OVERRIDES = flags.DEFINE_list('overrides', [], 'key=value config overrides.')
_SEEDS = flags.DEFINE_list('seeds', ['0'], 'Seeds.')
_MANUAL_DIR = flags.DEFINE_string('manual_dir', '../shared/data/mnist',
                                  'Raw MNIST IDX files.')
_OUT = flags.DEFINE_string('out', '', 'Result folder (branch.json, .md).')


def _config(seed: int, correlation: bool):
  c = bench.config_module(_CONFIG.value).get_config()
  c.seed = seed
  c.dataset.manual_dir = _MANUAL_DIR.value
  bench.apply_overrides(c, _OVERRIDES.value)
  c.dafkd.weighting = 'discriminator' if correlation else 'uniform'
  return c


def _keys(exp: experiment.Experiment, round_num: int):
  rs = exp.settings.run
  clients = experiment.sample_clients(
      exp.settings.partition.num_clients, rs.clients_per_round,
      seed=rs.seed, round_num=round_num)
  return tff_types.group_keys(
      exp.client_data.keys(clients, seed=rs.seed, round_num=round_num),
      exp.inputs.client_execution.clients_per_call)


def _server(output) -> dict:
  return {k: float(v) for k, v in output.metrics['finalizer'].items()
          if getattr(v, 'shape', ()) == ()}


def branch_rows(seed: int) -> list[dict]:
  """One row per round r (1 .. rounds - 1) of DaFKD's trajectory."""
  config_a, config_b = _config(seed, True), _config(seed, False)
  experiment.set_context(experiment.from_config(config_a))
  rows = []
  with tempfile.TemporaryDirectory() as root:
    exp_a = experiment.prepare(config_a, os.path.join(root, 'a'))
    exp_b = experiment.prepare(config_b, os.path.join(root, 'b'))
    # The seeded Keras model's weights, as a run starts from them.
    state = exp_a.process.set_model_weights(
        exp_a.process.initialize(),
        tff.learning.models.ModelWeights.from_model(exp_a.model_fn()))
    for r in range(config_a.rounds - 1):
      a = exp_a.process.next(state, _keys(exp_a, r))
      b = exp_b.process.next(state, _keys(exp_b, r))
      next_a = exp_a.process.next(a.state, _keys(exp_a, r + 1))
      next_b = exp_a.process.next(b.state, _keys(exp_a, r + 1))
      sa, sb = _server(a), _server(b)
      rows.append(dict(
          round=r + 1, before=sa['labeled_accuracy_before'],
          before_b=sb['labeled_accuracy_before'],
          after_a=sa['labeled_accuracy_after'],
          after_b=sb['labeled_accuracy_after'],
          next_before_a=_server(next_a)['labeled_accuracy_before'],
          next_before_b=_server(next_b)['labeled_accuracy_before']))
      print(seed, rows[-1], flush=True)
      state = a.state
  return rows


def _summary(results: dict) -> str:
  lines = ['| seed | rounds | after: A - B (mean, points) | A ahead / behind '
           '| next before: A - B (mean, points) | A ahead / behind |',
           '|---|---|---|---|---|---|']
  for seed, rows in results.items():
    after = [r['after_a'] - r['after_b'] for r in rows]
    nxt = [r['next_before_a'] - r['next_before_b'] for r in rows]
    lines.append(
        f'| {seed} | {len(rows)} | {100 * statistics.fmean(after):+.2f} | '
        f'{sum(d > 0 for d in after)} / {sum(d < 0 for d in after)} | '
        f'{100 * statistics.fmean(nxt):+.2f} | '
        f'{sum(d > 0 for d in nxt)} / {sum(d < 0 for d in nxt)} |')
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  context.install_worker_reaper()
  results = {int(s): branch_rows(int(s)) for s in _SEEDS.value}
  text = (f'# DaFKD two-branch rounds (`studies/dafkd_pool/dafkd_branch.py`)\n\n'
          f'Command: `{bench.command("dafkd_pool.dafkd_branch")}`. '
          f'Machine: {bench.machine()}.\n\nA: eq. 7; B: uniform weights, '
          'from the same state; "next before": the next DaFKD round\'s '
          'averaged model on the labeled images, from each branch.\n\n'
          + _summary(results))
  print(text)
  if _OUT.value:
    bench.write_result(os.path.join(_OUT.value, 'branch'),
                       {str(k): v for k, v in results.items()}, text,
                       indent=1)


if __name__ == '__main__':
  app.run(main)
