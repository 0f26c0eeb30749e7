r"""Trains one federated method: `train --method=fedavg --config=configs/mnist.py`.

Kept short on purpose: everything lives in `tff_kd.program.experiment`, so a
notebook runs the same code. Restarting with the same --root_dir resumes
from the last checkpoint. Bad input (an unknown method, dataset or config
key, an impossible setting, a missing or corrupt data file or checkpoint)
ends the program with a one-line error and exit code 2 before any training.
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


def _fail(message: str) -> None:
  print(f'train: error: {message}', file=sys.stderr)
  sys.exit(2)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, with config-override errors as one-line messages."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    _fail(str(e).strip().splitlines()[0])
  except (AttributeError, KeyError, OSError) as e:
    # ml_collections raises these for `--config.<unknown key>=...`, and for
    # any override when the config file itself failed to load.
    files = [a.split('=', 1)[1] for a in argv[1:] if a.startswith('--config=')]
    if isinstance(e, OSError) or (files and not os.path.isfile(files[-1])):
      _fail(f'cannot load the config file {(files or ["?"])[-1]!r}')
    key = str(e).strip('\'"')
    bad = [a for a in argv[1:] if a.startswith('--config.')]
    _fail(f"config key {key!r} does not exist (in {' '.join(bad)})")
  except (TypeError, ValueError) as e:
    _fail(f'bad config override: {e}')


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  try:
    config = _CONFIG.value
    config.keys()  # config_flags defers a failed load to the first use.
  except OSError:
    _fail('cannot load the config file '
          f"{flags.FLAGS['config'].config_filename!r}")
  with config.unlocked():
    if _METHOD.value is not None:
      config.method = _METHOD.value
    if _SEED.value is not None:
      config.seed = _SEED.value
  context.set_context_for(experiment.needs_secure_sum(config))
  try:
    result = experiment.run(config, _ROOT_DIR.value,
                            progress=_PROGRESS.value)
  except errors.UserError as e:
    _fail(str(e))
  logging.info('final %s; SavedModel: %s', result.final, result.export_dir)
  print(f"final test accuracy {result.final['test/accuracy']:.4f} after "
        f"{result.final['round']} rounds; model in {result.export_dir}")


def run() -> None:
  """Console-script entry point (`train`)."""
  app.run(main, flags_parser=_parse_flags)


if __name__ == '__main__':
  run()
