"""Pieces for driving tff_kd processes with TFF's own program logic.

`tff.learning.programs.train_model` runs any `LearningProcess` whose clients
take `tf.data.Dataset`s, given a `tff.program.FederatedDataSource`, a
program-state manager and release managers. Two things a TFF 0.87 user hits
first are provided here:

* `ClientDataSource`: TFF's `tff.program.DatasetDataSource` fails under
  TF 2.14, because `train_model` deep-copies its iterator every round and a
  `tf.data.Dataset` cannot be copied ("cannot pickle 'Graph' object"). This
  source's iterator holds only the folder of a `FileClientData`, the local
  work and a (seed, round) pair, so it copies and serialises (program state)
  cheaply, and it samples the same clients, with the same shuffles, as
  `tff_kd.program.experiment.run` (`tff_kd.program.sampling`).
* `native_context`: `train_model` awaits value references, so it needs a
  `tff.program.NativeFederatedContext` around an async execution context,
  not the synchronous one `set_local_context` installs.

Processes whose clients receive datasets are built with
`tff_kd.program.experiment.build_dataset_process`. FedAvg, FedProx, FedDF
(one architecture) and homogeneous FedD3A take datasets. DaFKD, FedGen,
FedFTG, heterogeneous FedD3A and heterogeneous FedDF read per-client
metadata (the client id, the round) out of keyed client data and do not yet
take plain datasets (issue 14).
"""

import json
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.federated import client_data as client_data_lib
from tff_kd.federated import learning
from tff_kd.program import context
from tff_kd.program import sampling


class ClientDataSourceIterator(tff.program.FederatedDataSourceIterator):
  """Selects seeded client samples of a `FileClientData`, round by round.

  The k-th call of `select` returns the datasets of the clients that
  `sampling.sample_clients` draws for (seed, round k), each shuffled by
  (seed, round k) as in `FileClientData.dataset_from_key`.
  """

  def __init__(self, directory: str, local: client_data_lib.LocalWork, *,
               seed: int, round_num: int = 0):
    self._directory = directory
    self._local = client_data_lib.LocalWork(*local).validate()
    self._seed = int(seed)
    self._round = int(round_num)
    self._clients: Optional[client_data_lib.FileClientData] = None

  def _client_data(self) -> client_data_lib.FileClientData:
    if self._clients is None:
      self._clients = client_data_lib.FileClientData(self._directory)
    return self._clients

  def __deepcopy__(self, memo) -> 'ClientDataSourceIterator':
    return ClientDataSourceIterator(self._directory, self._local,
                                    seed=self._seed, round_num=self._round)

  @property
  def round_num(self) -> int:
    """Rounds selected so far."""
    return self._round

  @property
  def federated_type(self) -> tff.FederatedType:
    return tff.FederatedType(
        tff.SequenceType(learning.spec_to_type(
            self._client_data().element_spec)), tff.CLIENTS)

  def select(self, k: Optional[int] = None) -> list[tf.data.Dataset]:
    """The next round's k client datasets."""
    clients = self._client_data()
    if k is None:
      raise ValueError('select needs k, the number of clients per round')
    indices = sampling.sample_clients(len(clients.client_ids), k,
                                      seed=self._seed, round_num=self._round)
    keys = clients.keys(indices, seed=self._seed, round_num=self._round)
    self._round += 1
    return [clients.dataset_from_key(tf.constant(key), self._local)
            for key in keys]

  def to_bytes(self) -> bytes:
    return json.dumps(dict(directory=self._directory,
                           local=list(self._local), seed=self._seed,
                           round_num=self._round)).encode()

  @classmethod
  def from_bytes(cls, buffer: bytes) -> 'ClientDataSourceIterator':
    fields = json.loads(buffer.decode())
    return cls(fields['directory'], client_data_lib.LocalWork(
        *fields['local']), seed=fields['seed'], round_num=fields['round_num'])

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, ClientDataSourceIterator):
      return NotImplemented
    return self.to_bytes() == other.to_bytes()


class ClientDataSource(tff.program.FederatedDataSource):
  """A `tff.program.FederatedDataSource` over a `FileClientData` folder."""

  def __init__(self, client_data: client_data_lib.FileClientData,
               local: client_data_lib.LocalWork, *, seed: int):
    """Args:
      client_data: The clients' arrays (e.g. `Experiment.client_data`).
      local: The local work each client's dataset is batched for.
      seed: Seeds the client sample and the shuffles of every round.
    """
    self._iterator = ClientDataSourceIterator(client_data.directory, local,
                                              seed=seed)

  @property
  def federated_type(self) -> tff.FederatedType:
    return self._iterator.federated_type

  def iterator(self) -> ClientDataSourceIterator:
    return self._iterator.__deepcopy__({})


def native_context() -> tff.program.NativeFederatedContext:
  """An async local C++ context wrapped for TFF's program logic.

  Install it around `train_model`, e.g.
  `with tff.framework.get_context_stack().install(native_context()): ...`.
  Its `worker_binary` is reaped like the synchronous context's
  (`tff_kd.program.context`).
  """
  context.install_worker_reaper()
  return tff.program.NativeFederatedContext(
      tff.backends.native.create_async_local_cpp_execution_context())
