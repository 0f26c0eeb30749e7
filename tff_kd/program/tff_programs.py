"""Pieces for driving tff_kd processes with TFF's own program logic.

`tff.learning.programs.train_model` runs any `LearningProcess` whose clients
take `tf.data.Dataset`s, given a `tff.program.FederatedDataSource`, a
program-state manager, release managers and optionally an evaluation
manager. What a TFF 0.87 user needs for that and does not get from TFF:

* `ClientDataSource`: TFF's `tff.program.DatasetDataSource` fails under
  TF 2.14, because `train_model` deep-copies its iterator every round and a
  `tf.data.Dataset` cannot be copied ("cannot pickle 'Graph' object"). This
  source's iterator holds only the folder of a `FileClientData` (or the
  identity of a `tff_client_data.TFFClientData`, a wrapped TFF
  `ClientData`, which then reads only the sampled clients, per round), the
  local work and a (seed, round) pair, so it copies and serialises (program
  state) cheaply, and it samples the same clients, with the same shuffles,
  as `tff_kd.program.experiment.run` (`tff_kd.program.sampling`).
* `native_context`: `train_model` awaits value references, so it needs a
  `tff.program.NativeFederatedContext` around an async execution context,
  not the synchronous one `set_local_context` installs; TFF 0.87's own also
  tears apart structured client data (see `_materialize`).
* `build_evaluation_manager`: federated evaluation with TFF's
  `build_fed_eval` on the experiment's test set.

Processes whose clients take datasets are built with
`tff_kd.program.experiment.build_dataset_process`. FedAvg, FedProx, FedDF
with one architecture, homogeneous FedD3A and FedFTG take plain
`tf.data.Dataset`s, as TFF's own algorithms do. Methods with per-client
state or per-client randomness (DaFKD's discriminator store, heterogeneous
FedD3A's and FedDF's client models, FedGen's generator noise) take
`OrderedDict(client_id=int32, data=<dataset>)`
(`tff_kd.federated.tff_types.client_data_type`); the round number always
comes from the server state. `ClientDataSource.for_process` picks the form.
"""

import asyncio
import collections
import datetime
import json
import os
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.types import type_conversions
from tensorflow_federated.python.program import native_platform

from tff_kd.federated import client_data as client_data_lib
from tff_kd.federated import tff_client_data
from tff_kd.federated import tff_types
from tff_kd.program import experiment as experiment_lib
from tff_kd.program import sampling
from tff_kd.runtime import context
from tff_kd.runtime import graph_rewrites


class ClientDataSourceIterator(tff.program.FederatedDataSourceIterator):
  """Selects seeded client samples of a `FileClientData`, round by round.

  The k-th call of `select` returns the datasets of the clients that
  `sampling.sample_clients` draws for (seed, round k), each with the batches
  of `FileClientData.dataset_from_key` for (seed, round k), on every pass
  (`FileClientData.replayable_dataset`). A `TFFClientData` (same interface)
  is read the same way: only the selected clients.
  """

  def __init__(self, directory: str, local: client_data_lib.LocalWork, *,
               seed: int, with_ids: bool = False, round_num: int = 0):
    """Args:
      directory: `tff_client_data.source_of` the clients: a
        `FileClientData`'s folder or a `TFFClientData`'s identity (which
        must be open in this process).
      local: The local work.
      seed: The sampling and shuffle seed.
      with_ids: Yield (client_id, data) per client.
      round_num: Rounds already selected.
    """
    self._directory = directory
    self._local = client_data_lib.LocalWork(*local).validate()
    self._seed = int(seed)
    self._with_ids = bool(with_ids)
    self._round = int(round_num)
    self._clients: Optional[client_data_lib.FileClientData] = None

  def _client_data(self) -> client_data_lib.FileClientData:
    if self._clients is None:
      self._clients = tff_client_data.open_source(self._directory)
    return self._clients

  def _fields(self) -> dict[str, Any]:
    return dict(directory=self._directory, local=list(self._local),
                seed=self._seed, with_ids=self._with_ids,
                round_num=self._round)

  def __deepcopy__(self, memo) -> 'ClientDataSourceIterator':
    return self.from_bytes(self.to_bytes())

  @property
  def round_num(self) -> int:
    """Rounds selected so far."""
    return self._round

  @property
  def federated_type(self) -> tff.FederatedType:
    return tff.FederatedType(tff_types.client_data_type(
        self._client_data().element_spec, with_id=self._with_ids),
                             tff.CLIENTS)

  def select(self, k: Optional[int] = None) -> list[Any]:
    """The next round's k client datasets (with their ids if `with_ids`)."""
    if k is None:
      raise ValueError('select needs k, the number of clients per round')
    clients = self._client_data()
    indices = sampling.sample_clients(len(clients.client_ids), k,
                                      seed=self._seed, round_num=self._round)
    keys = clients.keys(indices, seed=self._seed, round_num=self._round)
    self._round += 1
    datasets = [clients.replayable_dataset(key, self._local)
                for key in keys]
    if not self._with_ids:
      return datasets
    return [collections.OrderedDict(client_id=np.int32(i), data=d)
            for i, d in zip(indices, datasets)]

  def to_bytes(self) -> bytes:
    return json.dumps(self._fields(), sort_keys=True).encode()

  @classmethod
  def from_bytes(cls, buffer: bytes) -> 'ClientDataSourceIterator':
    fields = json.loads(buffer.decode())
    return cls(fields['directory'],
               client_data_lib.LocalWork(*fields['local']),
               seed=fields['seed'], with_ids=fields['with_ids'],
               round_num=fields['round_num'])

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, ClientDataSourceIterator):
      return NotImplemented
    return self.to_bytes() == other.to_bytes()


class ClientDataSource(tff.program.FederatedDataSource):
  """A `tff.program.FederatedDataSource` over a `FileClientData` folder."""

  def __init__(self, client_data: client_data_lib.FileClientData,
               local: client_data_lib.LocalWork, *, seed: int,
               with_ids: bool = False):
    """Args:
      client_data: The clients' arrays (e.g. `Experiment.client_data`).
      local: The local work each client's dataset is batched for.
      seed: Seeds the client sample and the shuffles of every round; give
        the process's seed (its per-client seeds derive from it).
      with_ids: Yield `OrderedDict(client_id, data)` per client, for
        processes whose clients take ids (`for_process` decides).
    """
    self._iterator = ClientDataSourceIterator(
        tff_client_data.source_of(client_data), local, seed=seed,
        with_ids=with_ids)

  @classmethod
  def for_process(cls, process: tff.learning.templates.LearningProcess,
                  client_data: client_data_lib.FileClientData,
                  local: client_data_lib.LocalWork, *,
                  seed: int) -> 'ClientDataSource':
    """The source whose selections `process.next` takes."""
    data_type = process.next.type_signature.parameter[1].member
    return cls(client_data, local, seed=seed,
               with_ids=isinstance(data_type, tff.StructType))

  @property
  def federated_type(self) -> tff.FederatedType:
    return self._iterator.federated_type

  def iterator(self) -> ClientDataSourceIterator:
    return self._iterator.__deepcopy__({})


def build_evaluation_manager(
    exp: experiment_lib.Experiment, root_dir: str, *,
    num_clients: int = 10, cohort_size: Optional[int] = None,
    metrics_manager: Optional[tff.program.ReleaseManager] = None,
    batch_size: int = 500) -> tff.learning.programs.EvaluationManager:
  """A `tff.learning.programs.EvaluationManager` on the experiment's test set.

  Federated evaluation with TFF's own `tff.learning.algorithms.build_fed_eval`
  of the global model (Keras, wrapped by `tff.learning.models.
  from_keras_model`; inference mode, as `experiment`'s evaluator). The test
  set is split into `num_clients` contiguous evaluation clients, written
  once under `root_dir/evaluation_data`; each evaluation runs one round of
  `cohort_size` of them (all by default: the whole test set).

  Args:
    exp: From `experiment.prepare`.
    root_dir: Where the evaluation clients and the managers' states go.
    num_clients: Evaluation clients the test set is split into.
    cohort_size: Clients per evaluation (default: all).
    metrics_manager: Receives each evaluation's aggregated metrics, keyed by
      the training round (TFF releases them under `model_metrics`).
    batch_size: Evaluation batch size.

  Returns:
    The manager, for `train_model(evaluation_manager=...)`.
  """
  x, y = exp.dataset.x_test, exp.dataset.y_test
  folder = os.path.join(root_dir, 'evaluation_data')
  if os.path.exists(os.path.join(folder, 'manifest.json')):
    clients = client_data_lib.FileClientData(folder)
  else:
    clients = client_data_lib.FileClientData.create(
        folder, x, y, np.array_split(np.arange(len(y)), num_clients))
  source = ClientDataSource(
      clients, client_data_lib.LocalWork('epochs', 1, batch_size), seed=0)
  element_spec = clients.element_spec

  def tff_model_fn():
    return tff.learning.models.from_keras_model(
        exp.model_fn(), input_spec=element_spec,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])

  built = []

  def create_process_fn(unused_name: str):
    # The manager asks for a process at every evaluation, always for this
    # model: built once (a build costs about what a training round does).
    if not built:
      built.append(tff.learning.algorithms.build_fed_eval(tff_model_fn))
    return built[0], None

  def create_state_manager_fn(name: str):
    return tff.program.FileProgramStateManager(
        os.path.join(root_dir, 'evaluation_state', name))

  return tff.learning.programs.EvaluationManager(
      data_source=source, aggregated_metrics_manager=metrics_manager,
      create_state_manager_fn=create_state_manager_fn,
      create_process_fn=create_process_fn,
      cohort_size=cohort_size or num_clients,
      duration=datetime.timedelta(0))


async def _materialize(value, type_signature: tff.Type):
  """Awaits the value references in a computation argument.

  TFF 0.87's `NativeFederatedContext` recurses into the member type of a
  CLIENTS-placed value as if the list of clients were that member's
  structure, so a list of `OrderedDict(client_id, data)` is torn apart
  (each struct field gets one client). Client-placed data comes from a data
  source and holds no references, so it is passed on as it is.
  """
  if isinstance(type_signature, tff.FederatedType):
    if type_signature.placement == tff.CLIENTS:
      return value
    return await _materialize(value, type_signature.member)
  if isinstance(type_signature, tff.StructType):
    elements = tff.structure.to_elements(tff.structure.from_container(value))
    types = tff.structure.to_elements(type_signature)
    values = await asyncio.gather(*[_materialize(v, t) for (_, v), (_, t)
                                    in zip(elements, types)])
    return tff.structure.Struct([(name, v) for (name, _), v
                                 in zip(types, values)])
  if isinstance(value, tff.program.MaterializableValueReference):
    return await value.get_value()
  return value


class _NativeContext(tff.program.NativeFederatedContext):
  """`NativeFederatedContext` that accepts structured client data."""

  def __init__(self, execution_context):
    super().__init__(execution_context)
    self._execution_context = execution_context

  def invoke(self, comp: tff.Computation, arg):
    parameter = comp.type_signature.parameter
    if parameter is None or arg is None:
      return super().invoke(comp, arg)

    async def run():
      value = await _materialize(arg, parameter)
      return await self._execution_context.invoke(comp, value)

    task = asyncio.create_task(run())
    # Results are server-placed only (as TFF's invoke requires): they are
    # wrapped into value references by TFF's own helper.
    references = native_platform._create_structure_of_references(  # pylint: disable=protected-access
        task, comp.type_signature.result)
    return type_conversions.type_to_py_container(
        references, comp.type_signature.result)


def native_context(*, grappler: str = graph_rewrites.DEFAULT,
                   **kwargs: Any) -> tff.program.NativeFederatedContext:
  """An async local C++ context wrapped for TFF's program logic.

  `tff.learning.programs.train_model` awaits value references, so it needs
  a `tff.program.NativeFederatedContext` around an async execution context,
  not the synchronous one `set_local_context` installs. This one also passes
  structured client data (`OrderedDict(client_id, data)`) through intact,
  which TFF 0.87's own does not (see `_materialize`). Install it around
  `train_model`, e.g.
  `with tff.framework.get_context_stack().install(native_context()): ...`.
  It compiles as the synchronous context does (`grappler`,
  `runtime.grappler`), so its rounds are those of `experiment.run`. Its
  `worker_binary` is reaped and set up like the synchronous context's:
  `kwargs` as in `tff_kd.runtime.context.setup_local_worker`.

  Raises:
    ValueError: an unknown `grappler`, before the worker starts.
  """
  compiler_fn = graph_rewrites.compiler_for(grappler)
  calls = context.setup_local_worker(**kwargs)
  return _NativeContext(
      graph_rewrites.local_context(calls, compiler_fn, sync=False))
