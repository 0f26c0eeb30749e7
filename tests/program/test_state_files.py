"""The checkpoints' file format (`state_files`, `CheckpointManager`).

The golden reference is TFF's own `FileProgramStateManager` (SavedModel):
for the same state and structure, the library's manager loads the same
leaves, with the same dtypes, shapes and Python types, in the same
containers. Then what only the new format does: reject a cut or flipped
file, and a state of another shape, with the leaf's name; refuse a leaf it
cannot hold before writing anything; leave no temporary folder behind a
failed write; and still load the versions TFF's manager wrote.
"""

import asyncio
import collections
import os
from typing import NamedTuple

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_kd.program import checkpoints
from tff_kd.program import state_files


class _State(NamedTuple):
  weights: list
  counts: collections.OrderedDict
  step: object


def _state() -> _State:
  rng = np.random.default_rng(0)
  return _State(
      weights=[rng.standard_normal((3, 2)).astype(np.float32),
               rng.integers(0, 9, (4,)).astype(np.int64),
               np.array([True, False]), np.float64(2.5),
               np.zeros((0, 3), np.float32)],
      counts=collections.OrderedDict(
          b=np.int32(7), a=(np.array(1.5, np.float32), 3, 0.25, True)),
      step=b'\x00ab\x00')


def _load_both(tmp_path, state, structure=None):
  structure = state if structure is None else structure
  out = []
  for name, cls in (('tff', tff.program.FileProgramStateManager),
                    ('ours', checkpoints.CheckpointManager)):
    manager = cls(str(tmp_path / name))
    asyncio.run(manager.save(state, 1))
    out.append(asyncio.run(manager.load(1, structure)))
  return out


def _leaves(state):
  return state_files.named_leaves(state)


def test_loads_what_tffs_own_manager_loads(tmp_path):
  theirs, ours = _load_both(tmp_path, _state())
  assert type(ours) is _State
  assert type(ours.counts) is collections.OrderedDict
  assert list(ours.counts) == ['b', 'a']
  assert len(_leaves(ours)) == len(_leaves(theirs)) == 11
  for (name, got), (want_name, want) in zip(_leaves(ours), _leaves(theirs)):
    assert name == want_name
    assert type(got) is type(want), (name, type(got), type(want))
    if isinstance(want, bytes):
      assert got == want == b'\x00ab\x00'
    else:
      assert got.dtype == want.dtype and np.shape(got) == np.shape(want), name
      np.testing.assert_array_equal(got, want)


def test_the_file_is_one_npz_read_without_pickle(tmp_path):
  manager = checkpoints.CheckpointManager(str(tmp_path))
  asyncio.run(manager.save(_state(), 3))
  folder = manager.path_for_version(3)
  assert os.listdir(folder) == [state_files.STATE_FILE]
  with np.load(os.path.join(folder, state_files.STATE_FILE),
               allow_pickle=False) as z:
    assert str(z['__format__']) == state_files.FORMAT
    assert list(z['__names__'])[:2] == ['weights/0', 'weights/1']
  names = [n for n, _ in checkpoints.read_version_leaves(folder)]
  assert names == [n for n, _ in _leaves(_state())]


@pytest.mark.parametrize('damage', ['flip', 'cut', 'garbage'])
def test_a_damaged_file_is_an_error_not_another_state(tmp_path, damage):
  manager = checkpoints.CheckpointManager(str(tmp_path))
  asyncio.run(manager.save(_state(), 1))
  path = os.path.join(manager.path_for_version(1), state_files.STATE_FILE)
  data = bytearray(open(path, 'rb').read())
  if damage == 'flip':
    # A byte of the first leaf's float data (after its .npy header).
    at = data.index(np.asarray(_state().weights[0]).tobytes()) + 5
    data[at] ^= 0x10
  elif damage == 'cut':
    data = data[:len(data) // 2]
  else:
    data = b'\x00garbage' * 10
  with open(path, 'wb') as f:
    f.write(bytes(data))
  with pytest.raises(ValueError, match='not a readable state file'):
    asyncio.run(manager.load(1, _state()))


def test_a_state_of_another_shape_names_the_leaf(tmp_path):
  manager = checkpoints.CheckpointManager(str(tmp_path))
  asyncio.run(manager.save(_state(), 1))
  other = _state()
  other.weights[0] = np.zeros((3, 5), np.float32)
  with pytest.raises(ValueError, match=r'leaf weights/0 is float32\[3, 2\], '
                     r"this experiment's weights/0 is float32\[3, 5\]"):
    asyncio.run(manager.load(1, other))
  fewer = _state()
  fewer.weights.pop()
  with pytest.raises(ValueError, match="holds 11 leaves, this experiment's "
                     'state 10'):
    asyncio.run(manager.load(1, fewer))


def test_a_leaf_it_cannot_hold_is_refused_before_writing(tmp_path):
  manager = checkpoints.CheckpointManager(str(tmp_path))
  state = _state()._replace(step=np.array([b'a', 'b'], dtype=object))
  with pytest.raises(TypeError, match="leaf 'step' is a ndarray of dtype "
                     'object'):
    asyncio.run(manager.save(state, 1))
  assert os.listdir(tmp_path) == []


def test_a_failed_write_leaves_no_temporary_folder(tmp_path, monkeypatch):
  manager = checkpoints.CheckpointManager(str(tmp_path))

  def full(state, path):
    with open(path, 'wb') as f:
      f.write(b'half')
    raise OSError(28, 'No space left on device', path)

  monkeypatch.setattr(state_files, 'write', full)
  with pytest.raises(OSError, match='No space left'):
    asyncio.run(manager.save(_state(), 1))
  assert os.listdir(tmp_path) == []
  assert asyncio.run(manager.get_versions()) is None


def test_versions_tffs_manager_wrote_still_load(tmp_path):
  # A run folder from before the format: TFF's SavedModel versions, then
  # one of ours; both load, and keep_total counts both.
  asyncio.run(tff.program.FileProgramStateManager(str(tmp_path)).save(
      _state(), 0))
  manager = checkpoints.CheckpointManager(str(tmp_path), keep_total=2)
  newer = _state()
  newer.counts['b'] = np.int32(8)
  asyncio.run(manager.save(newer, 1))
  assert asyncio.run(manager.get_versions()) == [0, 1]
  old = asyncio.run(manager.load(0, _state()))
  assert old.counts['b'] == 7 and old.step == b'\x00ab\x00'
  assert asyncio.run(manager.load(1, _state())).counts['b'] == 8
  names = [n for n, _ in checkpoints.read_version_leaves(
      manager.path_for_version(0))]
  assert names == [n for n, _ in _leaves(_state())]
