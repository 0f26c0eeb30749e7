"""notebooks/quickstart.ipynb runs headless, cell by cell, and leaves no
TFF worker behind.

The notebook is executed by nbclient in a fresh Jupyter kernel (this
virtualenv's ipykernel) with its `parameters` cell replaced by small
settings; a failing cell raises `CellExecutionError` and fails the test.
"""

import os
import time

import pytest

from tests.conftest import live_workers

nbformat = pytest.importorskip('nbformat')
nbclient = pytest.importorskip('nbclient')

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
NOTEBOOK = os.path.join(_REPO, 'notebooks', 'quickstart.ipynb')

pytestmark = pytest.mark.slow


def test_quickstart_notebook_runs_and_leaves_no_worker(tmp_path):
  nb = nbformat.read(NOTEBOOK, as_version=4)
  [params] = [c for c in nb.cells
              if 'parameters' in c.metadata.get('tags', [])]
  params.source = (f"ROUNDS = 3\nDAFKD_ROUNDS = 2\nBYO_ROUNDS = 2\n"
                   f"KERAS_APP_ROUNDS = 0\nROOT = {str(tmp_path)!r}")
  before = {p.pid for p in live_workers()}
  nbclient.NotebookClient(
      nb, timeout=600, kernel_name='python3',
      resources={'metadata': {'path': _REPO}}).execute()
  outputs = '\n'.join(
      o.get('text', '') for c in nb.cells if c.cell_type == 'code'
      for o in c.get('outputs', []) if o.get('output_type') == 'stream')
  for expected in ('fedavg: final test accuracy', 'fedgen: final test '
                   'accuracy', 'holder ratio', 'predicted',
                   "FedDF on 100 writers from FedGen's model"):
    assert expected in outputs, expected
  for png in ('curves.png', 'dafkd.png'):
    assert os.path.getsize(tmp_path / png) > 10_000, png
  # The kernel is gone, and so is every TFF worker it started.
  deadline = time.time() + 10
  while {p.pid for p in live_workers()} - before:
    assert time.time() < deadline, 'a TFF worker outlived the notebook'
    time.sleep(0.2)
