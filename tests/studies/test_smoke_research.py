"""The research study scripts run their real code path on the tiniest setting.

`dafkd_pool/dafkd_branch.py` on scikit-learn's digits (`DIGITS`);
`fedd3a_protocol/fedd3a_digits.py` and `fedd3a_protocol.py` on real digit
domains from the shared data folder (MNIST, USPS; skipped without it) and
the 8x8 digits, `fedd3a_protocol/pretrain.py` on the 8x8 digits
(`--dataset=digits`: no tfds build). Each runs as `python -m studies...`
(`tests/studies/test_smoke.py`'s `_run`) with 1-2 rounds, 200 images per
domain, tiny pools and 2 distillation steps; its output must hold the
fields its README's table is made from.

The four scripts start together (a thread each, at the first test): each is
a TensorFlow process that mostly compiles, and two of them side by side
take about half the wall time of one after the other. Every test writes
under its module's temporary folder; MNIST's tfds build is made there once.
"""

import concurrent.futures
import json
import os

import pytest

from tests.conftest import SHARED_DATA
from tests.studies.test_smoke import _json
from tests.studies.test_smoke import _run
from tests.studies.test_smoke import DIGITS

_SHARED_FILES = ('usps/usps.h5', 'mnist/train-images-idx3-ubyte.gz')


def _missing_shared() -> str:
  """Why the FedD3A studies cannot run here, or ''."""
  for path in _SHARED_FILES:
    if not os.path.exists(os.path.join(SHARED_DATA, path)):
      return f'shared data file {path} is missing'
  return ''


def _dafkd_branch(root) -> None:
  _run('dafkd_pool.dafkd_branch', '--seeds=0',
       f'--overrides={DIGITS},rounds=2,server_data.proxy_size=64,'
       'server_data.val_size=50,dafkd.pool_size=32,dafkd.noise_dim=8,'
       'dafkd.gan_steps=1,dafkd.generator_width=8,distill.steps=2,'
       'distill.batch_size=16', f'--out={root / "branch"}', timeout=240)


def _fedd3a_digits(root) -> None:
  # FedD3A (every branch of the record: distillation diagnostics, teacher
  # weights) and Table 2, which always reads MNIST.
  _run('fedd3a_protocol.fedd3a_digits', '--methods=fedd3a', '--rounds=1',
       '--domains=mnist,usps', '--proxy=digits', '--proxy_size=100',
       '--train_limit=200', '--val_size=50', '--distill_steps=2',
       '--table2_train=200', '--table2_epochs=1', '--table2_alphas=10',
       f'--manual_dir={SHARED_DATA}', f'--data_dir={root / "data"}',
       f'--root_dir={root / "runs"}', f'--out={root / "digits"}',
       timeout=240)


def _fedd3a_protocol(root) -> None:
  # Figure 3's protocol: each domain in turn is the pool; USPS and the 8x8
  # digits only (no tfds build, so it can run beside fedd3a_digits).
  _run('fedd3a_protocol.fedd3a_protocol', '--all_domains=usps,digits',
       '--methods=fedd3a', '--rounds=1', '--proxy_size=100',
       '--train_limit=200', '--val_size=50', '--pool_epochs=0.1',
       f'--manual_dir={SHARED_DATA}', f'--data_dir={root / "data"}',
       f'--root_dir={root / "runs"}', f'--out={root / "protocol"}',
       timeout=240)


def _pretrain(root) -> None:
  # Trains, then finds the file cached and only re-evaluates it.
  for out in ('first', 'cached'):
    _run('fedd3a_protocol.pretrain', '--dataset=digits', '--epochs=1',
         '--train_limit=200', f'--data_dir={root / "data"}',
         f'--out={root / out}', timeout=120)


_STUDIES = {'dafkd_branch': (_dafkd_branch, ''),
            'fedd3a_digits': (_fedd3a_digits, 'shared'),
            'fedd3a_protocol': (_fedd3a_protocol, 'shared'),
            'pretrain': (_pretrain, '')}


@pytest.fixture(scope='module')
def studies(request, tmp_path_factory):
  """name -> (its folder, the future of its run); the selected tests' only."""
  selected = {item.originalname.removeprefix('test_')
              for item in request.session.items
              if item.module is request.module}
  missing = _missing_shared()
  pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
  runs = {}
  for name, (fn, needs) in _STUDIES.items():
    if name in selected and not (needs and missing):
      root = tmp_path_factory.mktemp(name)
      runs[name] = (root, pool.submit(fn, root))
  yield runs
  pool.shutdown(wait=True, cancel_futures=True)


def _done(studies, name):
  """The folder of a study whose run finished (its failure is re-raised)."""
  if name not in studies:
    pytest.skip(_missing_shared())
  root, future = studies[name]
  future.result()
  return root


def test_dafkd_branch(studies):
  root = _done(studies, 'dafkd_branch')
  rows = _json(root / 'branch' / 'branch.json')['0']
  assert [r['round'] for r in rows] == [1]  # rounds - 1 rows.
  for key in ('before', 'after_a', 'after_b', 'next_before_a',
              'next_before_b'):
    assert 0.0 <= rows[0][key] <= 1.0, key
  text = (root / 'branch' / 'branch.md').read_text()
  assert text.startswith('# DaFKD two-branch rounds')
  assert '| 0 | 1 |' in text and 'Machine: ' in text


def test_fedd3a_digits(studies):
  root = _done(studies, 'fedd3a_digits')
  result = _json(root / 'digits.json')
  assert 'command' in result and 'machine' in result
  run = result['methods']['fedd3a']['0']
  assert len(run['accuracy']) == 1 and 0.0 <= run['final_accuracy'] <= 1.0
  assert set(run['domain_accuracy']) == {'mnist', 'usps'}
  assert set(run['client_weight']) == {'mnist', 'usps'}
  for key in ('ensemble_accuracy', 'uniform_accuracy',
              'labeled_accuracy_before', 'labeled_accuracy_after'):
    assert len(run[key]) == 1, key
  assert set(result['table2']) == {'epochs_0', 'epochs_1'}
  assert set(result['table2']['epochs_1']) == {'prototype',
                                               'projection_alpha_10'}
  text = (root / 'digits.md').read_text()
  assert text.startswith('# FedAvg / FedProx / FedDF / FedD3A')
  assert '| fedd3a | 0 |' in text and '## Table 2 check' in text
  assert 'steps of batch 128' in text  # The resolved settings' batch.
  assert (root / 'digits.png').exists()


def test_fedd3a_protocol(studies):
  root = _done(studies, 'fedd3a_protocol')
  result = _json(root / 'protocol.json')
  assert result['commands'] and 'machine' in result
  assert result['setting']['distill_steps'] == 1  # 0.1 pass over the pool.
  assert set(result['runs']) == {'usps', 'digits'}
  for server, client in (('usps', 'digits'), ('digits', 'usps')):
    run = result['runs'][server]['fedd3a']['0']
    assert 0.0 <= run['final_accuracy'] <= 1.0
    assert set(run['client_weight']) == {client}
  text = (root / 'protocol.md').read_text()
  assert text.startswith("# FedD3A on four digit domains, Figure 3's")
  assert '| variant | server usps | server digits |' in text
  assert '(2 domains)' in text and '## Links' in text
  assert '1 Adam steps of batch 128' in text


def test_pretrain(studies):
  root = _done(studies, 'pretrain')
  first = _json(root / 'first' / 'pretrain_cnn.json')
  cached = _json(root / 'cached' / 'pretrain_cnn.json')
  assert first['trained']['epochs_run'] == 1
  assert first['trained']['train_images'] == 200
  assert first['trained']['train_s'] >= 0
  assert cached['trained'] is None and cached['weights'] == first['weights']
  assert os.path.exists(first['weights'])
  assert cached['digits_test_accuracy'] == pytest.approx(
      first['digits_test_accuracy'], abs=2e-4)
  assert 'command' in first and 'machine' in first
