r"""Trains one federated method: `train --method=fedavg --config=configs/mnist.py`.

Kept short on purpose: everything lives in `tff_kd.program.experiment`, so a
notebook runs the same code. Restarting with the same --root_dir resumes
from the last checkpoint. Bad input ends the program with a one-line error
and exit code 2 before any training starts.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# tff_kd (and with it TensorFlow Federated) is imported before absl runs
# `main`: importing TFF inside `app.run` leaves Keras building graph-mode
# SymbolicTensors instead of KerasTensors, which breaks functional models.
from tff_kd import errors  # pylint: disable=g-import-not-at-top
from tff_kd.program import context
from tff_kd.program import experiment

from absl import app  # pylint: disable=g-bad-import-order
from absl import flags
from absl import logging
from ml_collections import config_flags

_DEFAULT_CONFIG = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), '..', 'configs', 'base.py')

_CONFIG = config_flags.DEFINE_config_file(
    'config', _DEFAULT_CONFIG, 'Experiment config file (a get_config() '
    'module in configs/); override keys with --config.<key>=<value>.')
_METHOD = flags.DEFINE_string(
    'method', None, 'Method to train (overrides config.method).')
_ROOT_DIR = flags.DEFINE_string(
    'root_dir', None, 'Output folder: checkpoints, metrics.csv, TensorBoard, '
    'export. Reusing it resumes the run.', required=True)
_SEED = flags.DEFINE_integer('seed', None, 'Seed (overrides config.seed).')
_PROGRESS = flags.DEFINE_bool('progress', True, 'Show a progress bar.')


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  config = _CONFIG.value
  with config.unlocked():
    if _METHOD.value is not None:
      config.method = _METHOD.value
    if _SEED.value is not None:
      config.seed = _SEED.value
  context.set_local_context()
  try:
    result = experiment.run(config, _ROOT_DIR.value,
                            progress=_PROGRESS.value)
  except errors.UserError as e:
    print(f'train: error: {e}', file=sys.stderr)
    sys.exit(2)
  logging.info('final %s; SavedModel: %s', result.final, result.export_dir)
  print(f"final test accuracy {result.final['test/accuracy']:.4f} after "
        f"{result.final['round']} rounds; model in {result.export_dir}")


def run() -> None:
  """Console-script entry point (`train`)."""
  app.run(main)


if __name__ == '__main__':
  run()
