"""notebooks/quickstart.ipynb runs headless, cell by cell, and leaves no
TFF worker behind.

The notebook is executed by nbclient in a fresh Jupyter kernel (this
virtualenv's ipykernel) with its `parameters` cell replaced by small
settings; a failing cell raises `CellExecutionError` and fails the test.
"""

import os
import uuid

import pytest

from tests.conftest import wait_for_no_tagged_workers
from tests.conftest import WORKER_TAG_ENV

nbformat = pytest.importorskip('nbformat')
nbclient = pytest.importorskip('nbclient')

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
NOTEBOOK = os.path.join(_REPO, 'notebooks', 'quickstart.ipynb')

pytestmark = pytest.mark.slow


def test_quickstart_notebook_runs_and_leaves_no_worker(tmp_path,
                                                     monkeypatch):
  nb = nbformat.read(NOTEBOOK, as_version=4)
  [params] = [c for c in nb.cells
              if 'parameters' in c.metadata.get('tags', [])]
  params.source = (f"ROUNDS = 2\nDAFKD_ROUNDS = 2\nBYO_ROUNDS = 2\n"
                   f"KERAS_APP_ROUNDS = 0\nROOT = {str(tmp_path)!r}")
  # The kernel, and so every TFF worker it starts, inherits the tag: other
  # programs' workers on this machine are not the notebook's.
  tag = uuid.uuid4().hex
  monkeypatch.setenv(WORKER_TAG_ENV, tag)
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
  wait_for_no_tagged_workers(tag)
