"""One split for both codes: a run's data and client sample as one .npz.

`export(config, seed, path)` writes what a run of `config` with `seed`
trains, tests and distils on (`tff_kd.program.experiment.split_arrays`:
the same loading, hold-out and partition `prepare` does) and the clients
each of its rounds samples (`experiment.sample_clients`), so that the
authors' code can run the very work the library runs. Arrays (numpy, no
TensorFlow needed to read them):

* `x_train` float32 [n, H, W, C] in [-1, 1] and `y_train` int32 [n]: the
  clients' examples (the server's slices held out);
* `part_index`, `part_offsets`: client k's examples are
  `x_train[part_index[part_offsets[k]:part_offsets[k + 1]]]`;
* `x_test`, `y_test`: the whole test set;
* `val_x`, `val_y`: the server's labeled images (empty without
  `server_data.val_size`); `proxy_x`: its unlabeled ones (empty without
  a 'split' proxy);
* `test_slice_index`, `test_slice_offsets`: the FedGen recipe's per-user
  test slices (indices into `x_test`; empty for other partitions);
* `schedule` int64 [rounds, clients_per_round]: round r's clients;
* `meta`: a JSON string (the config's dataset, partition and server data
  keys, the seed, the clients' label counts).
"""

import json
from typing import Any, Sequence

import numpy as np

from tff_kd.program import experiment


def _ragged(parts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """Index arrays as (concatenation, offsets [len + 1])."""
  offsets = np.cumsum([0] + [len(p) for p in parts]).astype(np.int64)
  index = (np.concatenate(parts).astype(np.int64) if len(parts)
           else np.zeros([0], np.int64))
  return index, offsets


def export(config: Any, path: str) -> dict[str, Any]:
  """Writes the split and schedule of a run of `config` to `path` (.npz).

  Args:
    config: An experiment config (its `seed` is the run's).
    path: The .npz file to write.

  Returns:
    The `meta` dictionary written with it.
  """
  settings = experiment.from_config(config)
  split = experiment.split_arrays(settings)
  data = split.dataset
  run = settings.run
  num_clients = len(split.parts)
  schedule = np.stack([
      experiment.sample_clients(num_clients, run.clients_per_round,
                                seed=run.seed, round_num=r)
      for r in range(run.rounds)]).astype(np.int64)
  part_index, part_offsets = _ragged(split.parts)
  slice_index, slice_offsets = _ragged(split.test_slices or [])
  empty = np.zeros([0, *data.x_train.shape[1:]], np.float32)
  meta = dict(
      seed=run.seed, rounds=run.rounds,
      clients_per_round=run.clients_per_round,
      dataset=config.dataset.to_dict(), partition=config.partition.to_dict(),
      server_data=config.server_data.to_dict(),
      label_counts=[np.bincount(data.y_train[p], minlength=data.num_classes)
                    .tolist() for p in split.parts])
  np.savez(path, x_train=data.x_train, y_train=data.y_train,
           part_index=part_index, part_offsets=part_offsets,
           x_test=data.x_test, y_test=data.y_test,
           val_x=split.val_x if split.val_x is not None else empty,
           val_y=(split.val_y if split.val_y is not None
                  else np.zeros([0], np.int32)),
           proxy_x=split.proxy if split.proxy is not None else empty,
           test_slice_index=slice_index, test_slice_offsets=slice_offsets,
           schedule=schedule, meta=json.dumps(meta))
  return meta
