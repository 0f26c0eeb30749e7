"""A program state as one `.npz` file: the checkpoints' format.

TFF 0.87's `tff.program.FileProgramStateManager` writes each version as a
SavedModel: it wraps every leaf in a `tf.Variable` and traces a
`tf.function` that returns the structure, about 0.4 s for a DaFKD state on
2 cores, and reads it back with `tf.saved_model.load`, about 0.25 s. A
round of FedAvg's fused clients on digits takes 0.2 s, so the default
checkpoint of every round cost more than the round. This module writes the
same leaves, in the order TFF flattens them
(`structure_utils.flatten_with_name`), as one uncompressed NumPy `.npz`
(a zip of `.npy` files, read with `allow_pickle=False`: no pickle), in
milliseconds (`studies/speed/results/checkpoint_format.md`).

What a leaf may be, and what it reads back as (what TFF's SavedModel
reading gives): a NumPy array or scalar of a non-object dtype (its dtype
and shape; a 0-d array reads back as a NumPy scalar, as a scalar tensor's
`.numpy()` does); a Python bool, int or float (the dtype
`tf.convert_to_tensor` gives it: bool, int32, float32); `bytes` or `str`
(`bytes`, as a string tensor reads back; a TFF `Serializable` is saved as
its bytes); None. Anything else is refused when saving, with its name.

The zip's CRC-32 of every member is checked on reading, so a cut or
flipped file is an error, not a silently different state. The file holds
the leaves' names (`__names__`), so it can be read without the structure
(`read_named_leaves`), e.g. to compare two runs' states.
"""

import io
import os
import zipfile
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from tensorflow_federated.python.program import structure_utils

# One version's file, inside the manager's `<prefix><version>` folder.
STATE_FILE = 'state.npz'
FORMAT = 'tff_kd.state.v1'
_FORMAT_KEY = '__format__'
_NAMES_KEY = '__names__'
_KINDS_KEY = '__kinds__'
# How a leaf is stored, and so read back.
_ARRAY, _SCALAR, _BYTES, _NONE = 'array', 'scalar', 'bytes', 'none'


def _leaf_key(index: int) -> str:
  return f'leaf_{index:05d}'


def _encode(name: str, value: Any) -> tuple[str, np.ndarray]:
  """(kind, array) for one leaf; TypeError for a leaf this format cannot
  hold."""
  if value is None:
    return _NONE, np.zeros((0,), np.uint8)
  if isinstance(value, str):
    value = value.encode('utf-8')
  if isinstance(value, (bytes, np.bytes_)):
    return _BYTES, np.frombuffer(bytes(value), np.uint8)
  if isinstance(value, (bool, int, float)) and not isinstance(
      value, np.generic):
    value = tf.convert_to_tensor(value).numpy()
  if isinstance(value, (np.ndarray, np.generic)) and value.dtype != object:
    array = np.asarray(value)
    return (_ARRAY if isinstance(value, np.ndarray) and value.ndim else
            _SCALAR), array
  raise TypeError(f'the program state leaf {name!r} is a '
                  f'{type(value).__name__}{_dtype_note(value)}: a checkpoint '
                  'holds NumPy arrays and scalars of numbers, bool, bytes, '
                  'str and None')


def _dtype_note(value: Any) -> str:
  dtype = getattr(value, 'dtype', None)
  return f' of dtype {dtype}' if dtype is not None else ''


def _decode(kind: str, array: np.ndarray) -> Any:
  if kind == _NONE:
    return None
  if kind == _BYTES:
    return array.tobytes()
  if kind == _SCALAR:
    return array[()]
  return array


def named_leaves(state: Any) -> list[tuple[str, Any]]:
  """(name, leaf) pairs of a program state, in TFF's flattening order."""
  return structure_utils.flatten_with_name(state)


def write(state: Any, path: str) -> None:
  """Writes a (materialized) program state's leaves to the file `path`.

  Raises:
    TypeError: A leaf this format cannot hold (before anything is written).
    OSError: The write failed (e.g. ENOSPC); `path` may be left partial.
  """
  leaves = named_leaves(state)
  names, kinds, arrays = [], [], {}
  for index, (name, value) in enumerate(leaves):
    kind, array = _encode(name, value)
    names.append(name)
    kinds.append(kind)
    arrays[_leaf_key(index)] = array
  arrays[_FORMAT_KEY] = np.array(FORMAT)
  arrays[_NAMES_KEY] = np.array(names, dtype=str)
  arrays[_KINDS_KEY] = np.array(kinds, dtype=str)
  # Built in memory, then one write through tf.io.gfile (any file system
  # TFF's own manager supports).
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  with tf.io.gfile.GFile(path, 'wb') as f:
    f.write(buffer.getvalue())


def read_named_leaves(path: str) -> list[tuple[str, Any]]:
  """The (name, leaf) pairs written by `write`, in their order.

  Raises:
    ValueError: The file is not a whole state file of this format (cut,
      flipped, another format), with what is wrong.
  """
  with tf.io.gfile.GFile(path, 'rb') as f:
    data = f.read()
  try:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
      members = {key: z[key] for key in z.files}
  except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
    raise ValueError(f'{path} is not a readable state file: '
                     f'{str(e) or type(e).__name__}') from None
  found = members.get(_FORMAT_KEY)
  if found is None or str(found) != FORMAT:
    raise ValueError(f'{path} is not a {FORMAT} state file (format '
                     f'{None if found is None else str(found)!r})')
  names = [str(n) for n in members[_NAMES_KEY]]
  kinds = [str(k) for k in members[_KINDS_KEY]]
  if len(names) != len(kinds) or any(
      _leaf_key(i) not in members for i in range(len(names))):
    raise ValueError(f'{path} lacks some of its {len(names)} leaves')
  return [(name, _decode(kind, members[_leaf_key(i)]))
          for i, (name, kind) in enumerate(zip(names, kinds))]


def _describe(value: Any) -> str:
  if value is None or isinstance(value, bytes):
    return type(value).__name__
  return f'{np.asarray(value).dtype}{list(np.shape(value))}'


def check_like(leaves: Sequence[tuple[str, Any]], structure: Any,
               path: str) -> None:
  """Raises ValueError unless the saved leaves have the names, dtypes and
  shapes of `structure`'s (the experiment's initial state)."""
  expected = named_leaves(structure)
  if len(leaves) != len(expected):
    raise ValueError(f'{path} holds {len(leaves)} leaves, this experiment\'s '
                     f'state {len(expected)}')
  for (name, value), (want_name, want) in zip(leaves, expected):
    if isinstance(want, (bytes, str)) or want is None or hasattr(
        want, 'to_bytes'):
      continue  # Serialized values and None: no dtype to compare.
    # The experiment's leaf as `write` would store it (Python scalars get
    # TF's dtypes).
    got, wanted = _describe(value), _describe(
        _decode(*_encode(want_name, want)))
    if name != want_name or got != wanted:
      raise ValueError(f'{path}: leaf {name} is {got}, this experiment\'s '
                       f'{want_name} is {wanted}')


def unflatten_like(structure: Any, leaves: Sequence[tuple[str, Any]]) -> Any:
  """The saved leaves in `structure`'s containers."""
  return structure_utils.unflatten_as(structure, [v for _, v in leaves])


def exists(folder: str) -> bool:
  """Whether a version folder holds this format's file (else it is a
  SavedModel of TFF's own manager, or of this library before it)."""
  return tf.io.gfile.exists(os.path.join(folder, STATE_FILE))
