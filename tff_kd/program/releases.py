"""A run's per-round metrics (`metrics.csv`, TensorBoard, the log), kept in
step with its checkpoints.

The round loop (`tff_kd.program.loop`) releases round r's metrics before it
saves round r's checkpoint, and a resumed run first drops what was released
after its checkpoint (`drop_after`): a run killed at any instant, resumed,
holds every round exactly once in the CSV and in TensorBoard. (Saved the
other way round, a kill between the two writes lost that round's row for
good.) TensorBoard events are flushed with every round, so that a kill
loses none that the CSV holds.
"""

import csv
import glob
import os
from typing import Any

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

METRICS_CSV = 'metrics.csv'
TENSORBOARD_DIR = 'tb'
_KEY = 'round'


class _TensorBoardReleaseManager(tff.program.ReleaseManager):
  """Scalars to TensorBoard at step `key`, flushed with every release.

  What `tff.program.TensorBoardReleaseManager` writes for a flat dict of
  scalars, but flushed: TF's summary writer otherwise buffers up to two
  minutes of events, which a killed run loses.
  """

  def __init__(self, summary_dir: str):
    self._writer = tf.summary.create_file_writer(summary_dir)

  async def release(self, value: dict[str, Any], key: int) -> None:
    with self._writer.as_default():
      for name, scalar in value.items():
        if np.asarray(scalar).dtype.kind in ('b', 'i', 'u', 'f'):
          tf.summary.scalar(name, scalar, step=key)
    self._writer.flush()


def release_manager(root_dir: str) -> tff.program.ReleaseManager:
  """The run's metrics: `metrics.csv` (one row per round), TensorBoard
  (`tb/`) and the log, keyed by round."""
  return tff.program.GroupingReleaseManager([
      tff.program.CSVFileReleaseManager(
          os.path.join(root_dir, METRICS_CSV), key_fieldname=_KEY),
      _TensorBoardReleaseManager(os.path.join(root_dir, TENSORBOARD_DIR)),
      tff.program.LoggingReleaseManager(),
  ])


def drop_after(root_dir: str, last_round: int) -> int:
  """Deletes the metrics of rounds after `last_round` (the checkpointed
  one a run resumes after) from the CSV and the TensorBoard events.

  Returns:
    How many CSV rows were dropped.
  """
  dropped = _drop_csv_rows_after(os.path.join(root_dir, METRICS_CSV),
                                 last_round)
  for path in sorted(glob.glob(os.path.join(
      root_dir, TENSORBOARD_DIR, 'events.out.tfevents.*'))):
    _drop_events_after(path, last_round)
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


def _drop_events_after(path: str, last_round: int) -> None:
  """Rewrites an events file without the events of later steps; a record
  cut short by a kill is dropped too."""
  records, complete = [], True
  try:
    for record in tf.data.TFRecordDataset(path):
      records.append(record.numpy())
  except tf.errors.DataLossError:
    complete = False
  kept = [r for r in records
          if tf.compat.v1.Event.FromString(r).step <= last_round]
  if complete and len(kept) == len(records):
    return

  def write(temp):
    with tf.io.TFRecordWriter(temp) as writer:
      for record in kept:
        writer.write(record)

  _replace(path, write)
