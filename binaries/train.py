r"""Trains one federated method: `train --method=fedavg --config=configs/mnist.py`.

Kept short on purpose: everything lives in `tff_kd.program.experiment`, so a
notebook runs the same code. Restarting with the same --root_dir resumes
from the last checkpoint. Bad input (an unknown method, dataset or config
key, an impossible setting, a missing or corrupt data file or checkpoint, a
--root_dir that is not a writable folder or that another run holds) ends
the program with a one-line error and exit code 2 before any training.
Faults mid-run end it the same way, with the last good round and how to
resume: a full disk or a folder turned read-only (naming the path), Ctrl-C
or SIGTERM (naming the signal; a second one ends it at once), a round
without a usable client, an unreachable worker. The traceback of a fault
goes to <root_dir>/logs.
"""

import os
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
from tff_kd.runtime import context  # pylint: disable=g-import-not-at-top
context.install()
from tff_kd.program import experiment  # pylint: disable=g-import-not-at-top

from binaries import cli  # pylint: disable=g-bad-import-order

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
# given (absl's flag; e.g. --verbosity=0 shows INFO on the console again):
# `cli.log_to_file`.


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, with every error as a one-line message
  (`cli.parse_flags`)."""
  return cli.parse_flags('train', argv, _DEFAULT_CONFIG)


def _header(settings: experiment.Settings) -> str:
  data = settings.dataset.domains or settings.dataset.name
  # A TFF ClientData ('tff:' names) brings its own clients.
  clients = ('its own clients' if settings.dataset.is_federated else
             f'{settings.partition.num_clients} clients')
  rs = settings.run
  preset = getattr(settings.hparams, 'variant', '')
  method = f'{rs.method} (preset {preset})' if preset else rs.method
  return (f'train: {method} on {data}, {clients} '
          f'({rs.clients_per_round} per round), {rs.rounds} rounds, '
          f'seed {rs.seed}; outputs in {_ROOT_DIR.value}')


def _summary(root_dir: str, result, seconds: float,
             curves: str | None) -> str:
  # From the CSV, which holds every round of the run, resumed or not.
  history = experiment.read_metrics(root_dir)
  best = experiment.best_round(history['test/accuracy'], history['round'])
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
    lines.append(f'  log:         {os.path.join(root_dir, cli.LOG_DIR)}')
  return '\n'.join(lines)


def _how_to_resume(root_dir: str) -> str:
  last = experiment.last_saved_round(root_dir)
  if last is None:
    return 'no round was checkpointed yet; run the same command to start again'
  return (f'the last good state (round {last}) is in '
          f"{os.path.join(root_dir, 'checkpoints')}; run the same command to "
          'resume')


def _train(settings: experiment.Settings, root_dir: str) -> None:
  """Trains, under the run folder's lock."""
  cli.log_to_file('train', root_dir)
  cli.handle_stop_signals()
  print(_header(settings), flush=True)
  start = time.perf_counter()
  try:
    experiment.set_context(settings)
    result = experiment.run(settings, root_dir, progress=_PROGRESS.value)
    logging.info('final %s; SavedModel: %s', result.final, result.export_dir)
    curves = None
    if _PLOT.value:
      curves = os.path.join(root_dir, 'curves.png')
      experiment.plot_runs([root_dir], curves, title=settings.run.method)
    summary = _summary(root_dir, result, time.perf_counter() - start, curves)
  except (Exception, KeyboardInterrupt) as e:  # pylint: disable=broad-except
    cli.stopped('train', e, root_dir, lambda: _how_to_resume(root_dir))
  print(summary)


def main(argv: list[str]) -> None:
  del argv  # `_parse_flags` refuses positional arguments.
  context.freeze_imported_objects()  # TF and TFF are imported by now.
  config = cli.load_config('train', _CONFIG)
  with config.unlocked():
    if _METHOD.value is not None:
      config.method = _METHOD.value
    if _SEED.value is not None:
      config.seed = _SEED.value
  with cli.one_line_errors('train', _ROOT_DIR.value):
    # Validated once, before any output or compute; the run reads only
    # the settings from here on.
    settings = experiment.from_config(config)
    # One run per folder: locked before anything is written in it.
    with experiment.locked(_ROOT_DIR.value):
      _train(settings, _ROOT_DIR.value)


def run() -> None:
  """Console-script entry point (`train`)."""
  app.run(main, flags_parser=_parse_flags)


if __name__ == '__main__':
  run()
