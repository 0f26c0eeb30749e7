r"""Server step in TFF's runtime vs in the driver: seconds and accuracy.

`runtime.server_device` moves a KD method's server step (distillation,
generator training) out of TFF's `worker_binary`, which has no CUDA, into
the driver's TensorFlow (`tff_kd.runtime.server_stage`). On a machine with
no GPU both modes run on the CPU; this measures what the move costs there
(the aggregate leaves the runtime every round; the step runs in a session
of the driver) and that the runs agree. A GPU speed-up can only be measured
where a GPU is visible to the driver.

Workload: `configs/compare_mnist.py` (MNIST, 20 clients, 8 per round,
10 local epochs, 5,000-image server pool). Runs alternate (runtime, driver,
runtime, ...); the table gives per run the median `process.next` seconds
over rounds 2..N (`time/train_s`: client work plus server step) and the
final test accuracy, and the ratio driver/runtime within one repetition.

Usage:
  .venv/bin/python -m studies.speed.server_device \
      --manual_dir=../shared/data/mnist --rounds=5 --repeats=2
"""

import os
import statistics
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags

from studies import common
from configs import compare_mnist
from tff_kd.runtime import context
context.install()  # The program opts in to tff_kd's process set-up.
from tff_kd.program import experiment

_MANUAL_DIR = flags.DEFINE_string('manual_dir', '../shared/data/mnist',
                                  'Raw MNIST IDX files.')
_DATA_DIR = flags.DEFINE_string('data_dir', '~/tensorflow_datasets',
                                'tfds data_dir.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Rounds per run.')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Runs per setting.')
_METHODS = flags.DEFINE_list('methods', ['feddf', 'fedftg'], 'Methods.')
_OUT = flags.DEFINE_string('out', 'studies/speed/results/server_device',
                           'Result path without extension (.json, .md).')
_OVERRIDES = common.define_overrides_flag()

SETTINGS = ('runtime', 'driver')


def _config(method: str, setting: str):
  c = compare_mnist.get_config()
  c.method = method
  c.rounds = _ROUNDS.value
  c.checkpoint_every = _ROUNDS.value
  c.export = False
  c.runtime.server_device = setting
  c.dataset.manual_dir = _MANUAL_DIR.value
  c.dataset.data_dir = _DATA_DIR.value
  common.apply_overrides(c, _OVERRIDES.value)
  return c


def _run(method: str, setting: str, root: str) -> dict:
  result = experiment.run(_config(method, setting), root, progress=False)
  times = [h['time/train_s'] for h in result.history[1:]]
  return dict(setting=setting, median_train_s=statistics.median(times),
              first_round_s=result.history[0]['time/train_s'],
              final_accuracy=result.final['test/accuracy'])


def _markdown(report: dict) -> str:
  lines = [
      '# Server step in the TFF runtime vs in the driver (CPU only)',
      '', f"Command: `{report['command']}`. Machine: {report['machine']}.",
      '', 'Median `process.next` seconds over rounds 2..N (client work and '
      'server step); ratio driver/runtime within the repetition in '
      'brackets. No GPU: both modes run on the CPU.', '',
      '| method | repeat | runtime | driver | final acc (runtime / driver) |',
      '|---|---|---|---|---|']
  for row in report['rows']:
    by = {r['setting']: r for r in row['runs']}
    base = by['runtime']['median_train_s']
    drv = by['driver']['median_train_s']
    lines.append(
        f"| {row['method']} | {row['repeat']} | {base:.2f} | {drv:.2f} "
        f"({drv / base:.2f}) | {by['runtime']['final_accuracy']:.4f} / "
        f"{by['driver']['final_accuracy']:.4f} |")
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  context.set_local_context()
  report = dict(
      command=common.command('speed.server_device'), machine=common.machine(),
      rows=[])
  root = tempfile.mkdtemp(prefix='server_device_')
  for method in _METHODS.value:
    for repeat in range(_REPEATS.value):
      runs = [_run(method, setting,
                   os.path.join(root, f'{method}_{setting}_{repeat}'))
              for setting in SETTINGS]
      print(method, repeat, runs, flush=True)
      report['rows'].append(dict(method=method, repeat=repeat, runs=runs))
  print(common.write_result(_OUT.value, report, _markdown))


if __name__ == '__main__':
  app.run(main)
