"""The references the parity study runs, and the checks of its inputs.

Flag-free, so that tests (and other tools) can import it without the
study's command-line flags: each pinned reference (`PINS`: repository,
commit, the git blob hash of every file the study reads, its patch, its
runner and the modules its Python must import) and the checks that end
bad input in one line before any run (`StudyError`).
"""

import hashlib
import os
import subprocess
from typing import NamedTuple, Optional, Sequence

from studies import common


class Pin(NamedTuple):
  """A reference at a commit: the files the study reads, by git blob hash,
  the study's patch of them (None: run as they are), its runner and the
  modules its Python must import."""

  repository: str
  commit: str
  files: dict[str, str]
  patch: Optional[str]
  runner: str
  modules: tuple[str, ...] = ('torch', 'numpy')


PINS = {
    'dafkd': Pin(
        'haozhaowang/DaFKD2023', '39a536c371a557461a26cf9a912150b0e5dfd3e2',
        {'DaFKD.py': 'c70b8dbc8d705544c343357ae8835170d42a51d0',
         'client.py': 'a00bd6a099d3c76f2fdcd31cc1a163ce7f3d41c0',
         'utils.py': 'a5e131253153e4b9186fa3ede129ef90f9c4c809',
         'model/gan.py': '08c16eef04368cfeac1e2449033e1b01730df768',
         'model/model_multitask.py':
             '1ffacca3e7a312ea9a3d6cedb87576594b8b861c',
         'trainer/my_model_trainer_MTL.py':
             '56063e3957977e87b1a9c00268b7ba2cf35abfaa'},
        'dafkd.patch', 'reference_dafkd.py'),
    'fedgen': Pin(
        'zhuangdizhu/FedGen', 'dd5807c5625404e99035d97e2ef8c712c2e007a6',
        {f'FLAlgorithms/{name}': blob for name, blob in (
            ('optimizers/fedoptimizer.py',
             '326476959541c68a0b982ac3ee099ad95aecc60c'),
            ('servers/serverFedDistill.py',
             '44386b7d165df277fe966509a762d4a6e3dbc8a9'),
            ('servers/serverFedProx.py',
             '7bf3ac52dd4963c93f1222580b7c9c8c5ea56c61'),
            ('servers/serveravg.py',
             '61202e264b86d5467f8fab477bc9225e029cc9cf'),
            ('servers/serverbase.py',
             '319bce96ddaffaf589292854b5d15883cfe00d5b'),
            ('servers/serverpFedEnsemble.py',
             '303a97d568edf37a69c57d3f64e0700772490281'),
            ('servers/serverpFedGen.py',
             '487157c917cbc5f976a4fc51f2a5037edd682825'),
            ('trainmodel/generator.py',
             'de81e9002fa3ec9db2d0850aa01e14685826e4ab'),
            ('trainmodel/models.py',
             '5141932c9a31fa37af34e32092d917948119dce6'),
            ('users/userFedDistill.py',
             '5efabceccd1f2ba6762feb8dbbe7cd3f56606b21'),
            ('users/userFedProx.py',
             'fbb625a903048ec5ee06b8a881de1d2e324e8538'),
            ('users/userGen.py', '66dda17fb3687e48e262ff8adef1348ef01314f8'),
            ('users/useravg.py', '26c12f90d290236ffe582e8301b87d1e9f5a649b'),
            ('users/userbase.py', 'fb96fd3b5ed6ac9b9e88913bb27589efba98d73d'),
            ('users/userpFedEnsemble.py',
             '0ec8498d903f465ad12ed9112b3aa3b167142cc6'),
            ('users/userpFedGen.py',
             '6f6609b3aeeed069ffd03b517ad911d824fcae6d'))} | {
                 'utils/__init__.py':
                     'e69de29bb2d1d6434b8b29ae775ad8c2e48c5391',
                 'utils/model_config.py':
                     '423654c02967ff5959ece9028c367f1d436afdf5',
                 'utils/model_utils.py':
                     '475f021aaca5c516d31917f7f0fe11ed5b26fd40',
                 'utils/plot_utils.py':
                     '54b1d4e3cba47b1f361d33f53b9bcc7bcbd53342'},
        None, 'reference_fedgen.py',
        # Imported by its servers and utils (torchvision the runner stubs).
        ('torch', 'numpy', 'tqdm', 'h5py')),
}


class StudyError(Exception):
  """Bad input to the study: one line, before any run."""


def blob_hash(path: str) -> str:
  """Git's blob SHA-1 of a file (what `git ls-tree` lists)."""
  with open(path, 'rb') as f:
    data = f.read()
  return hashlib.sha1(b'blob %d\0' % len(data) + data).hexdigest()


def check_reference(directory: Optional[str], pin: Pin,
                    files: Optional[dict[str, str]] = None) -> None:
  """Raises `StudyError` unless `directory` holds the pinned files."""
  if not directory:
    raise StudyError(f'--reference_dir is required: a checkout of '
                     f'{pin.repository} at {pin.commit[:7]}')
  if not os.path.isdir(directory):
    raise StudyError(f'--reference_dir={directory} is not a folder (a '
                     f'checkout of {pin.repository} at {pin.commit[:7]})')
  for name, expected in (files or pin.files).items():
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
      raise StudyError(f'{directory} has no {name}: not a checkout of '
                       f'{pin.repository}')
    if blob_hash(path) != expected:
      raise StudyError(
          f'{directory}/{name} is not the file of {pin.repository} at '
          f'{pin.commit[:7]} (git blob {blob_hash(path)[:7]}, pinned '
          f'{expected[:7]}): check out that commit')


def check_python(python: Optional[str],
                 modules: Sequence[str] = ('torch', 'numpy')) -> None:
  """Raises `StudyError` unless `python` imports `modules`."""
  names = ', '.join(modules)
  if not python:
    raise StudyError(f'--reference_python is required: a Python with '
                     f'{names} (studies/parity/README.md, "Set-up")')
  try:
    proc = subprocess.run([python, '-c', f'import {names}'],
                          capture_output=True, text=True, check=False)
  except OSError as e:
    raise StudyError(f'--reference_python={python} cannot run: '
                     f'{e.strerror}') from None
  if proc.returncode:
    raise StudyError(f'--reference_python={python} cannot import {names}: '
                     f'{common.error_line(proc.stderr)}')
