"""The TFF types and client inputs the federated building blocks share.

What a client receives (`client_data_type`: a dataset, a key, or a [G]
vector of keys), how its TensorFlow code unpacks it (`client_input`), and
the type helpers between Keras weights and TFF types.
"""

import collections
from typing import Callable, NamedTuple, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import local_training


ModelFn = Callable[[], tf.keras.Model]
# The statistics each client reports (summed over a round's clients), as
# `tff_kd.federated.client_works.client_stats` makes them.
CLIENT_STATS = ('loss_sum', 'num_examples', 'num_steps', 'bytes_down',
                'bytes_up', 'excluded')


DatasetFn = Callable[[tf.Tensor], tf.data.Dataset]


def client_data_type(element_spec: collections.OrderedDict,
                     dataset_fn: Optional[DatasetFn] = None, *,
                     with_id: bool = False,
                     clients_per_call: int = 1) -> tff.Type:
  """What each client receives as its data.

  Without `dataset_fn`, a `tff.SequenceType` of batches: the standard TFF
  form (datasets made elsewhere, e.g. by a `tff.program` data source). With
  `with_id` too, `OrderedDict(client_id=int32, data=<sequence>)`: methods
  with per-client state (DaFKD's discriminators, heterogeneous models) need
  to know which client a dataset belongs to, and every client needs a seed
  of its own (`ClientInput.key`).

  With `dataset_fn`, a string key `"<client_id>|<seed>|<round>"` from which
  the client builds its own dataset inside its TensorFlow computation
  (`FileClientData.dataset_fn`): the fast path. It skips the serialisation
  of a dataset graph between two computations for every client, which costs
  the TFF runtime about 0.4 s per round on the FedGen workload
  (studies/speed/fedgen_workload.py).

  With `dataset_fn` and `clients_per_call` G > 1, a [G] vector of such keys:
  one TFF client then runs G clients in turn (`group_keys`,
  `client_works.build_client_work`), '' padding the last group.
  """
  if dataset_fn is not None:
    return tff.TensorType(np.str_, [clients_per_call] if clients_per_call > 1
                          else [])
  sequence = tff.SequenceType(spec_to_type(element_spec))
  if with_id:
    return tff.types.StructWithPythonType(
        [('client_id', tff.TensorType(np.int32)), ('data', sequence)],
        collections.OrderedDict)
  return sequence


class ClientInput(NamedTuple):
  """One client's data, whichever form it arrived in.

  Attributes:
    dataset: Its batches.
    client_id: int32 id (-1 for plain sequences, which carry none).
    key: `"<client_id>|<seed>|<round>"`: the data key itself on the keyed
      path, the same string rebuilt from (id, the process seed, the round
      from the server state) on the dataset path, so both paths derive the
      same per-client seeds (`key_seed`).
  """

  dataset: tf.data.Dataset
  client_id: tf.Tensor
  key: tf.Tensor


def group_keys(keys: Sequence[str], clients_per_call: int
               ) -> list[Union[str, np.ndarray]]:
  """A round's client keys as a process with `clients_per_call` G takes them.

  G = 1: the keys themselves. G > 1: consecutive groups of G keys, each a
  [G] string array, the last one padded with '' (`execution.merge_clients` skips
  them).
  """
  if clients_per_call <= 1:
    return list(keys)
  keys = list(keys)
  return [np.array(keys[i:i + clients_per_call] +
                   [''] * max(0, i + clients_per_call - len(keys)),
                   dtype=object)
          for i in range(0, len(keys), clients_per_call)]


def key_seed(keys: tf.Tensor) -> tf.Tensor:
  """int64 seed words of client keys (a key, or a [G] vector of them):
  unique per client and round, the same on the keyed and dataset paths
  (`ClientInput.key`)."""
  return tf.strings.to_hash_bucket_fast(keys, 2**62)


def client_id_of_key(key: tf.Tensor) -> tf.Tensor:
  """The int32 client id, the first field of a `"<id>|<seed>|<round>"` key."""
  return tf.strings.to_number(tf.strings.split(key, '|')[0], tf.int32)


def client_ids_of_keys(keys: tf.Tensor) -> tf.Tensor:
  """[G] int32 client ids of a [G] vector of keys (`client_id_of_key`
  each); -1 for a padding key ('')."""
  first = tf.strings.split(keys, '|').to_tensor(default_value='')[:, 0]
  present = tf.strings.length(first) > 0
  return tf.where(present, tf.strings.to_number(
      tf.where(present, first, '-1'), tf.int32), -1)


def client_input(data, dataset_fn: Optional[DatasetFn], *, seed: int = 0,
                 round_num: Optional[tf.Tensor] = None) -> ClientInput:
  """Unpacks a client's data (see `client_data_type`) inside its TF code.

  Args:
    data: The client's key, sequence, or (client_id, sequence).
    dataset_fn: The key -> dataset function of the keyed path, or None.
    seed: The process's seed (the keys' second field).
    round_num: This round's number, from the server state; None (0 in the
      rebuilt key) for clients that draw no per-round randomness.

  Returns:
    A `ClientInput`.
  """
  if dataset_fn is not None:
    return ClientInput(dataset_fn(data), client_id_of_key(data), data)
  if isinstance(data, tf.data.Dataset):
    client_id = tf.constant(-1, tf.int32)
    dataset = data
  else:
    client_id = tf.cast(data['client_id'], tf.int32)
    dataset = data['data']
  if round_num is None:
    round_num = tf.constant(0, tf.int32)
  key = tf.strings.join([tf.strings.as_string(client_id), str(int(seed)),
                         tf.strings.as_string(round_num)], separator='|')
  return ClientInput(dataset, client_id, key)


def weights_type_of(model_fn: ModelFn) -> tff.Type:
  return spec_to_type(local_training.model_weights(
      local_training.structure_of(model_fn)))


def spec_to_type(structure) -> tff.Type:
  """TFF type of a structure of `tf.TensorSpec`s, tensors or variables."""
  return tff.to_type(tf.nest.map_structure(
      lambda v: tff.TensorType(v.dtype.as_numpy_dtype, v.shape.as_list()),
      structure))


def trainable_specs(weights: tff.learning.models.ModelWeights) -> tuple:
  """`tf.TensorSpec`s of a `ModelWeights`' trainable variables (e.g. to
  initialise a server optimiser's state)."""
  return tuple(tf.TensorSpec(v.shape, v.dtype) for v in weights.trainable)


def payload_bytes(type_spec: tff.Type) -> int:
  """Bytes of all tensors in an unplaced TFF type (fully defined shapes)."""
  total = 0
  leaves = (tff.structure.flatten(type_spec)
            if isinstance(type_spec, tff.StructType) else [type_spec])
  for leaf in leaves:
    total += int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
  return total


def tensor_specs(type_spec: tff.Type):
  """`tf.TensorSpec` structure (with Python containers) of a TFF type."""
  return tf.nest.map_structure(
      lambda t: tf.TensorSpec(t.shape, t.dtype),
      tff.types.type_to_tf_tensor_specs(type_spec))


def prototype_of_id(client_id: tf.Tensor, num_prototypes: int) -> tf.Tensor:
  """A client's prototype: its id modulo P."""
  return tf.cast(tf.math.floormod(tf.cast(client_id, tf.int64),
                                  num_prototypes), tf.int32)
