"""The training program shared by the `train` binary and notebooks: a facade.

This module only re-exports the program's public API from the modules that
do one job each, so that callers keep one import:

* `tff_kd.program.validation`: checks the config (`validate_config`) and
  reads settings from it (`domain_names`, `image_shape`, `prototypes`,
  `prototype_weights`, `local_work`, `needs_secure_sum`), and installs the
  TFF context it asks for (`set_context`);
* `tff_kd.program.setup`: loads, holds out and partitions the data, writes
  the clients' and server's arrays, builds the method's process and the
  evaluations (`prepare`, `Experiment`, `build_dataset_process`); or takes
  a TFF `ClientData`'s own clients instead (`prepare(config, root_dir,
  client_data=..., test_data=...)`, `tff_kd.federated.tff_client_data`);
* `tff_kd.program.checkpoints`: the run folder's config check and its
  checkpoints (`load_state`);
* `tff_kd.program.loop`: the rounds (`run`, `RunResult`, `warm_up`,
  `evaluate`).

`run(config, root_dir)` validates the whole config, then loads and
partitions the data (every user error surfaces there, before any TFF
computation); resumes from the newest checkpoint in `root_dir/checkpoints`
or initialises from the seeded Keras model; per round samples clients from
(seed, round), runs `process.next`, evaluates the global model, releases the
metrics to CSV, TensorBoard and the log, and checkpoints; and exports the
final global model as a Keras SavedModel.
"""

# pylint: disable=unused-import
from tff_kd.program.checkpoints import load_state
from tff_kd.program.loop import evaluate
from tff_kd.program.loop import run
from tff_kd.program.loop import RunResult
from tff_kd.program.loop import warm_up
from tff_kd.program.setup import build_dataset_process
from tff_kd.program.setup import Experiment
from tff_kd.program.setup import is_federated
from tff_kd.program.setup import prepare
from tff_kd.program.validation import domain_names
from tff_kd.program.validation import image_shape
from tff_kd.program.validation import local_work
from tff_kd.program.validation import needs_secure_sum
from tff_kd.program.validation import PARTITIONS
from tff_kd.program.validation import prototype_weights
from tff_kd.program.validation import prototypes
from tff_kd.program.validation import set_context
from tff_kd.program.validation import validate_config
# pylint: enable=unused-import
