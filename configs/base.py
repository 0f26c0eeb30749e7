"""Defaults shared by every experiment; other configs start from this one.

Every key and default is generated from the typed settings tree
(`tff_kd.program.settings`): each section is a frozen dataclass that
documents and checks its keys (the shared ones in
`tff_kd/program/settings.py`, the distillation's in
`tff_kd/core/distillation.py`, each method's in
`tff_kd/methods/<m>/hparams.py`). The `train` binary has no other knobs
besides --method, --root_dir and --seed. Override any key on the command
line, e.g. `--config.rounds=60`.
"""

import ml_collections

from tff_kd.program import settings


def get_config() -> ml_collections.ConfigDict:
  return settings.default_config()
