"""A run folder's resume bookkeeping: its config, and its checkpoints.

A run folder keeps the config it was started with (`config.json`) and the
architecture digest of each model it builds by name (`architecture.json`,
from `Settings.architectures`): `check_resumable` refuses to resume it with a
different experiment, or with a model of another architecture under the
same name (e.g. a `py:<module>:<function>` model whose code changed). A
folder saved before digests were recorded resumes unchecked on that
count, and records them from then on. The
process state is checkpointed per round under `<root>/checkpoints` by
`CheckpointManager`, a `tff.program.FileProgramStateManager` (its versions,
folders, retention and atomic renames) that writes each version as one
NumPy file (`state_files`: milliseconds, no pickle) instead of TFF's
SavedModel (0.2-0.5 s a save); versions TFF's manager wrote, in run
folders from before, still load.
`load_or_initialize` resumes from the newest readable checkpoint, setting
unreadable ones aside, or initialises from the seeded Keras model.
"""

import asyncio
import dataclasses
import json
import os
import random
from typing import Any, Optional, Union

from absl import logging
import ml_collections
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.common_libs import serializable
from tensorflow_federated.python.program import structure_utils

from tff_kd import errors
from tff_kd.methods import common
from tff_kd.methods import registry
from tff_kd.runtime import aio
from tff_kd.program import settings as settings_lib
from tff_kd.program import setup
from tff_kd.program import state_files

_CONFIG_FILE = 'config.json'
ARCHITECTURE_FILE = 'architecture.json'
# Keys that may change between a run and its resumption.
_RESUMABLE_KEYS = ('rounds', 'eval_every', 'checkpoint_every', 'export',
                   'keep_checkpoints', 'runtime.workers',
                   'runtime.worker_timeout_s', 'runtime.server_device',
                   'runtime.concurrent_clients', 'runtime.intra_op_threads',
                   'runtime.grappler')
_PREFIX = 'program_state_'  # TFF's default, which older run folders use.


class CheckpointManager(tff.program.FileProgramStateManager):
  """TFF's file state manager that says where it keeps each version.

  TFF keeps version `v` in `<root_dir>/<prefix><v>` (TFF 0.87's
  `FileProgramStateManager`), but its root and paths are private; this
  subclass keeps both facts itself.
  """

  def __init__(self, root_dir: str, *, prefix: str = _PREFIX,
               keep_total: int = 5):
    super().__init__(root_dir, prefix=prefix, keep_total=keep_total)
    self._own_root_dir = os.fspath(root_dir)
    self._own_prefix = prefix

  @property
  def root_dir(self) -> str:
    """The folder that holds one sub-folder per saved version."""
    return self._own_root_dir

  def path_for_version(self, version: int) -> str:
    """The folder of a saved version."""
    return os.path.join(self._own_root_dir, f'{self._own_prefix}{version}')

  def unreadable_dir(self) -> str:
    """Where unreadable versions are set aside: `<root_dir>_unreadable`."""
    return self._own_root_dir.rstrip(os.sep) + '_unreadable'

  async def save(self, program_state: Any, version: int) -> None:
    """Saves `program_state` as version `version` (`state_files`' format).

    As TFF's manager: the values are materialized and `Serializable`s
    saved as bytes; the version is written to `<path>_temp<NNNN>` and
    renamed into place, so a version folder is whole or absent (a killed
    write leaves debris that `run_folder.remove_debris` clears); then old
    versions are removed by `keep_total`.

    Raises:
      tff.program.ProgramStateExistsError: The version is already saved.
      TypeError: A leaf the format cannot hold (nothing is written).
      OSError: The write failed; the temporary folder is removed.
    """
    path = self.path_for_version(version)
    if tf.io.gfile.exists(path):
      raise tff.program.ProgramStateExistsError(version=version,
                                                path=self._own_root_dir)
    state = await tff.program.materialize_value(program_state)
    state = structure_utils.map_structure(
        lambda v: v.to_bytes()
        if isinstance(v, serializable.Serializable) else v, state)
    await asyncio.get_running_loop().run_in_executor(
        None, _write_version, state, path)
    logging.info('Program state saved: %s', path)
    await self._remove_old_program_state()

  async def load(self, version: int, structure: Any) -> Any:
    """The state saved as `version`, in `structure`'s containers.

    A version TFF's own manager wrote (a SavedModel: run folders from
    before this format, or TFF's `train_model` with TFF's manager) is read
    by TFF's manager.

    Raises:
      tff.program.ProgramStateNotFoundError: No such version.
      ValueError: The file is unreadable (cut, flipped) or its leaves'
        names, dtypes or shapes are not `structure`'s.
    """
    path = self.path_for_version(version)
    if not tf.io.gfile.exists(path):
      raise tff.program.ProgramStateNotFoundError(version)
    if not state_files.exists(path):
      return await super().load(version, structure)
    file = os.path.join(path, state_files.STATE_FILE)
    leaves = await asyncio.get_running_loop().run_in_executor(
        None, state_files.read_named_leaves, file)
    state_files.check_like(leaves, structure, file)
    state = state_files.unflatten_like(structure, leaves)
    state = structure_utils.map_structure(
        lambda s, v: type(s).from_bytes(v)
        if isinstance(s, serializable.Serializable) else v, structure, state)
    logging.info('Program state loaded: %s', path)
    return state


def _write_version(state: Any, path: str) -> None:
  """Writes version folder `path` through a temporary folder and a
  rename, as TFF's writer does."""
  temp = f'{path}_temp{random.randint(1000, 9999)}'
  if tf.io.gfile.exists(temp):
    tf.io.gfile.rmtree(temp)
  tf.io.gfile.makedirs(temp)
  try:
    state_files.write(state, os.path.join(temp, state_files.STATE_FILE))
    tf.io.gfile.rename(temp, path)
  except BaseException:
    if tf.io.gfile.exists(temp):
      tf.io.gfile.rmtree(temp)
    raise


def read_version_leaves(folder: str) -> list[tuple[str, Any]]:
  """A saved version's (name, leaf) pairs in TFF's flattening order,
  without the experiment's structure (either format)."""
  if state_files.exists(folder):
    return state_files.read_named_leaves(
        os.path.join(folder, state_files.STATE_FILE))
  value = tf.saved_model.load(folder)()
  value = structure_utils.map_structure(
      lambda v: v.read_value().numpy() if isinstance(v, tf.Variable) else
      (v.numpy() if isinstance(v, tf.Tensor) else v), value)
  return state_files.named_leaves(value)


def manager_for(settings: settings_lib.Settings,
                root_dir: str) -> CheckpointManager:
  """The checkpoint manager of a run folder."""
  return CheckpointManager(os.path.join(root_dir, 'checkpoints'),
                           keep_total=settings.run.keep_checkpoints)


def last_saved_round(root_dir: str) -> Optional[int]:
  """The newest checkpointed round in a run folder (what a resume starts
  after, unless that checkpoint is unreadable), or None if there is none."""
  manager = CheckpointManager(os.path.join(root_dir, 'checkpoints'))
  try:
    versions = aio.run_sync(manager.get_versions())
  except Exception:  # pylint: disable=broad-except
    return None  # For messages only: an unlistable folder has none.
  return max(versions) if versions else None


def _method_sections(method: common.Method) -> tuple[str, ...]:
  """The config sections (or a section's keys, 'distill.batch_size') only
  this method reads, as its registry entry says.

  A run folder's config is compared with a resumed run's on the shared
  sections and on its own method's sections (or keys) only.
  """
  own = (method.hparams.SECTION,) if method.hparams is not None else ()
  if not method.uses_distill:
    return own
  return own + (tuple(f'distill.{k}' for k in method.distill_keys) or
                ('distill',))


def _resume_keys(config: dict) -> dict[str, Any]:
  """The dotted keys that must match for a run to resume (see below)."""
  sections = {name: _method_sections(m)
              for name, m in registry.METHODS.items()}
  own = set(sections.get(config.get('method'), ()))
  unused = {s.split('.')[0] for m in sections.values() for s in m} - {
      s.split('.')[0] for s in own}

  def compared(key: str) -> bool:
    section = key.split('.')[0]
    # A preset's name (`<method>.variant`) is not compared, the values it
    # sets are: a run that named its preset (or left it to the default)
    # resumes one that set the same values.
    if (section in unused or key in _RESUMABLE_KEYS or
        key == f'{section}.variant'):
      return False
    # A section the method reads in part: only those keys.
    part = [s for s in own if s.startswith(f'{section}.')]
    return not part or key in part

  return {k: v for k, v in settings_lib.flat_dict(config).items()
          if compared(k)}


# `config.json`'s key for what a reader of the run's numbers must know
# (`run_notes`); not a config key, and never compared on resume.
NOTES_KEY = 'notes'


def run_notes(settings: settings_lib.Settings) -> list[str]:
  """What a reader of this run's numbers must know that the config's
  values do not say: today, that fused clients are another draw."""
  notes = []
  if (settings.runtime.client_execution == 'fused' and
      settings.method.fuses_clients):
    notes.append(
        "runtime.client_execution='fused': each client draws its batch "
        "order from its key, not from tf.data's shuffle, so this run is "
        'another draw of the same algorithm than a sequential one, not the '
        'same numbers (tff_kd.core.fused).')
  return notes


def check_resumable(settings: settings_lib.Settings, root_dir: str) -> None:
  """Refuses to resume a root_dir written by a different experiment.

  Compared key by key: the shared settings and the sections the method
  reads (`_method_sections`); other methods' sections never block. A key
  the saved run does not have (added to the settings tree since) blocks
  only if it is set away from its default; a key it has that no longer
  exists is ignored; renamed keys are compared under their new names
  (`settings.canonical_dict`). Then compares the models' architecture
  digests with those saved (`_check_architectures`). Then writes the
  settings to the folder, as a config (`Settings.to_config`, plus
  `run_notes` under `NOTES_KEY`), and the digests beside it.

  Raises:
    CheckpointError: a different experiment or architecture, or an
      unreadable `config.json` / `architecture.json`.
  """
  config = settings.to_config()
  path = os.path.join(root_dir, _CONFIG_FILE)
  if os.path.exists(path):
    try:
      with open(path) as f:
        saved = settings_lib.canonical_dict(json.load(f))
      saved_method = registry.METHODS.get(saved.get('method'))
      if saved_method is not None and isinstance(saved.get('distill'), dict):
        # Unset keys (None) ran with the saved method's defaults.
        saved['distill'] = settings_lib.method_distill(saved_method,
                                                       saved['distill'])
      saved = _resume_keys(saved)
    except (OSError, ValueError) as e:
      raise errors.CheckpointError(
          f'{path} is unreadable ({e}); use a new --root_dir') from None
    current = _resume_keys(settings_lib.canonical_dict(config.to_dict()))
    # What the saved run had where its config lacks a key: the defaults
    # its method ran with.
    defaults = settings_lib.default_config()
    defaults.distill = settings_lib.method_distill(
        settings.method, defaults.distill)
    for cls in settings_lib.method_sections():  # Not a preset's: unset.
      defaults[cls.SECTION] = dataclasses.asdict(cls())
    defaults = settings_lib.flat_dict(
        settings_lib.canonical_dict(defaults.to_dict()))
    for key in sorted(current):
      now = current[key]
      before = saved.get(key, defaults.get(key, now))
      if before != now:
        raise errors.CheckpointError(
            f'{root_dir} holds a run with a different {key!r} '
            f'({before!r} there, {now!r} now); use a new --root_dir')
  _check_architectures(settings, root_dir)
  record = config.to_dict()
  notes = run_notes(settings)
  if notes:
    record[NOTES_KEY] = notes
  with open(path, 'w') as f:
    json.dump(record, f, indent=2, sort_keys=True)
  if settings.architectures:
    with open(os.path.join(root_dir, ARCHITECTURE_FILE), 'w') as f:
      json.dump(_architecture_record(settings), f, indent=2)


def _architecture_record(settings: settings_lib.Settings) -> dict[str, Any]:
  """What `architecture.json` holds: the role, name and architecture
  digest of each model the run builds by name (`Settings.named_models`)."""
  return {'models': [
      {'role': role, 'name': name, 'digest': digest}
      for (role, name, _), digest in zip(settings.named_models,
                                         settings.architectures)]}


def _check_architectures(settings: settings_lib.Settings,
                         root_dir: str) -> None:
  """Refuses a run whose models' architecture digests differ from those
  the folder recorded. No check where either side has none: a folder
  saved before digests were recorded, or settings not prepared.

  Raises:
    CheckpointError: in one line naming the model and both digests.
  """
  path = os.path.join(root_dir, ARCHITECTURE_FILE)
  if not settings.architectures or not os.path.exists(path):
    return
  try:
    with open(path) as f:
      saved = [m['digest'] for m in json.load(f)['models']]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise errors.CheckpointError(
        f'{path} is unreadable ({e}); use a new --root_dir') from None
  models = _architecture_record(settings)['models']
  for model, before in zip(models, saved):
    if model['digest'] != before:
      which = f" ({model['role']})" if len(models) > 1 else ''
      raise errors.CheckpointError(
          f"{root_dir} holds a run of model {model['name']!r}{which} with "
          f"architecture {before}, but it builds architecture "
          f"{model['digest']} now (its layers or their shapes changed); "
          'restore the model code or use a new --root_dir')


def seeded_initial_weights(model_fn) -> tff.learning.models.ModelWeights:
  """The weights of a freshly built (seeded) Keras model."""
  model = model_fn()
  return tff.learning.models.ModelWeights(
      trainable=[v.numpy() for v in model.trainable_weights],
      non_trainable=[v.numpy() for v in model.non_trainable_weights])


def load_or_initialize(exp: setup.Experiment, manager: CheckpointManager):
  """Returns (state, completed_rounds).

  Tries the checkpoints from the newest down. When the newest ones cannot be
  read (e.g. a disk filled up or a copy was cut short while saving), the
  run resumes from the newest readable one with a warning; the unreadable
  folders are moved to `<root>/checkpoints_unreadable/` (kept, not deleted),
  so the rounds after it are re-run and saved again. When none can be read,
  a `CheckpointError` says so and nothing is moved.
  """
  initial = exp.process.initialize()
  initial = exp.process.set_model_weights(
      initial, seeded_initial_weights(exp.model_fn))
  versions = sorted(aio.run_sync(manager.get_versions()) or [])
  failures = []
  for version in reversed(versions):
    try:
      state = aio.run_sync(manager.load(version, initial))
    except Exception as e:  # pylint: disable=broad-except
      # TFF raises a mix of TF, IO and structure errors here.
      failures.append((version, _first_line(e)))
      continue
    if failures:
      _set_aside(manager, [v for v, _ in failures])
      logging.warning(
          'checkpoint(s) of round(s) %s in %s are unreadable (%s); resuming '
          'from round %d, the newest readable one. The unreadable ones are '
          'kept in %s', ', '.join(str(v) for v, _ in failures),
          manager.root_dir, failures[0][1], version, manager.unreadable_dir())
    return state, int(version)
  if failures:
    raise errors.CheckpointError(
        f'checkpoint in {manager.root_dir} is unreadable or incompatible '
        f'with this experiment: {failures[0][1]} (no readable checkpoint '
        f'among rounds {", ".join(str(v) for v in versions)})')
  return initial, 0


def _first_line(e: Exception) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def _set_aside(manager: CheckpointManager, versions: list[int]) -> None:
  """Moves unreadable checkpoint folders out of the manager's sight."""
  target = manager.unreadable_dir()
  os.makedirs(target, exist_ok=True)
  for version in versions:
    path = manager.path_for_version(version)
    dest = os.path.join(target, os.path.basename(path))
    suffix = 0
    while os.path.exists(dest):
      suffix += 1
      dest = os.path.join(target, f'{os.path.basename(path)}.{suffix}')
    os.replace(path, dest)


def load_state(settings: Union[settings_lib.Settings,
                              ml_collections.ConfigDict], root_dir: str, *,
               client_data: Any = None, test_data: Any = None):
  """The newest checkpointed process state of a run, and its round.

  For notebooks and checks: e.g. the global model is
  `Experiment.process.get_model_weights(state)`, and a method's own state
  (DaFKD's discriminator store, FedFTG's generator) is in `state` too.

  Args:
    settings: The run's settings, or its config (validated here).
    root_dir: The run's folder.
    client_data: The run's `ClientData`, if it had one (`setup.prepare`).
    test_data: Its test set.

  Returns:
    (state, completed rounds); (the initial state, 0) when nothing is saved.

  Raises:
    UserError: a bad config or data, or an unreadable checkpoint.
  """
  exp = setup.prepare(settings, root_dir, client_data=client_data,
                      test_data=test_data)
  return load_or_initialize(exp, manager_for(exp.settings, root_dir))
