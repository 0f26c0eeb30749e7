"""A study: methods and named variants over seeds, resumable (`compare`).

A study runs every entry (a registered method, or a variant: a method plus
dotted config overrides, `parse_variant`) with every seed on one config,
each run in its own run folder as `train` runs it, and summarises them:

* `study_entries(methods, variants)`, `parse_seeds(items)`: the entries
  and seeds from the command line (`--methods`, `--variant` in the syntax
  `VARIANT_SYNTAX`, `--seeds`).
* `plan_study(config, entries, seeds)`: every run's whole config validated
  once, as `train` validates its config (`settings.from_config`), before
  anything runs or is written; a variant may only set keys its method
  reads; a warning the validation logs (e.g. a preset left unset) is
  logged once per study, not once per run. Returns the `StudyRun`s, in
  entry-then-seed order.
* `run_study(plan, out)`: holds the study folder's lock (`study_lock`) and
  runs the plan in order, each run in `<out>/runs/<label>_s<seed>/`
  through `loop.run` (checkpoints every round, resumes from its newest
  checkpoint), under one progress bar over every round of the study. When
  a run ends, its `record.json` is written atomically: a study started
  again skips the runs with a record of the same config, resumes the run
  it stopped in from that run's checkpoint, and runs the rest. A run whose
  training fails (`errors.TrainingError`: a non-finite loss, no usable
  client) is recorded as failed, the study goes on, and the next start
  tries it again.
* `write_study_summary(plan, out)`: `<out>/summary.md` and
  `<out>/summary.csv` (per entry: final and best test accuracy, the mean of
  the last 5 evaluated rounds, mean +- sample std over seeds and per seed;
  seconds per round without round 1, which traces; and the mean over
  rounds of each `distill/*` metric the method logs, with the share of
  rounds whose server step raised the labeled accuracy), and
  `<out>/curves.png` (`plots.plot_histories`: mean curves with +- std
  bands), all read from the run folders' `metrics.csv`.
* The statistics over seeds that the study scripts share: `mean_std`,
  `finite_mean`, `last_mean`, `mean_curve`, `seconds_per_round`.
"""

import contextlib
import copy
import csv
import io
import json
import logging
import math
import os
import re
import statistics
import sys
import time
import types
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Optional, Sequence

from absl import logging as absl_logging
import ml_collections
import tqdm

from tff_kd import errors
from tff_kd.core import links
from tff_kd.methods import registry
from tff_kd.models import names as model_names
from tff_kd.program import checkpoints
from tff_kd.program import loop
from tff_kd.program import plots
from tff_kd.program import run_folder
from tff_kd.program import settings as settings_lib
from tff_kd.program import setup
from tff_kd.runtime import context

VARIANT_SYNTAX = 'LABEL:METHOD[:KEY=VALUE[;KEY=VALUE...]]'
RUNS_DIR = 'runs'
RECORD_FILE = 'record.json'
SUMMARY_MD = 'summary.md'
SUMMARY_CSV = 'summary.csv'
CURVES_PNG = 'curves.png'
# The summary's "last rounds" mean: the last LAST evaluated rounds.
LAST = 5

_LABEL = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]*$')
# The link metrics (`tff_kd.core.links`) as `metrics.csv` names them.
_LINKS = tuple(f'distill/{name}' for name in links.NAMES)
# Links a method reports under names of its own: shared name -> its name.
# DaFKD's diagnostics (`tff_kd/methods/dafkd/diagnostics.py`) measure its
# own ensemble (eq. 7's weights on the teachers' probabilities) and the
# uniform average of those probabilities on the labeled images as
# `ensemble_accuracy_weighted` / `_uniform`. A run that logs such a name
# and not the shared one has the same values under the shared name in the
# summary (`run_stats`); its own column stays.
LINK_ALIASES = {
    'distill/ensemble_labeled_accuracy': 'distill/ensemble_accuracy_weighted',
    'distill/ensemble_labeled_accuracy_probs':
        'distill/ensemble_accuracy_uniform',
}
_BEFORE = 'distill/labeled_accuracy_before'
_AFTER = 'distill/labeled_accuracy_after'


class StudyEntry(NamedTuple):
  """One row of a study: a method, or a named variant of one.

  Attributes:
    label: The row's name, and its run folders' prefix.
    method: A registered method (`tff_kd.methods.registry`).
    overrides: Dotted config keys -> values, applied to this entry's runs
      after the study's config (empty for a plain method).
  """

  label: str
  method: str
  overrides: Mapping[str, Any] = types.MappingProxyType({})


class StudyRun(NamedTuple):
  """One (entry, seed) run of a study, with its validated settings."""

  entry: StudyEntry
  seed: int
  settings: settings_lib.Settings

  @property
  def name(self) -> str:
    """Its run folder's name under `<out>/runs/`: `<label>_s<seed>`."""
    return f'{self.entry.label}_s{self.seed}'


class StudySummary(NamedTuple):
  """What `write_study_summary` wrote.

  Attributes:
    markdown: The text of `summary.md`.
    rows: One dict per entry (`summarize_study`).
    paths: 'markdown', 'csv' and (with any finished run) 'curves' -> path.
  """

  markdown: str
  rows: list[dict[str, Any]]
  paths: dict[str, str]


# Statistics over seeds (shared with the study scripts).


def _finite(values: Iterable[float]) -> list[float]:
  return [float(v) for v in values
          if v is not None and math.isfinite(float(v))]


def finite_mean(values: Iterable[float]) -> float:
  """The mean of the finite values (NaN when there is none)."""
  values = _finite(values)
  return statistics.fmean(values) if values else math.nan


def mean_std(values: Iterable[float]) -> tuple[float, float]:
  """(mean, sample standard deviation) of the finite values.

  The std is 0 for a single value; the mean NaN for none.
  """
  values = _finite(values)
  return (finite_mean(values),
          statistics.stdev(values) if len(values) > 1 else 0.0)


def last_mean(values: Sequence[float], n: int = LAST) -> float:
  """The mean of the last `n` finite values (a run's last `n` evaluated
  rounds, where a round that was not evaluated is NaN)."""
  return finite_mean(_finite(values)[-n:])


def mean_curve(curves: Sequence[Sequence[float]]) -> list[float]:
  """The per-round mean over seeds, cut to the shortest curve."""
  if not curves:
    return []
  n = min(len(c) for c in curves)
  return [finite_mean(c[i] for c in curves) for i in range(n)]


def seconds_per_round(train_seconds: Sequence[float]) -> float:
  """The mean seconds of `process.next` without round 1, which traces
  (with round 1 when it is the only one)."""
  return finite_mean(train_seconds[1:] or train_seconds)


# Entries, seeds and the plan.


def _check_label(label: str, text: str) -> None:
  if not _LABEL.match(label):
    raise errors.ConfigError(
        f'--variant {text!r}: the label {label!r} must start with a letter '
        "or digit and hold only letters, digits, '_', '-' and '.' (it names "
        'the run folders)')


def _check_reads(entry: StudyEntry) -> None:
  """Refuses a variant key that its method does not read: another method's
  section, `distill.*` for a method without a distillation step, or a
  `distill` key outside the ones its method reads (FedFTG's)."""
  method = registry.get_method(entry.method)
  own = method.hparams.SECTION if method.hparams is not None else None
  others = {cls.SECTION for cls in settings_lib.method_sections()} - {own}
  for key in entry.overrides:
    section, _, name = key.partition('.')
    problem = None
    if section in others:
      problem = (f'{key!r} is in the {section} method\'s section; '
                 f'{entry.method} does not read it')
    elif section == 'distill' and not method.uses_distill:
      problem = (f'{entry.method} has no distillation step: it reads no '
                 f'distill.* key ({key!r})')
    elif (section == 'distill' and method.distill_keys and
          name not in method.distill_keys):
      problem = (f'{entry.method} reads only distill.'
                 f"{', distill.'.join(method.distill_keys)} ({key!r})")
    if problem:
      raise errors.ConfigError(f'--variant {entry.label!r}: {problem}')


def parse_variant(text: str) -> StudyEntry:
  """A `--variant` value: `LABEL:METHOD[:KEY=VALUE[;KEY=VALUE...]]`.

  E.g. 'dafkd_features:dafkd:dafkd.generator=feature;dafkd.aux_weight=1.0'.
  Each value is parsed as `train`'s `--config.<key>=<value>` is
  (`settings.parse_value`). Whether the keys exist and the values are good
  is checked on the whole config (`plan_study`).

  Raises:
    ConfigError: a malformed value, a label that cannot name a folder, an
      unknown method, a key set twice, or a key of a section its method
      does not read.
  """
  malformed = errors.ConfigError(
      f'malformed --variant {text!r}: expected {VARIANT_SYNTAX}, e.g. '
      "'feddf_t2:feddf:distill.temperature=2.0'")
  parts = text.split(':', 2)
  if len(parts) < 2 or not parts[0].strip() or not parts[1].strip():
    raise malformed
  label, method = parts[0].strip(), parts[1].strip()
  _check_label(label, text)
  try:
    registry.get_method(method)
  except errors.ConfigError as e:
    raise errors.ConfigError(f'--variant {text!r}: {e}') from None
  overrides = {}
  for item in (parts[2].split(';') if len(parts) == 3 else ()):
    if not item.strip():
      continue  # A trailing ';'.
    key, sep, value = item.partition('=')
    key = key.strip()
    if not sep or not key or any(c.isspace() for c in key):
      raise malformed
    if key in overrides:
      raise errors.ConfigError(f'--variant {text!r} sets {key!r} twice')
    overrides[key] = settings_lib.parse_value(value.strip())
  entry = StudyEntry(label, method, types.MappingProxyType(overrides))
  _check_reads(entry)
  return entry


def _method_entry(name: str) -> StudyEntry:
  """A `--methods` item: a method ('feddf'), or a method and one of its
  presets ('dafkd.features': `dafkd.variant=features`, docs/variants.md),
  labelled by the item.

  Raises:
    ConfigError: an unknown method or preset.
  """
  method_name, _, preset = name.partition('.')
  try:
    method = registry.get_method(method_name)
  except errors.ConfigError as e:
    raise errors.ConfigError(f'--methods: {e}') from None
  if not preset:
    return StudyEntry(name, name)
  presets = method.hparams.VARIANTS if method.hparams is not None else {}
  if preset not in presets:
    raise errors.ConfigError(
        f'--methods: {name!r}: {method_name} has '
        + (f"the presets {', '.join(presets)}" if presets else 'no presets')
        + ' (docs/variants.md)')
  return StudyEntry(name, method_name, types.MappingProxyType(
      {method.hparams.key('variant'): preset}))


def study_entries(methods: Sequence[str],
                  variants: Sequence[str] = ()) -> list[StudyEntry]:
  """The study's entries: each method of `methods` (labelled by its name;
  `<method>.<preset>` names one of its presets, `_method_entry`), then each
  `--variant` of `variants` (`parse_variant`).

  Raises:
    ConfigError: an unknown method, a bad variant, a label given twice, or
      no entry at all.
  """
  entries = [_method_entry(name.strip()) for name in methods]
  entries += [parse_variant(v) for v in variants]
  if not entries:
    raise errors.ConfigError(
        'nothing to run: name methods (--methods=fedavg,feddf) and/or '
        f'variants (--variant={VARIANT_SYNTAX})')
  seen = set()
  for entry in entries:
    if entry.label in seen:
      raise errors.ConfigError(
          f'the label {entry.label!r} is given twice; each --methods name '
          'and --variant label names one row')
    seen.add(entry.label)
  return entries


def parse_seeds(items: Sequence[Any]) -> list[int]:
  """`--seeds` (e.g. ['0', '1', '2']) as integers, each once.

  Raises:
    ConfigError: an item that is not an integer, a seed listed twice, or
      no seed.
  """
  seeds = []
  for item in items:
    text = str(item).strip()
    try:
      seed = int(text)
    except ValueError:
      raise errors.ConfigError(
          f'--seeds must be integers (e.g. --seeds=0,1,2), got {text!r}'
      ) from None
    if seed in seeds:
      raise errors.ConfigError(f'seed {seed} is listed twice in --seeds')
    seeds.append(seed)
  if not seeds:
    raise errors.ConfigError('--seeds is empty; name at least one seed, '
                             'e.g. --seeds=0,1,2')
  return seeds


def _entry_name(entry: StudyEntry) -> str:
  return (entry.label if entry.label == entry.method else
          f'{entry.label} ({entry.method})')


def _set_overrides(config: ml_collections.ConfigDict,
                   overrides: Mapping[str, Any]) -> None:
  """`settings.with_overrides`, one key at a time, with a value of the
  wrong type (refused by the ConfigDict) as a `ConfigError`."""
  for key, value in overrides.items():
    try:
      settings_lib.with_overrides(config, {key: value})
    except errors.UserError:
      raise
    except (TypeError, ValueError) as e:
      raise errors.ConfigError(
          f'bad value {value!r} for {key!r}: '
          f'{str(e).strip().splitlines()[0]}') from None


# How a study's runs run their clients (`plan_study`'s `clients`): 'fast'
# (grouped, and fused where the method's clients can be: `fast_clients`)
# or as the config says.
CLIENTS = ('fast', 'config')

# The most clients one TFF call runs under `fast_clients`.
_MOST_PER_CALL = 10


def fast_clients(settings: settings_lib.Settings) -> dict[str, Any]:
  """The `runtime` overrides that run a study's clients fastest, or {}.

  Where the config leaves the clients one per call (`runtime.
  clients_per_call=1`, 'sequential') and the method groups clients
  (`Method.groups_clients`): G = min(10, ceil(K / 2)) clients per call
  (two calls at least, one per core of a 2-core machine; K = 100 at G = 10
  was FedAvg's fastest, studies/scale/README.md), fused where the method's
  clients can be (`Method.fuses_clients`) and the model is one of the
  library's own (which `tff_kd.core.fused` runs), else in turn. Grouped
  in turn is the same round up to float round-off; fused is another draw
  of the same algorithm (each client's batch order comes from its key),
  which the run folder's `config.json` says (`notes`).

  Args:
    settings: A run's validated settings.

  Returns:
    Dotted `runtime` keys and values.
  """
  runtime, method = settings.runtime, settings.method
  group = min(_MOST_PER_CALL, -(-settings.run.clients_per_round // 2))
  if (runtime.clients_per_call != 1 or runtime.client_execution != 'sequential'
      or not method.groups_clients or group < 2):
    return {}
  out = {'runtime.clients_per_call': group}
  if method.fuses_clients and settings.model.name in model_names.MODELS:
    out['runtime.client_execution'] = 'fused'
  return out


class _OnceFilter(logging.Filter):
  """Lets each distinct warning message through once; other records pass."""

  def __init__(self):
    super().__init__()
    self._seen: set[str] = set()

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno < logging.WARNING:
      return True
    message = record.getMessage()
    if message in self._seen:
      return False
    self._seen.add(message)
    return True


@contextlib.contextmanager
def _each_warning_once() -> Iterator[None]:
  """Within the block, absl logs each distinct warning once: a study
  validates one config per run, and a warning about the shared config
  (e.g. `dafkd.variant` left unset) would otherwise repeat for every
  seed."""
  logger = absl_logging.get_absl_logger()
  once = _OnceFilter()
  logger.addFilter(once)
  try:
    yield
  finally:
    logger.removeFilter(once)


def plan_study(config: ml_collections.ConfigDict,
               entries: Sequence[StudyEntry], seeds: Sequence[int], *,
               rounds: Optional[int] = None,
               clients: str = 'fast') -> list[StudyRun]:
  """Every run of the study with its validated settings, nothing run.

  Each run's config is `config` with the entry's method, the seed,
  `rounds` (when given) and then the entry's overrides, validated whole by
  `settings.from_config` (what `train` runs); with `clients='fast'`, then
  `fast_clients`' runtime keys where they validate too (e.g. not for a
  method with several client models). The same config warns the same for
  every seed: each distinct warning is logged once (`_each_warning_once`).

  Args:
    config: The study's experiment config (`configs/`, with the command
      line's `--config.<key>` overrides); not changed.
    entries: `study_entries`.
    seeds: `parse_seeds`.
    rounds: Rounds of every run (default: the config's).
    clients: 'fast' (`fast_clients`) or 'config' (the runtime keys as the
      config and the entry set them).

  Returns:
    The runs, entry by entry, seed by seed.

  Raises:
    ConfigError: naming the entry, the seed and the first bad key; an
      unknown `clients`.
  """
  if clients not in CLIENTS:
    raise errors.ConfigError(
        f"clients={clients!r} is unknown; choose one of {', '.join(CLIENTS)}")
  plan = []
  with _each_warning_once():
    for entry in entries:
      for seed in seeds:
        plan.append(_plan_run(config, entry, seed, rounds, clients))
  return plan


def _plan_run(config: ml_collections.ConfigDict, entry: StudyEntry,
              seed: int, rounds: Optional[int], clients: str) -> StudyRun:
  """One run of `plan_study`, its config validated."""
  c = copy.deepcopy(config)
  try:
    with c.unlocked():
      _set_overrides(c, {'method': entry.method, 'seed': seed})
      if rounds is not None:
        _set_overrides(c, {'rounds': rounds})
      _set_overrides(c, entry.overrides)
    settings = settings_lib.from_config(c)
  except errors.UserError as e:
    raise type(e)(f'{_entry_name(entry)}, seed {seed}: {e}') from None
  if clients == 'fast':
    settings = _with_fast_clients(c, settings)
  return StudyRun(entry, seed, settings)


def _with_fast_clients(config: ml_collections.ConfigDict,
                       settings: settings_lib.Settings
                       ) -> settings_lib.Settings:
  """`settings` with `fast_clients`' keys, where they validate."""
  overrides = fast_clients(settings)
  if not overrides:
    return settings
  try:
    with config.unlocked():
      _set_overrides(config, overrides)
    return settings_lib.from_config(config)
  except errors.ConfigError:  # E.g. heterogeneous clients: one per call.
    return settings


# Running.


def run_dir(out: str, run: StudyRun) -> str:
  """The run folder of `run` in the study folder `out`."""
  return os.path.join(out, RUNS_DIR, run.name)


@contextlib.contextmanager
def study_lock(out: str) -> Iterator[None]:
  """Holds the study folder's lock (`run_folder.locked`): one study at a
  time writes in `out`. Re-entrant in a process.

  Raises:
    RunFolderError: an empty name, a file, a folder that cannot be created
      or written, or one another process holds.
  """
  if not out or not out.strip():
    raise errors.RunFolderError('--out is empty; name the study folder')
  stack = contextlib.ExitStack()
  try:
    stack.enter_context(run_folder.locked(out))
  except errors.RunFolderError as e:
    # The run folder's messages name train's flag.
    raise errors.RunFolderError(str(e).replace('--root_dir', '--out')
                               ) from None
  with stack:
    yield


def _jsonable(value: Any) -> Any:
  return json.loads(json.dumps(value, sort_keys=True, default=str))


def _write_atomically(path: str, text: str) -> None:
  """Writes `path` whole or not at all (a temporary file renamed)."""
  tmp = f'{path}.tmp'
  with open(tmp, 'w') as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def read_record(folder: str) -> Optional[dict[str, Any]]:
  """A run folder's `record.json`, or None (none, or unreadable)."""
  try:
    with open(os.path.join(folder, RECORD_FILE)) as f:
      record = json.load(f)
  except (OSError, ValueError):
    return None
  return record if isinstance(record, dict) else None


def finished_record(out: str, run: StudyRun) -> Optional[dict[str, Any]]:
  """The record of `run` if it finished with the same config, else None
  (it has to run, or resume)."""
  folder = run_dir(out, run)
  record = read_record(folder)
  if (record is None or record.get('error') or
      not os.path.isfile(os.path.join(folder, 'metrics.csv'))):
    return None
  if record.get('config') != _jsonable(run.settings.flat_config()):
    return None
  return record


# The TFF context the last study run installed (see `_use_context`).
_context_in_use: Optional[tuple[Any, ...]] = None


def _use_context(settings: settings_lib.Settings) -> None:
  """Installs the run's TFF context (`setup.set_context`) unless the
  previous run's is the same; a different one replaces it after its
  workers are stopped (`context.shutdown`)."""
  global _context_in_use
  rt = settings.runtime
  key = (tuple(rt.worker_addresses), settings.needs_secure_sum,
         rt.concurrent_clients, rt.intra_op_threads, rt.grappler,
         rt.worker_timeout_s)
  if key == _context_in_use:
    return
  if _context_in_use is not None:
    context.shutdown()
  setup.set_context(settings)
  _context_in_use = key


def _done_line(tag: str, record: dict[str, Any],
               history: Mapping[str, Sequence[float]]) -> str:
  """`[3/12] feddf seed 1: final 0.9120, best 0.9200 (round 28), ...`."""
  if record.get('error'):
    return f"{tag}: failed: {record['error']}"
  stats = run_stats(record['seed'], history)
  resumed = (f", resumed after round {record['resumed_after']}"
             if record.get('resumed_after') else '')
  return (f"{tag}: final {stats['final']:.4f}, best {stats['best']:.4f} "
          f"(round {stats['best_round']}), {stats['seconds_per_round']:.2f} "
          f"s/round, {record['wall_seconds']:.0f} s{resumed}")


def _run_one(run: StudyRun, folder: str, tag: str,
             bar: tqdm.tqdm) -> dict[str, Any]:
  """Runs (or resumes) one run in `folder`; writes and returns its record."""
  _use_context(run.settings)

  def on_round(metrics: Mapping[str, Any]) -> None:
    bar.set_postfix(acc=f"{metrics.get('test/accuracy', math.nan):.4f}",
                    s_per_round=f"{metrics.get('time/train_s', math.nan):.1f}")
    bar.update(1)

  t0 = time.perf_counter()
  error, result = None, None
  try:
    result = loop.run(run.settings, folder, progress=False,
                      on_round=on_round)
  except errors.TrainingError as e:  # This run diverged: the study goes on.
    error = str(e)
  except errors.UserError as e:
    # A run folder of another experiment: the study needs a new folder.
    message = str(e).replace('use a new --root_dir', 'use a new --out')
    raise type(e)(f'{tag}: {message}') from e
  record = dict(
      label=run.entry.label, method=run.entry.method, seed=run.seed,
      overrides=_jsonable(dict(run.entry.overrides)),
      config=_jsonable(run.settings.flat_config()),
      rounds=run.settings.run.rounds,
      final_accuracy=(result.final.get('test/accuracy') if result else None),
      resumed_after=result.resumed_after if result else None,
      wall_seconds=time.perf_counter() - t0, error=error)
  _write_atomically(os.path.join(folder, RECORD_FILE),
                    json.dumps(record, indent=2) + '\n')
  return record


def _write_above_bar(line: str) -> None:
  """Prints a line on stdout above the progress bar."""
  tqdm.tqdm.write(line, file=sys.stdout)


def run_study(plan: Sequence[StudyRun], out: str, *, progress: bool = True,
              echo: Optional[Callable[[str], None]] = None
              ) -> list[dict[str, Any]]:
  """Runs the plan in order in `<out>/runs/`, skipping finished runs.

  Args:
    plan: `plan_study`.
    out: The study folder.
    progress: Show one progress bar over every round of the study (stderr).
    echo: Gets one line per run when it ends or is skipped (default:
      printed on stdout, above the bar).

  Returns:
    Each run's record (`record.json`), in plan order; a failed run's has
    its `error`.

  Raises:
    UserError: the study folder cannot be used, or a run stopped on bad
      input or a failed write (naming the run); earlier runs stay finished.
  """
  echo = echo or _write_above_bar
  total = sum(r.settings.run.rounds for r in plan)
  records = []
  with study_lock(out):
    bar = tqdm.tqdm(total=total, disable=not progress, unit='round',
                    dynamic_ncols=True)
    try:
      done = 0
      for i, run in enumerate(plan, 1):
        folder = run_dir(out, run)
        tag = f'[{i}/{len(plan)}] {run.entry.label} seed {run.seed}'
        record = finished_record(out, run)
        if record is not None:
          echo(f'{tag}: finished earlier, skipped')
        else:
          bar.set_description(f'run {i}/{len(plan)} {run.entry.label} '
                              f's{run.seed}')
          saved = (checkpoints.last_saved_round(folder) if os.path.isdir(
              os.path.join(folder, 'checkpoints')) else None)
          bar.update(done + min(saved or 0, run.settings.run.rounds) - bar.n)
          record = _run_one(run, folder, tag, bar)
          echo(_done_line(tag, record, plots.read_metrics(folder)
                          if not record.get('error') else {}))
        done += run.settings.run.rounds
        bar.update(done - bar.n)
        records.append(record)
    finally:
      bar.close()
  return records


# The summary.


def run_stats(seed: int,
              history: Mapping[str, Sequence[float]]) -> dict[str, Any]:
  """One run's numbers from its `metrics.csv` (`plots.read_metrics`).

  Returns:
    seed; rounds; final, best (and best_round), last5 test accuracy;
    seconds_per_round; diagnostics: `distill/*` metric -> mean over rounds
    (a link metric's -1, not measured, left out; a link the method logs
    under its own name also under the shared one, `LINK_ALIASES`); raised:
    the share of
    rounds whose server step raised the labeled accuracy (after > before),
    None without both; history: the metrics themselves.
  """
  accuracy = list(history.get('test/accuracy', []))
  rounds = list(history.get('round', range(1, len(accuracy) + 1)))
  best, best_round = plots.best_round(accuracy, rounds)
  evaluated = _finite(accuracy)
  diagnostics = {}
  for key in sorted(k for k in history if k.startswith('distill/')):
    values = [v for v in history[key] if key not in _LINKS or v >= 0]
    value = finite_mean(values)
    if math.isfinite(value):
      diagnostics[key] = value
  for shared, own in LINK_ALIASES.items():
    if shared not in history and own in diagnostics:
      diagnostics[shared] = diagnostics[own]
  pairs = [(b, a) for b, a in zip(history.get(_BEFORE, ()),
                                  history.get(_AFTER, ()))
           if math.isfinite(b) and math.isfinite(a) and min(a, b) >= 0]
  return dict(
      seed=seed, rounds=int(rounds[-1]) if rounds else 0,
      final=evaluated[-1], best=best, best_round=best_round,
      last5=last_mean(accuracy),
      seconds_per_round=seconds_per_round(history.get('time/train_s', [])),
      diagnostics=diagnostics,
      raised=(sum(a > b for b, a in pairs) / len(pairs) if pairs else None),
      history=history)


def summarize_study(plan: Sequence[StudyRun],
                    out: str) -> list[dict[str, Any]]:
  """One row per entry of the plan, from its run folders.

  Returns:
    Dicts with label, method, overrides, runs (`run_stats` of each
    finished run, in seed order), failed ((seed, error) of each failed
    run), missing (seeds not run yet) and, with any finished run: final,
    best and last5 (mean, std), seconds_per_round, diagnostics (metric ->
    mean over seeds) and raised (mean over seeds, or None).
  """
  by_label: dict[str, tuple[StudyEntry, list[StudyRun]]] = {}
  for run in plan:
    by_label.setdefault(run.entry.label, (run.entry, []))[1].append(run)
  rows = []
  for entry, runs in by_label.values():
    done, failed, missing = [], [], []
    for run in sorted(runs, key=lambda r: r.seed):
      folder = run_dir(out, run)
      record = read_record(folder)
      if record is None:
        missing.append(run.seed)
      elif record.get('error'):
        failed.append((run.seed, record['error']))
      else:
        done.append(run_stats(run.seed, plots.read_metrics(folder)))
    rows.append(summarize_entry(entry, done, failed, missing))
  return rows


def summarize_entry(entry: StudyEntry, done: Sequence[dict[str, Any]],
                    failed: Sequence[tuple[int, str]] = (),
                    missing: Sequence[int] = ()) -> dict[str, Any]:
  """One row of `summarize_study` from its runs' numbers.

  Args:
    entry: The row's entry.
    done: `run_stats` of each finished run, in seed order.
    failed: (seed, error) of each failed run.
    missing: Seeds not run yet.

  Returns:
    The row (see `summarize_study`).
  """
  row = dict(label=entry.label, method=entry.method,
             overrides=dict(entry.overrides), runs=list(done),
             failed=list(failed), missing=list(missing))
  if done:
    keys = sorted({k for r in done for k in r['diagnostics']})
    raised = [r['raised'] for r in done if r['raised'] is not None]
    row.update(
        final=mean_std(r['final'] for r in done),
        best=mean_std(r['best'] for r in done),
        last5=mean_std(r['last5'] for r in done),
        seconds_per_round=finite_mean(r['seconds_per_round'] for r in done),
        diagnostics={k: finite_mean(r['diagnostics'].get(k, math.nan)
                                    for r in done) for k in keys},
        raised=finite_mean(raised) if raised else None)
  return row


def _pct(pair: tuple[float, float]) -> str:
  return f'{100 * pair[0]:.2f} ± {100 * pair[1]:.2f}'


def _link_columns(rows: Sequence[dict[str, Any]]) -> list[str]:
  logged = {k for row in rows for k in row.get('diagnostics', {})}
  return [k for k in _LINKS if k in logged]


def study_markdown(rows: Sequence[dict[str, Any]], *, title: str,
                   command: str = '') -> str:
  """`summary.md`: the accuracy table, the variants' overrides and the
  mechanism diagnostics of the entries that log link metrics."""
  lines = [f'# {title}', '']
  if command:
    lines += [f'`{command}`', '']
  lines += [
      'Test accuracy (%): mean ± std (sample) over seeds, then per seed; '
      f'last {LAST}: the mean of each run\'s last {LAST} evaluated rounds; '
      's/round: seconds of `process.next`, round 1 (tracing) left out.', '',
      f'| entry | method | seeds | final | per seed | best | last {LAST} '
      '| s/round |', '|---' * 8 + '|']
  for row in rows:
    seeds = ', '.join(str(r['seed']) for r in row['runs'])
    if not row['runs']:
      cells = ['', '', '', '', '']
    else:
      cells = [_pct(row['final']),
               ' / '.join(f"{100 * r['final']:.2f}" for r in row['runs']),
               _pct(row['best']), _pct(row['last5']),
               f"{row['seconds_per_round']:.2f}"]
    lines.append(f"| {row['label']} | {row['method']} | {seeds} | " +
                 ' | '.join(cells) + ' |')
  notes = []
  for row in rows:
    if row['overrides']:
      items = ', '.join(f'{k}={v!r}' for k, v in row['overrides'].items())
      notes.append(f"* `{row['label']}`: {row['method']} with {items}.")
    for seed, error in row['failed']:
      notes.append(f"* `{row['label']}` seed {seed} failed: {error}")
    if row['missing']:
      notes.append(f"* `{row['label']}`: seed(s) "
                   f"{', '.join(map(str, row['missing']))} not run yet.")
  if notes:
    lines += [''] + notes
  columns = _link_columns(rows)
  lines += ['', '## Mechanism diagnostics', '']
  if not columns:
    lines.append('No entry logs the `distill/*` link metrics '
                 '(`tff_kd/core/links.py`).')
    return '\n'.join(lines) + '\n'
  lines += [
      'The `distill/*` link metrics (`tff_kd/core/links.py`, on the '
      "server's labeled images), mean over rounds, then over seeds; after > "
      'before: the share of rounds whose server step raised the labeled '
      'accuracy. Every `distill/*` mean is in `summary.csv`.', '',
      '| entry | ' + ' | '.join(c.split('/', 1)[1] for c in columns) +
      ' | after > before |', '|---' * (len(columns) + 2) + '|']
  for row in rows:
    diagnostics = row.get('diagnostics', {})
    if not any(c in diagnostics for c in columns):
      continue
    cells = [f'{diagnostics[c]:.4f}' if c in diagnostics else ''
             for c in columns]
    raised = row.get('raised')
    cells.append('' if raised is None else f'{raised:.2f}')
    lines.append(f"| {row['label']} | " + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


_CSV_FIELDS = ('entry', 'method', 'seed', 'rounds', 'final_accuracy',
               'best_accuracy', 'best_round', 'last5_accuracy',
               'seconds_per_round', 'raised_share')
# The numbers of a run in `run_stats` -> their columns; the `mean` and
# `std` rows hold these over seeds.
_CSV_STATS = (('final', 'final_accuracy'), ('best', 'best_accuracy'),
              ('last5', 'last5_accuracy'),
              ('seconds_per_round', 'seconds_per_round'),
              ('raised', 'raised_share'))


def _csv_rows(rows: Sequence[dict[str, Any]]) -> tuple[list[str],
                                                       list[dict[str, Any]]]:
  """`summary.csv`'s columns and rows: per entry, one row per run (a failed
  run with its error), then `mean` and `std` rows over its finished runs."""
  logged = {k for row in rows for k in row.get('diagnostics', {})}
  metrics = [k for k in _LINKS if k in logged] + sorted(logged -
                                                        set(_LINKS))
  out = []
  for row in rows:
    base = dict(entry=row['label'], method=row['method'])
    for r in row['runs']:
      line = dict(base, seed=r['seed'], rounds=r['rounds'],
                  best_round=r['best_round'], **r['diagnostics'])
      line.update({column: r[key] for key, column in _CSV_STATS})
      out.append(line)
    for seed, error in row['failed']:
      out.append(dict(base, seed=seed, error=error))
    if not row['runs']:
      continue
    for i, name in enumerate(('mean', 'std')):
      line = dict(base, seed=name)
      for key, column in _CSV_STATS:
        values = [r[key] for r in row['runs'] if r[key] is not None]
        line[column] = mean_std(values)[i] if values else None
      for metric in metrics:
        values = [r['diagnostics'][metric] for r in row['runs']
                  if metric in r['diagnostics']]
        line[metric] = mean_std(values)[i] if values else None
      out.append(line)
  return [*_CSV_FIELDS, *metrics, 'error'], out


def write_study_summary(plan: Sequence[StudyRun], out: str, *,
                        command: str = '',
                        title: Optional[str] = None) -> StudySummary:
  """Writes `summary.md`, `summary.csv` and `curves.png` in `out`.

  Args:
    plan: The study's runs (`plan_study`); their folders are read.
    out: The study folder.
    command: The command line, quoted in `summary.md`.
    title: `summary.md`'s title (default: 'Study <out>').

  Returns:
    What was written (`StudySummary`).
  """
  rows = summarize_study(plan, out)
  title = title or f'Study {os.path.normpath(out)}'
  text = study_markdown(rows, title=title, command=command)
  paths = {'markdown': os.path.join(out, SUMMARY_MD),
           'csv': os.path.join(out, SUMMARY_CSV)}
  _write_atomically(paths['markdown'], text)
  fields, lines = _csv_rows(rows)
  table = io.StringIO(newline='')
  writer = csv.DictWriter(table, fieldnames=fields, restval='')
  writer.writeheader()
  for line in lines:
    writer.writerow({k: ('' if v is None or (isinstance(v, float) and
                                             math.isnan(v)) else v)
                     for k, v in line.items()})
  _write_atomically(paths['csv'], table.getvalue())
  groups = {row['label']: [r['history'] for r in row['runs']]
            for row in rows if row['runs']}
  if groups:
    paths['curves'] = os.path.join(out, CURVES_PNG)
    plots.plot_histories(groups, paths['curves'],
                         title=f'{title}: mean ± std over seeds')
  return StudySummary(text, rows, paths)
