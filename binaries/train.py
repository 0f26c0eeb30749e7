r"""Trains one federated method: `train --method=fedavg --config=configs/mnist.py`.

Kept short on purpose: everything lives in `tff_kd.program.experiment`, so a
notebook runs the same code. Restarting with the same --root_dir resumes
from the last checkpoint. Bad input (an unknown method, dataset or config
key, an impossible setting, a missing or corrupt data file or checkpoint)
ends the program with a one-line error and exit code 2 before any training.
"""

import logging as std_logging
import os
import sys
import time

# TensorFlow's C++ start-up chatter (e.g. the CUDA plugin registration
# errors of a CPU-only build) stays off the console; Python-level warnings
# and errors still reach it.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# The program opts in to tff_kd's process set-up (workers that die with it,
# tensorflow_probability deferred) before TensorFlow Federated is imported.
# tff_kd (and with it TFF) is imported before absl runs `main`: importing TFF
# inside `app.run` leaves Keras building graph-mode SymbolicTensors instead
# of KerasTensors, which breaks functional models.
from tff_kd.program import context  # pylint: disable=g-import-not-at-top
context.install()
from tff_kd import errors  # pylint: disable=g-import-not-at-top,g-bad-import-order
from tff_kd.program import experiment  # pylint: disable=g-import-not-at-top
from tff_kd.program import plots

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
_PLOT = flags.DEFINE_bool('plot', True,
                          'Write the learning curves to <root_dir>/curves.png.')
# TF, TFF and absl INFO records go to <root_dir>/logs/ unless --verbosity is
# given (absl's flag; e.g. --verbosity=0 shows INFO on the console again).
_LOG_DIR = 'logs'


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


class _InternalNotices(std_logging.Filter):
  """Demotes TensorFlow's notices about its own internals to INFO.

  E.g. Keras' BatchNormalization building graphs through a deprecated TF
  API: nothing a user of this library can act on, so they go to the log
  file, not the console.
  """

  _NOTICES = ('is deprecated and will be removed',
              'compiled metrics have yet to be built')

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.levelno == std_logging.WARNING and any(
        n in record.getMessage() for n in self._NOTICES):
      record.levelno, record.levelname = std_logging.INFO, 'INFO'
    return True


def _log_to_file(root_dir: str) -> None:
  """Records go to root_dir/logs; only warnings and errors to stderr.

  Covers absl's records (TFF's and this library's) and TensorFlow's Python
  logger, which otherwise prints its INFO records itself.
  """
  if flags.FLAGS['verbosity'].present:
    return
  log_dir = os.path.join(root_dir, _LOG_DIR)
  os.makedirs(log_dir, exist_ok=True)
  logging.get_absl_handler().use_absl_log_file('train', log_dir)
  flags.FLAGS.stderrthreshold = 'warning'
  tf_logger = std_logging.getLogger('tensorflow')
  for handler in list(tf_logger.handlers):
    tf_logger.removeHandler(handler)
  tf_logger.propagate = True  # To absl's handler on the root logger.
  tf_logger.addFilter(_InternalNotices())


def _header(config) -> str:
  p = config.partition
  data = config.dataset.domains or config.dataset.name
  return (f'train: {config.method} on {data}, {p.num_clients} clients '
          f'({config.clients_per_round} per round), {config.rounds} rounds, '
          f'seed {config.seed}; outputs in {_ROOT_DIR.value}')


def _summary(root_dir: str, result, seconds: float,
             curves: str | None) -> str:
  accuracy = plots.read_metrics(root_dir)['test/accuracy']
  best = max((a, r) for r, a in enumerate(accuracy, 1) if a == a)
  resumed = (f', resumed after round {result.resumed_after}'
             if result.resumed_after else '')
  lines = [
      f"final test accuracy {result.final['test/accuracy']:.4f} after "
      f"{result.final['round']} rounds (best {best[0]:.4f} in round "
      f'{best[1]}); {seconds:.0f} s{resumed}',
      f"  metrics:     {os.path.join(root_dir, 'metrics.csv')}",
      f"  TensorBoard: {os.path.join(root_dir, 'tb')}",
      f"  checkpoints: {os.path.join(root_dir, 'checkpoints')}",
  ]
  if result.export_dir:
    lines.append(f'  SavedModel:  {result.export_dir}')
  if curves:
    lines.append(f'  curves:      {curves}')
  if not flags.FLAGS['verbosity'].present:
    lines.append(f'  log:         {os.path.join(root_dir, _LOG_DIR)}')
  return '\n'.join(lines)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  context.freeze_imported_objects()  # TF and TFF are imported by now.
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
  try:
    experiment.validate_config(config)  # Before any output or compute.
  except errors.UserError as e:
    _fail(str(e))
  root_dir = _ROOT_DIR.value
  _log_to_file(root_dir)
  print(_header(config), flush=True)
  experiment.set_context(config)
  start = time.perf_counter()
  try:
    result = experiment.run(config, root_dir, progress=_PROGRESS.value)
  except errors.UserError as e:
    _fail(str(e))
  logging.info('final %s; SavedModel: %s', result.final, result.export_dir)
  curves = None
  if _PLOT.value:
    curves = os.path.join(root_dir, 'curves.png')
    plots.plot_runs([root_dir], curves, title=config.method)
  print(_summary(root_dir, result, time.perf_counter() - start, curves))


def run() -> None:
  """Console-script entry point (`train`)."""
  app.run(main, flags_parser=_parse_flags)


if __name__ == '__main__':
  run()
