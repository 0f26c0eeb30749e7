"""The parity study's own code (studies/parity), without the authors' code.

The authors' PyTorch code never runs here (no torch in the library's
environment). What runs is everything around it: the checks that end bad
input in one line before any run, and the whole command on a stand-in
reference (`--pin_file`: a folder of one pinned file; `--reference_python`:
a script that answers the torch check and writes a run's JSON as the
reference runner does), so the split export, the runner's flags, our rows
through the `compare` run loop and the report (table, rounds, curves) run
for real on scikit-learn's digits.
"""

import csv
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from studies.parity import pins

ROOT = pathlib.Path(__file__).resolve().parents[2]
# FedGen's drift regime (20 epochs of Adam 1e-3, no decay), on digits.
DIGITS = ('dataset.name=digits,partition.min_size=2,partition.num_clients=4,'
          'clients_per_round=2,local.batch_size=64,server_data.val_size=0')

# A stand-in for the reference's Python: it passes the torch check and,
# run as the runner, records its flags and writes one record per round.
FAKE_PYTHON = '''#!{python}
import json, sys
if sys.argv[1:2] == ['-c']:
  sys.exit(0)
flags = dict(a[2:].split('=', 1) for a in sys.argv[2:])
rounds = [dict(test_accuracy=0.5 + 0.1 * r, seconds=1.0)
          for r in range(int(flags['rounds']))]
with open(flags['out'], 'w') as f:
  json.dump(dict(rounds=rounds, argv=sys.argv[1:]), f)
'''


def _pin(folder: pathlib.Path) -> dict[str, str]:
  (folder / 'model.py').write_text('# the stand-in reference\n')
  return {'model.py': pins.blob_hash(str(folder / 'model.py'))}


def test_bad_reference_input_is_refused_before_any_run(tmp_path):
  pin = pins.PINS['fedgen']
  with pytest.raises(pins.StudyError, match='--reference_dir is required'):
    pins.check_reference(None, pin)
  with pytest.raises(pins.StudyError, match='is not a folder'):
    pins.check_reference(str(tmp_path / 'missing'), pin)
  with pytest.raises(pins.StudyError, match='has no FLAlgorithms'):
    pins.check_reference(str(tmp_path), pin)
  files = _pin(tmp_path)
  pins.check_reference(str(tmp_path), pin, files)
  (tmp_path / 'model.py').write_text('# another commit\n')
  with pytest.raises(pins.StudyError, match='is not the file of .* check '
                     'out that commit'):
    pins.check_reference(str(tmp_path), pin, files)
  # The library's own Python has no torch, by design.
  with pytest.raises(pins.StudyError, match='cannot import torch, numpy, '
                     'tqdm, h5py: ModuleNotFoundError'):
    pins.check_python(sys.executable, pins.PINS['fedgen'].modules)
  with pytest.raises(pins.StudyError, match='cannot run'):
    pins.check_python(str(tmp_path / 'no_python'))


def test_the_checks_import_without_the_study_flags():
  # The study's flags (`out`, `rounds`, `seeds`, ...) would clash with the
  # binaries' in a pytest worker that imports both (`binaries.plot`).
  from absl import flags  # pylint: disable=g-import-not-at-top
  assert 'study' not in flags.FLAGS and 'reference_dir' not in flags.FLAGS


def test_blob_hash_is_gits(tmp_path):
  # `git hash-object` of b'hello\n'.
  (tmp_path / 'f').write_bytes(b'hello\n')
  assert (pins.blob_hash(str(tmp_path / 'f')) ==
          'ce013625030ba8dba906f756967f9e9ca394464a')


def _parity(tmp_path, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, '-m', 'studies.parity.parity', '--study=fedgen_drift',
       f'--work_dir={tmp_path / "work"}', f'--out={tmp_path / "out"}',
       *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'})


@pytest.mark.slow
def test_the_study_runs_both_codes_on_one_split(tmp_path):
  reference = tmp_path / 'reference'
  reference.mkdir()
  pin_file = tmp_path / 'pin.json'
  pin_file.write_text(json.dumps({'files': _pin(reference)}))
  python = tmp_path / 'python'
  python.write_text(FAKE_PYTHON.format(python=sys.executable))
  python.chmod(0o755)
  common = [f'--reference_dir={reference}', f'--reference_python={python}',
            f'--pin_file={pin_file}', '--seeds=0', '--rounds=2',
            '--ours=fedavg', '--theirs=fedavg']

  # Bad input: one line, exit code 1, and nothing run.
  proc = _parity(tmp_path, *common, f'--overrides={DIGITS},local.amount=5')
  assert proc.returncode == 1 and 'Traceback' not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "parity: error: the FedGen runner's regime 'drift'")
  assert not (tmp_path / 'work').exists()

  common.append(f'--overrides={DIGITS}')
  proc = _parity(tmp_path, *common)
  assert proc.returncode == 0, proc.stderr[-3000:]
  # The reference got the exported split and the regime's flags.
  work = tmp_path / 'work' / 'fedgen_drift'
  theirs = json.loads((work / 'theirs' / 'fedavg_s0.json').read_text())
  argv = theirs['argv']
  assert argv[0] == 'reference_fedgen.py'
  assert f'--split={work / "split_s0.npz"}' in argv
  assert {'--method=fedavg', '--seed=0', '--rounds=2', '--batch_size=64',
          '--regime=drift'} <= set(argv)
  split = np.load(work / 'split_s0.npz')
  assert split['x_test'].shape[1:] == split['x_train'].shape[1:] == (8, 8, 1)
  assert split['schedule'].shape == (2, 2)
  # The report: both codes, per round and seed.
  out = tmp_path / 'out' / 'fedgen_drift'
  with open(out / 'rounds.csv') as f:
    rows = list(csv.DictReader(f))
  assert sorted((r['code'], r['round']) for r in rows) == [
      ('ours', '1'), ('ours', '2'), ('theirs', '1'), ('theirs', '2')]
  assert [r['test_accuracy'] for r in rows if r['code'] == 'theirs'] == [
      '0.5000', '0.6000']
  table = (out / 'table.md').read_text()
  # Per seed, then final, last 5 (here both rounds) and every round.
  assert ("| authors' | fedavg | 0 | 60.00 | 60.00 ± 0.00 | 55.00 ± 0.00 | "
          '55.00 ± 0.00 |') in table
  assert '| ours | fedavg | 0 |' in table
  assert (out / 'curves.png').stat().st_size > 0
  # Finished runs are not run again.
  before = (work / 'theirs' / 'fedavg_s0.json').stat().st_mtime_ns
  assert _parity(tmp_path, *common).returncode == 0
  assert (work / 'theirs' / 'fedavg_s0.json').stat().st_mtime_ns == before
