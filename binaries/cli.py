"""What the command-line programs (`train`, `compare`) share.

* One-line errors: `fail(program, message)` prints `<program>: error:
  <message>` on stderr and exits with code 2.
* Flags: `parse_flags` is absl's parser with every error (a config file
  that cannot be loaded, an unknown config key, a bad override value, a
  stray positional argument) as one such line; `load_config` reads the
  `--config` flag's value the same way.
* Logs: `log_to_file` sends TF, TFF and absl INFO records to
  `<folder>/logs/`, leaving warnings and errors on the console.
* Stop signals: `handle_stop_signals` makes the first Ctrl-C or SIGTERM
  unwind the program (`KeyboardInterrupt`) and a second one end it at
  once; `stop_signal` names the first one received.
* Ends: `one_line_errors` turns bad input and a failed write before the
  work into one line; `stopped` ends work that stopped, in one line that
  says how to go on (a bug keeps its traceback).

No module here defines a flag: each program defines its own.
"""

import contextlib
import logging as std_logging
import os
import signal
import sys
from typing import Callable, Iterator, NoReturn, Optional

from absl import flags
from absl import logging
import ml_collections

from tff_kd import errors

LOG_DIR = 'logs'


def fail(program: str, message: str) -> NoReturn:
  """Ends the program with one line `<program>: error: <message>`, code 2."""
  print(f'{program}: error: {message}', file=sys.stderr)
  sys.exit(2)


def _cannot_write(e: OSError, folder: str) -> str:
  return (f'cannot write {e.filename or folder}: '
          f'{e.strerror or type(e).__name__}')


@contextlib.contextmanager
def one_line_errors(program: str, folder: str) -> Iterator[None]:
  """Ends the program with one line on bad input (`errors.UserError`) or a
  failed write (`OSError`, e.g. the log folder on a full disk) in the
  block; `folder` (the output folder) names a write with no file name."""
  try:
    yield
  except errors.UserError as e:
    fail(program, str(e))
  except OSError as e:
    fail(program, _cannot_write(e, folder))


def stopped(program: str, e: BaseException, folder: str,
            how_to_go_on: Callable[[], str]) -> NoReturn:
  """Ends work in `folder` that stopped on `e` with one line (its traceback
  goes to the log file). Where the work can go on (a stop signal, a failed
  write) the line ends with `how_to_go_on()`, called only then: reading a
  run's checkpoints creates their folder, which bad input must not leave.
  A bug keeps its traceback."""
  logging.info('%s stopped on %s', program, type(e).__name__, exc_info=e)
  if stop_signal() is not None:
    quiet_cancelled_tasks()
    fail(program, f'stopped by {stop_signal()}; {how_to_go_on()}')
  if isinstance(e, errors.UserError):
    fail(program, str(e))
  if isinstance(e, OSError):
    fail(program, f'{_cannot_write(e, folder)}; {how_to_go_on()}')
  raise e


def first_line(e: BaseException) -> str:
  """`<type>: <first line of the message>`, or the type alone."""
  text = str(e).strip()
  return (f'{type(e).__name__}: {text.splitlines()[0]}' if text
          else type(e).__name__)


def raised_in(e: BaseException, path: str) -> bool:
  """Whether `e` was raised while running (or compiling) the file `path`."""
  path = os.path.realpath(path)
  if isinstance(e, SyntaxError) and e.filename:
    if os.path.realpath(e.filename) == path:
      return True
  tb = e.__traceback__
  while tb is not None:
    if os.path.realpath(tb.tb_frame.f_code.co_filename) == path:
      return True
    tb = tb.tb_next
  # ml_collections reports a module without get_config() by its name.
  return (isinstance(e, AttributeError) and 'get_config' in str(e))


def parse_flags(program: str, argv: list[str],
                default_config: str) -> list[str]:
  """absl's parser, with every error as a one-line message.

  Args:
    program: The program's name, for the error line.
    argv: The command line (`sys.argv`).
    default_config: The `--config` flag's default file.

  Returns:
    The arguments absl leaves (the program's name only: a stray positional
    argument is an error).
  """
  files = [a.split('=', 1)[1] for a in argv[1:] if a.startswith('--config=')]
  config_file = files[-1] if files else default_config
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    fail(program, str(e).strip().splitlines()[0])
  except Exception as e:  # pylint: disable=broad-except
    # ml_collections runs the config file while parsing, and raises
    # AttributeError / KeyError for `--config.<unknown key>=...`.
    if (isinstance(e, OSError) or not os.path.isfile(config_file) or
        raised_in(e, config_file)):
      fail(program, f'cannot load the config file {config_file!r} (a Python '
           f'file with get_config()): {first_line(e)}')
    if isinstance(e, (AttributeError, KeyError)):
      key = str(e).strip('\'"')
      bad = [a for a in argv[1:] if a.startswith('--config.')]
      fail(program, f"config key {key!r} does not exist (in {' '.join(bad)})")
    if isinstance(e, (TypeError, ValueError)):
      fail(program, f'bad config override: {e}')
    raise
  if len(rest) > 1:
    fail(program, f'unexpected argument(s) {" ".join(rest[1:])!r}; flags '
         'are --name=value (see --help)')
  return rest


def load_config(program: str,
                holder: flags.FlagHolder) -> ml_collections.ConfigDict:
  """The value of a `config_flags.DEFINE_config_file` flag, or one line.

  config_flags defers a failed load to the value's first use.
  """
  try:
    config = holder.value
    config.keys()
  except Exception as e:  # pylint: disable=broad-except
    fail(program, f"cannot load the config file "
         f"{flags.FLAGS[holder.name].config_filename!r} (a Python file with "
         f'get_config()): {first_line(e)}')
  return config


class InternalNotices(std_logging.Filter):
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


def log_to_file(program: str, folder: str) -> Optional[str]:
  """Records go to `folder/logs`; only warnings and errors to stderr.

  Covers absl's records (TFF's and this library's) and TensorFlow's Python
  logger, which otherwise prints its INFO records itself. Does nothing when
  absl's --verbosity flag is given.

  Returns:
    The log folder, or None when the records stay on the console.
  """
  if flags.FLAGS['verbosity'].present:
    return None
  log_dir = os.path.join(folder, LOG_DIR)
  os.makedirs(log_dir, exist_ok=True)
  logging.get_absl_handler().use_absl_log_file(program, log_dir)
  flags.FLAGS.stderrthreshold = 'warning'
  # A log file that cannot be written (a full disk) must not print
  # logging's own tracebacks on the console.
  std_logging.raiseExceptions = False
  tf_logger = std_logging.getLogger('tensorflow')
  for handler in list(tf_logger.handlers):
    tf_logger.removeHandler(handler)
  tf_logger.propagate = True  # To absl's handler on the root logger.
  tf_logger.addFilter(InternalNotices())
  return log_dir


# The first SIGINT or SIGTERM received: it stops the program with one line.
_stop_signal: Optional[str] = None


def stop_signal() -> Optional[str]:
  """The name of the first stop signal received ('SIGINT'), or None."""
  return _stop_signal


def _on_stop_signal(signum: int, unused_frame) -> None:
  """Ctrl-C or SIGTERM: unwinds the program (`KeyboardInterrupt`); a second
  one ends the process at once."""
  global _stop_signal
  if _stop_signal is not None:
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return
  _stop_signal = signal.Signals(signum).name
  raise KeyboardInterrupt(_stop_signal)


def handle_stop_signals() -> None:
  """Installs the SIGINT and SIGTERM handler (`_on_stop_signal`)."""
  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, _on_stop_signal)


def quiet_cancelled_tasks() -> None:
  """Silences asyncio's reports of the tasks a stop signal cancelled.

  The signal may land inside the program's asyncio work (a release): the
  tasks it cancels are reported as "exception was never retrieved" when
  they are collected at exit, after the one line. Expected then.
  """
  std_logging.getLogger('asyncio').setLevel(std_logging.CRITICAL)
