"""Helpers shared across the test tree.

`digits_config` is the small setting of the end-to-end tests (scikit-learn's
bundled digits, 6 clients, 3 per round, 2 rounds). `smoke_config` adds a
registered method's `common.Method.smoke` overrides to it: the fast run the
contract tests (tests/program/test_resume.py, tests/faults/test_client_data.py,
test_tff_programs.py, test_server_stage.py and
tests/methods/test_hparams.py) give every method in
`tff_kd.methods.registry.METHODS`.
"""

import os
from typing import Any, Sequence

import ml_collections
import numpy as np

from configs import digits
from tff_kd.methods import registry
from tff_kd.program import checkpoints
from tff_kd.program import settings


def digits_config(**overrides: Any) -> ml_collections.ConfigDict:
  """The digits config, shrunk for tests, with dotted-key `overrides`."""
  c = digits.get_config()
  c.rounds = 2
  c.partition.num_clients = 6
  c.clients_per_round = 3
  c.local.amount = 1
  return settings.with_overrides(c, overrides)


# What every contract run shares: one local step, nothing exported.
CONTRACT = {'export': False, 'local.unit': 'steps'}

# Configurations beyond a method's smoke run that the contract tests also
# cover: name -> (method, overrides on its smoke config). Heterogeneous
# models keep per-client or per-prototype state of their own.
VARIANTS = {
    'fedd3a_hetero': ('fedd3a', {'fedd3a.client_models': 'cnn,cnn:group'}),
    'feddf_hetero': ('feddf', {'feddf.client_models': 'cnn,cnn:group'}),
}


def smoke_cases(variants: Sequence[str] = tuple(VARIANTS)) -> list[str]:
  """Every registered method, then the named `VARIANTS` (default: all)."""
  return list(registry.METHODS) + list(variants)


def case_method(case: str) -> str:
  """The registered method a case (a method or a variant) runs."""
  return VARIANTS[case][0] if case in VARIANTS else case


def method_overrides(case: str) -> dict[str, Any]:
  """A case's method, its `smoke` overrides and the variant's."""
  method = case_method(case)
  variant = VARIANTS[case][1] if case in VARIANTS else {}
  return {'method': method, **registry.get_method(method).smoke, **variant}


def smoke_config(case: str, **overrides: Any) -> ml_collections.ConfigDict:
  """A method's (or variant's) fast contract run: `digits_config`, then
  `CONTRACT`, `method_overrides(case)`, then `overrides`."""
  return digits_config(**{**CONTRACT, **method_overrides(case),
                          **overrides})


def load_state(exp, root_dir: str):
  """`experiment.load_state(exp.settings, root_dir)` for an experiment already
  prepared with the same config (any root): (the newest state in root_dir,
  its round), without building the method's process again; a build is
  most of a short run's cost."""
  return checkpoints.load_or_initialize(
      exp, checkpoints.manager_for(exp.settings, root_dir))


def saved_leaves(root_dir: str,
                 part: str | None = None) -> tuple[int, list[np.ndarray]]:
  """A run folder's newest checkpoint read as it was saved, without building
  the method's process: (its round, every leaf of the state in TFF's
  flattening order, as numpy). The leaves and their order are those of
  `experiment.load_state`'s state (`checkpoints.read_version_leaves`).

  `part` names one field of the state instead, e.g. 'global_model_weights':
  for a homogeneous process of `tff_kd.federated.composer` its leaves are
  `get_model_weights`' (checked by hand for feddf and fedd3a; FedGen's,
  DaFKD's and the heterogeneous variants' hold more than the model).
  """
  version = checkpoints.last_saved_round(root_dir)
  assert version is not None, f'no checkpoint in {root_dir}'
  path = checkpoints.CheckpointManager(
      os.path.join(root_dir, 'checkpoints')).path_for_version(version)
  leaves = checkpoints.read_version_leaves(path)
  if part is not None:
    leaves = [(n, v) for n, v in leaves
              if n == part or n.startswith(f'{part}/')]
    assert leaves, f'no field {part!r} in the state at {path}'
  return version, [np.asarray(v) for _, v in leaves]
