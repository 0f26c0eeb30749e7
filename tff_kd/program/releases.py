"""A run's per-round metrics (`metrics.csv`, TensorBoard, the log), kept in
step with its checkpoints.

The round loop (`tff_kd.program.loop`) releases round r's metrics before it
saves round r's checkpoint, and a resumed run first drops what was released
after its checkpoint (`drop_after`): a run killed at any instant, resumed,
holds every round exactly once in the CSV and in TensorBoard. (Saved the
other way round, a kill between the two writes lost that round's row for
good.) TensorBoard events are flushed with every round, so that a kill
loses none that the CSV holds.

The TensorBoard events also hold the run's settings, for TensorBoard's
HParams dashboard: one session-start summary (`hparams_pb`, at step 0,
which `drop_after` keeps) of its flattened config, each value a bool, int,
float or str (any other as `str(value)`: None -> 'None'). A folder of run
folders (a study over methods and seeds) then sorts and filters its runs by
any setting in the HParams tab. No `hparams_config` is written: TensorBoard
then infers the dashboard from all the runs together, each setting's type
and values from their session starts, and a metric column from each scalar
tag of a session's run (`test/accuracy`, `train/loss`, ...), at its last
(the final) round. Were each run to declare its own, TensorBoard would
pick one run's declaration for the whole study, and with it that run's
metrics only. A resumed run keeps the session start it finds, unless its
settings differ (a key that may change on resume, such as `rounds`): then
the old one is dropped and the new one written, since TensorBoard reads
only the first session start of a run.
"""

import csv
import glob
import os
from typing import Any, Callable, Mapping, Optional

from absl import logging
import numpy as np
from tensorboard.plugins.hparams import api as hparams_api
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import plugin_data_pb2
import tensorflow as tf
import tensorflow_federated as tff

METRICS_CSV = 'metrics.csv'
TENSORBOARD_DIR = 'tb'
_KEY = 'round'


class _TensorBoardReleaseManager(tff.program.ReleaseManager):
  """Scalars to TensorBoard at step `key`, flushed with every release, and
  the run's settings at step 0 (the module's docstring).

  What `tff.program.TensorBoardReleaseManager` writes for a flat dict of
  scalars, but flushed: TF's summary writer otherwise buffers up to two
  minutes of events, which a killed run loses.
  """

  def __init__(self, summary_dir: str,
               hparams: Optional[Mapping[str, Any]] = None):
    """Opens a new events file in `summary_dir`.

    Args:
      summary_dir: The TensorBoard run folder.
      hparams: The run's settings by name, recorded for the HParams
        dashboard unless the folder's events already hold them
        (`_replace_session_start`); None records none.
    """
    session_start = None if hparams is None else _session_start(hparams)
    record = session_start is not None and _replace_session_start(
        summary_dir, session_start)
    # Opened after `_replace_session_start`, which may rewrite the
    # folder's events files.
    self._writer = tf.summary.create_file_writer(summary_dir)
    if record:
      with self._writer.as_default():
        tf.summary.experimental.write_raw_pb(
            session_start.SerializeToString(), step=0)
      self._writer.flush()

  async def release(self, value: dict[str, Any], key: int) -> None:
    with self._writer.as_default():
      for name, scalar in value.items():
        if np.asarray(scalar).dtype.kind in ('b', 'i', 'u', 'f'):
          tf.summary.scalar(name, scalar, step=key)
    self._writer.flush()


def release_manager(
    root_dir: str, hparams: Optional[Mapping[str, Any]] = None
) -> tff.program.ReleaseManager:
  """The run's metrics: `metrics.csv` (one row per round), TensorBoard
  (`tb/`) and the log, keyed by round.

  Args:
    root_dir: The run folder.
    hparams: The run's settings by name (`Settings.flat_config()`), for
      TensorBoard's HParams dashboard; recorded once per run folder.
  """
  return tff.program.GroupingReleaseManager([
      tff.program.CSVFileReleaseManager(
          os.path.join(root_dir, METRICS_CSV), key_fieldname=_KEY),
      _TensorBoardReleaseManager(os.path.join(root_dir, TENSORBOARD_DIR),
                                 hparams),
      tff.program.LoggingReleaseManager(),
  ])


def _hparam_value(value: Any) -> Any:
  """A setting as the HParams plugin takes it: a bool, int, float or str
  as it is (numpy scalars as Python's), anything else as `str(value)`."""
  if isinstance(value, np.generic):
    value = value.item()
  return value if isinstance(value, (bool, int, float, str)) else str(value)


def _session_start(hparams: Mapping[str, Any]) -> tf.compat.v1.Summary:
  """The HParams plugin's session-start summary of `hparams`."""
  summary = hparams_api.hparams_pb(
      {name: _hparam_value(v) for name, v in hparams.items()})
  # TensorBoard's own copy of the proto, as TF's.
  return tf.compat.v1.Summary.FromString(summary.SerializeToString())


def _session_start_info(
    summary: tf.compat.v1.Summary
) -> Optional[plugin_data_pb2.SessionStartInfo]:
  """The HParams session-start info a summary holds, or None."""
  for value in summary.value:
    if (value.tag == hparams_metadata.SESSION_START_INFO_TAG and
        value.metadata.plugin_data.plugin_name ==
        hparams_metadata.PLUGIN_NAME):
      return hparams_metadata.parse_session_start_info_plugin_data(
          value.metadata.plugin_data.content)
  return None


def _events_files(summary_dir: str) -> list[str]:
  """A TensorBoard folder's events files, oldest first."""
  return sorted(glob.glob(os.path.join(summary_dir, 'events.out.tfevents.*')))


def _replace_session_start(summary_dir: str,
                           session_start: tf.compat.v1.Summary) -> bool:
  """Whether `session_start` is to be written: False if the folder's
  events hold exactly one session start, with its settings; else drops
  any they hold (a run resumed with other settings) and returns True."""
  wanted = _session_start_info(session_start)
  paths = _events_files(summary_dir)
  found = [info for path in paths for record in _read_records(path)[0]
           if (info := _session_start_info(_event(record).summary))]
  if len(found) == 1 and dict(found[0].hparams) == dict(wanted.hparams):
    return False
  if found:
    for path in paths:
      _rewrite_events(path, lambda e: _session_start_info(e.summary) is None)
  return True


def drop_after(root_dir: str, last_round: int) -> int:
  """Deletes the metrics of rounds after `last_round` (the checkpointed
  one a run resumes after) from the CSV and the TensorBoard events.

  Returns:
    How many CSV rows were dropped.
  """
  dropped = _drop_csv_rows_after(os.path.join(root_dir, METRICS_CSV),
                                 last_round)
  for path in _events_files(os.path.join(root_dir, TENSORBOARD_DIR)):
    # Step 0 holds the settings for the HParams dashboard: always kept.
    _rewrite_events(path, lambda e: e.step <= last_round)
  if dropped:
    logging.info('dropped the metrics of %d round(s) after round %d, which '
                 'were released but not checkpointed', dropped, last_round)
  return dropped


def _replace(path: str, write) -> None:
  """Writes `path` through a temporary file renamed over it."""
  temp = f'{path}.partial'
  write(temp)
  os.replace(temp, path)


def _drop_csv_rows_after(path: str, last_round: int) -> int:
  try:
    with open(path, newline='') as f:
      reader = csv.DictReader(f)
      fieldnames, rows = reader.fieldnames, list(reader)
  except FileNotFoundError:
    return 0
  if not fieldnames or _KEY not in fieldnames:
    return 0
  kept = [r for r in rows if int(r[_KEY]) <= last_round]
  if len(kept) == len(rows):
    return 0

  def write(temp):
    with open(temp, 'w', newline='') as f:
      writer = csv.DictWriter(f, fieldnames=fieldnames)
      writer.writeheader()
      writer.writerows(kept)

  _replace(path, write)
  return len(rows) - len(kept)


def _event(record: bytes) -> tf.compat.v1.Event:
  """An events file's record, parsed."""
  return tf.compat.v1.Event.FromString(record)


def _read_records(path: str) -> tuple[list[bytes], bool]:
  """An events file's records, and whether it was read to its end: a
  record cut short by a kill ends it early."""
  records, complete = [], True
  try:
    for record in tf.data.TFRecordDataset(path):
      records.append(record.numpy())
  except tf.errors.DataLossError:
    complete = False
  return records, complete


def _rewrite_events(path: str,
                    keep: Callable[[tf.compat.v1.Event], bool]) -> None:
  """Rewrites an events file with only the events `keep` accepts; a
  record cut short by a kill is dropped too."""
  records, complete = _read_records(path)
  kept = [r for r in records if keep(_event(r))]
  if complete and len(kept) == len(records):
    return

  def write(temp):
    with tf.io.TFRecordWriter(temp) as writer:
      for record in kept:
        writer.write(record)

  _replace(path, write)
