"""The one registry of methods: feeds `--method`, configs, notebooks, tests.

A table: each method package (`tff_kd/methods/<m>/`) contributes one
`common.Method` (its `<m>_tff.METHOD`): the builder from an experiment
config, a one-line description and the hparams class of its config section.
Adding a method adds one line here.
"""

from tff_kd import errors
from tff_kd.methods import common
from tff_kd.methods.dafkd import dafkd_tff
from tff_kd.methods.fedavg import fedavg_tff
from tff_kd.methods.fedd3a import fedd3a_tff
from tff_kd.methods.feddf import feddf_tff
from tff_kd.methods.fedftg import fedftg_tff
from tff_kd.methods.fedgen import fedgen_tff
from tff_kd.methods.fedprox import fedprox_tff

METHODS: dict[str, common.Method] = {
    m.name: m for m in (
        fedavg_tff.METHOD,
        fedprox_tff.METHOD,
        feddf_tff.METHOD,
        fedd3a_tff.METHOD,
        fedgen_tff.METHOD,
        fedftg_tff.METHOD,
        dafkd_tff.METHOD,
    )
}


def get_method(name: str) -> common.Method:
  """Looks a method up by name.

  Raises:
    ConfigError: naming the unknown method and the registered ones.
  """
  if name not in METHODS:
    raise errors.ConfigError(
        f"method {name!r} is unknown; choose one of {', '.join(METHODS)}")
  return METHODS[name]
