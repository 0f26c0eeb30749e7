"""What the fault-injection tests share: the `train` binary as a process,
its one-line errors, a run folder's metrics."""

import csv
import glob
import json
import os
import subprocess
import sys
import tempfile

import tensorflow as tf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
# The digits run of tests/helpers.py's `digits_config`, as flags.
SMALL = [f'--config={os.path.join(REPO, "configs", "digits.py")}',
         '--config.partition.num_clients=6', '--config.clients_per_round=3',
         '--config.local.amount=1', '--config.export=false', '--noprogress',
         '--noplot']


def train(*args: str, env: dict | None = None,
          **kwargs) -> subprocess.Popen:
  """Starts the `train` binary of this checkout (as tests/binaries do)."""
  return subprocess.Popen(
      [sys.executable, '-m', 'binaries.train', *args], cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3', **(env or {})},
      **kwargs)


def one_line_error(returncode: int, stderr: str, message: str,
                   program: str = 'train') -> str:
  """Checks exit code 2 and a last line `<program>: error: ...message...`
  with no traceback; returns that line."""
  assert returncode == 2, stderr[-2000:]
  assert 'Traceback' not in stderr, stderr[-2000:]
  lines = stderr.strip().splitlines()
  last = lines[-1] if lines else ''
  assert last.startswith(f'{program}: error: ') and message in last, (
      stderr[-2000:])
  return last


def main_in_process(cases: list[list[str]],
                    program: str = 'train') -> list[dict]:
  """Runs a binary's flag parser and `main` on each argument list, all in
  one process (one start-up of TensorFlow for all cases).

  Args:
    cases: Each case's arguments.
    program: The binary, a module of `binaries/` (`train`, `compare`).

  Returns:
    One dict per case: exit `code` and `stderr`.
  """
  script = '''
import contextlib, importlib, io, json, sys
from absl import flags
program = sys.argv[2]
binary = importlib.import_module('binaries.' + program)
for argv in json.loads(sys.argv[1]):
  err, code = io.StringIO(), None
  with contextlib.redirect_stderr(err):
    try:
      flags.FLAGS.unparse_flags()
      for name in [n for n in flags.FLAGS if n.startswith('config.')]:
        delattr(flags.FLAGS, name)  # The last case's overrides.
      sys.argv = [program, *argv]  # ml_collections reads overrides there.
      binary.main(binary._parse_flags(sys.argv))
    except SystemExit as e:
      code = e.code
  print(json.dumps(dict(code=code, stderr=err.getvalue())), flush=True)
'''
  # From an empty folder: a case that wrongly got as far as writing (as an
  # empty --root_dir once did: client_data/ and logs/ in the working
  # folder) writes there, not into the checkout.
  with tempfile.TemporaryDirectory() as cwd:
    proc = subprocess.run(
        [sys.executable, '-c', script, json.dumps(cases), program], cwd=cwd,
        capture_output=True, text=True, timeout=300,
        env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3',
             'PYTHONPATH': os.pathsep.join(
                 [REPO, *filter(None, [os.environ.get('PYTHONPATH')])])})
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = [json.loads(line) for line in proc.stdout.splitlines()
             if line.startswith('{')]
  assert len(results) == len(cases), proc.stdout[-2000:]
  return results


def csv_rounds(root: str) -> list[int]:
  """The rounds of `metrics.csv`, in file order."""
  with open(os.path.join(root, 'metrics.csv')) as f:
    return [int(row['round']) for row in csv.DictReader(f)]


def tensorboard_steps(root: str, tag: str = 'train/loss') -> list[int]:
  """The steps at which TensorBoard holds `tag`, over every events file."""
  steps = []
  for path in glob.glob(os.path.join(root, 'tb', 'events.out.tfevents.*')):
    for record in tf.data.TFRecordDataset(path):
      event = tf.compat.v1.Event.FromString(record.numpy())
      steps += [event.step for v in event.summary.value if v.tag == tag]
  return sorted(steps)


def debris(root: str) -> list[str]:
  """Half-written `*_temp*` files and folders anywhere in the run folder."""
  return [p for p in glob.glob(os.path.join(root, '**', '*_temp*'),
                               recursive=True)]


def read_json(path: str) -> dict:
  with open(path) as f:
    return json.load(f)
