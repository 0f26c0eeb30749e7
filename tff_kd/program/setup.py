"""Sets an experiment up: data, partition, server data, process, evaluations.

`prepare(settings, root_dir)` takes the run's validated settings
(`tff_kd.program.settings.Settings`; a config is validated into them once,
at the entry, `experiment.prepare`), then loads the dataset and partitions
it: every user error surfaces here, before any TFF computation. It holds the
server's slices (`server_data`: an unlabeled proxy split and a labeled
validation set) out of the training set, whatever the method; writes the
clients' arrays once under `root_dir/client_data/<fingerprint>` and the
server's under `root_dir/server_data/<fingerprint>`; and composes the
method's learning process with the dataset computation that reads them
(`tff_kd.federated.client_data`, `.server_data`). The data and the method
contribute the evaluations of the global model (`tff_kd.program.evaluation`).

Both sources of clients, a central dataset partitioned here
(`_central_data`) and a `ClientData` (`_federated_data`), share one
interface: a function of `(settings, root_dir, client_data, test_data)`
returning a `PreparedData`, which `prepare` turns into the process and the
evaluations along one path.

Federated data: with `prepare(settings, root_dir, client_data=...,
test_data=...)`, or a `dataset.name` of TFF's simulation datasets
('tff:emnist'), the clients are a `tff.simulation.datasets.ClientData`'s own
(`tff_kd.federated.tff_client_data`), read per round inside the TFF
computation: nothing of theirs is written or read here, and the
`partition` section is not used (`partition.num_clients` becomes the
number of clients). The test set is read whole. `server_data` works as
with central data, except that 'split' holds out whole clients: a seeded
permutation of the clients is read, client by client, until the clients
read hold `val_size + proxy_size` examples; their first `val_size`
examples are the labeled validation set, the next `proxy_size` the
unlabeled pool (the rest are unused), and those clients leave the
federation. The returned `Experiment.settings` record the `ClientData`'s
identity (`dataset.client_data`), which a resumed run must match.

Every function here reads the `Settings`; none reads a config.
"""

import copy
import functools
import hashlib
import json
import os
from typing import Any, Callable, Mapping, NamedTuple, Optional, Union

import ml_collections
import numpy as np
import tensorflow_federated as tff

from tff_kd import data as data_lib
from tff_kd import errors
from tff_kd import models
from tff_kd.federated import client_data as client_data_lib
from tff_kd.federated import execution
from tff_kd.federated import server_data as server_data_lib
from tff_kd.federated import tff_client_data
from tff_kd.federated import tff_types
from tff_kd.methods import common
from tff_kd.program import evaluation
from tff_kd.program import sampling
from tff_kd.program import settings as settings_lib
from tff_kd.runtime import context
from tff_kd.runtime import server_stage
from tff_kd.runtime import workers


class Experiment(NamedTuple):
  """Everything a round loop needs, built by `prepare`.

  Attributes:
    settings: The run's validated settings (with federated data, they
      record the `ClientData`'s identity and client count).
    dataset: The loaded `tff_kd.data.Dataset` (with federated data, the
      training arrays are empty: the clients' examples stay in their
      `ClientData`).
    client_data: The clients' on-disk data, or a
      `tff_client_data.TFFClientData` (the same interface).
    process: The method's `LearningProcess`, composed with the dataset
      computation, so `next` takes `(state, keys)`; with
      `runtime.server_device` other than 'runtime', a
      `server_stage.DriverServerProcess` with the same methods.
    model_fn: No-arg callable building the seeded Keras classifier.
    evaluations: Name -> `evaluation.Evaluation` of the global model(s),
      called in order at every evaluated round: 'test' (the whole test set;
      with client domains, each domain's and their mean), 'prototypes'
      (heterogeneous FedDF: prototypes 1..P-1), 'test_slices' (the FedGen
      recipe's per-user test slices).
    server_data: The server's proxy pool / validation set, if configured.
    inputs: What the method's builder received (`build_dataset_process`
      rebuilds the process from it for dataset-taking clients).
  """

  settings: settings_lib.Settings
  dataset: data_lib.Dataset
  client_data: client_data_lib.FileClientData
  process: Union[tff.learning.templates.LearningProcess,
                 server_stage.DriverServerProcess]
  model_fn: tff_types.ModelFn
  evaluations: Mapping[str, evaluation.Evaluation]
  server_data: Optional[server_data_lib.ServerData] = None
  inputs: Optional[common.ProcessInputs] = None


class PreparedData(NamedTuple):
  """What a source of clients hands `prepare` (`_central_data`,
  `_federated_data`).

  Attributes:
    settings: The run's settings (with federated data, recording the
      `ClientData`'s identity and client count).
    dataset: The loaded `tff_kd.data.Dataset`, less the server's slices.
    clients: The clients' data: a `client_data_lib.FileClientData` or a
      `tff_client_data.TFFClientData` (the same interface).
    server: The server's proxy pool / validation set, if configured.
    test_slices: The FedGen recipe's per-user test slices, or None.
    builders: One seeded classifier builder per global model
      (`_classifier_builders`), built where the source's order of side
      effects puts them (central data: before anything is written).
  """

  settings: settings_lib.Settings
  dataset: data_lib.Dataset
  clients: Union[client_data_lib.FileClientData,
                 tff_client_data.TFFClientData]
  server: Optional[server_data_lib.ServerData]
  test_slices: Optional[list[np.ndarray]]
  builders: list


# A source of clients: (settings, root_dir, client_data, test_data) ->
# PreparedData.
_DataSource = Callable[[settings_lib.Settings, str, Any, Any], PreparedData]


# The evaluations' order: the order of the metrics in a round's record.
_EVALUATION_ORDER = ('test', 'prototypes', 'test_slices')


def _partition(settings: settings_lib.Settings,
               dataset: data_lib.Dataset):
  """Client index arrays and, for the FedGen recipe, their test slices."""
  p, seed = settings.partition, settings.run.seed
  if p.kind == 'iid':
    return data_lib.iid_partition(len(dataset.y_train), p.num_clients,
                                  seed=seed), None
  if p.kind == 'domain':
    # One domain per client (cross-silo) or Dir(alpha) label skew over
    # clients_per_domain clients inside every domain (cross-device).
    return data_lib.domain_partition(
        dataset.train_domains, clients_per_domain=p.clients_per_domain,
        alpha=p.alpha if p.clients_per_domain > 1 else None,
        labels=dataset.y_train, seed=seed,
        min_size=p.min_size), None
  if p.kind == 'fedgen':
    return data_lib.fedgen_partition(
        dataset.y_train, p.num_clients, p.alpha, per_class=p.per_class,
        seed=seed, test_labels=dataset.y_test, min_size=p.min_size)
  return data_lib.dirichlet_partition(
      dataset.y_train, p.num_clients, p.alpha, seed=seed,
      min_size=p.min_size), None


def _fingerprint(settings: settings_lib.Settings) -> str:
  config = settings.to_config()
  key = dict(dataset=config.dataset.to_dict(),
             partition=config.partition.to_dict(), seed=settings.run.seed)
  if not config.dataset.domains:  # Keeps older fingerprints unchanged.
    for k in ('domains', 'image_shape'):
      key['dataset'].pop(k, None)
    if key['partition'].get('clients_per_domain') == 1:
      key['partition'].pop('clients_per_domain')
  sd = settings.server_data
  if sd.proxy or sd.val_size:  # Keeps older fingerprints unchanged.
    key['server_data'] = config.server_data.to_dict()
  if not key['dataset'].get('client_data'):  # Keeps older ones unchanged.
    key['dataset'].pop('client_data', None)
  key = json.dumps(key, sort_keys=True)
  return hashlib.sha256(key.encode()).hexdigest()[:16]


def _hold_out(settings: settings_lib.Settings, dataset: data_lib.Dataset):
  """Removes the server's slices from the training set.

  Returns:
    (client dataset, unlabeled proxy images or None, val images, val labels)
    with the held-out indices drawn by a seeded permutation.
  """
  sd = settings.server_data
  n_proxy = sd.proxy_size if sd.proxy == 'split' else 0
  n_held = n_proxy + sd.val_size
  if not n_held:
    return dataset, None, None, None
  n = len(dataset.y_train)
  if n_held >= n:
    raise errors.ConfigError(
        f'server_data holds out {n_held} training examples but the training '
        f'set has only {n}')
  perm = np.random.default_rng([settings.run.seed, 7]).permutation(n)
  val_idx, proxy_idx, rest = np.split(perm, [sd.val_size, n_held])
  rest = np.sort(rest)
  clients = dataset._replace(
      x_train=dataset.x_train[rest], y_train=dataset.y_train[rest],
      train_domains=(None if dataset.train_domains is None else
                     dataset.train_domains[rest]))
  proxy = dataset.x_train[proxy_idx] if n_proxy else None
  val_x = dataset.x_train[val_idx] if sd.val_size else None
  val_y = dataset.y_train[val_idx] if sd.val_size else None
  return clients, proxy, val_x, val_y


def _server_data(settings: settings_lib.Settings,
                 dataset: data_lib.Dataset, proxy: Optional[np.ndarray],
                 val_x: Optional[np.ndarray], val_y: Optional[np.ndarray],
                 directory: str) -> Optional[server_data_lib.ServerData]:
  """Builds (once) and opens the server's data, or None if not configured."""
  sd = settings.server_data
  if not sd.proxy and not sd.val_size:
    return None
  try:
    return server_data_lib.ServerData(directory)
  except errors.DataError:
    pass
  if sd.proxy and sd.proxy != 'split':
    other = data_lib.load_dataset(
        sd.proxy,
        data_dir=os.path.expanduser(settings.dataset.data_dir) or None,
        manual_dir=settings.dataset.manual_dir or None,
        image_shape=dataset.x_train.shape[1:])
    if sd.proxy_size > len(other.x_train):
      raise errors.ConfigError(
          f'server_data.proxy_size={sd.proxy_size} is more than the '
          f'{len(other.x_train)} training images of {sd.proxy}')
    idx = np.random.default_rng([settings.run.seed, 8]).permutation(
        len(other.x_train))[:sd.proxy_size]
    proxy = other.x_train[np.sort(idx)]
  return server_data_lib.ServerData.create(directory, proxy, val_x, val_y,
                                           proxy_name=sd.proxy)


def _data_evaluations(
    settings: settings_lib.Settings, dataset: data_lib.Dataset,
    test_slices: Optional[list[np.ndarray]],
    model: evaluation.SharedModel) -> dict[str, evaluation.Evaluation]:
  """What the data contributes: the whole test set (per client domain, with
  their mean, for multi-domain data) and the FedGen recipe's test slices.
  They share one model, hence one trace."""
  batch_size = settings.run.eval_batch_size
  if dataset.test_domains is not None:
    test = evaluation.DomainTestSets(tuple(
        (name, evaluation.Evaluator(
            model, dataset.x_test[dataset.test_domains == i],
            dataset.y_test[dataset.test_domains == i],
            batch_size=batch_size))
        for i, name in enumerate(dataset.domain_names)))
  else:
    test = evaluation.TestSet(evaluation.Evaluator(
        model, dataset.x_test, dataset.y_test, batch_size=batch_size))
  evaluations = {'test': test}
  if test_slices is not None:
    idx = np.concatenate(test_slices)
    evaluations['test_slices'] = evaluation.TestSlices(evaluation.Evaluator(
        model, dataset.x_test[idx], dataset.y_test[idx],
        batch_size=batch_size))
  return evaluations


def _method_evaluations(
    settings: settings_lib.Settings, dataset: data_lib.Dataset,
    model_fns: tuple[tff_types.ModelFn, ...]
) -> dict[str, evaluation.Evaluation]:
  """What the method contributes: its other global models (FedDF's
  prototypes 1..P-1, read from the state), each on its own model."""
  if len(model_fns) < 2:
    return {}
  return {'prototypes': evaluation.OtherGlobalModels(tuple(
      evaluation.Evaluator(evaluation.SharedModel(fn), dataset.x_test,
                           dataset.y_test, batch_size=settings.run.eval_batch_size)
      for fn in model_fns[1:]))}


def _load(settings: settings_lib.Settings) -> data_lib.Dataset:
  """The configured dataset (every client domain's, for multi-domain data)."""
  d = settings.dataset
  dirs = dict(data_dir=os.path.expanduser(d.data_dir) or None,
              manual_dir=d.manual_dir or None,
              train_limit=d.train_limit or None)
  if d.domain_names:
    return data_lib.load_domains(d.domain_names, d.shape, **dirs)
  return data_lib.load_dataset(d.name, **dirs)


def is_federated(config: ml_collections.ConfigDict) -> bool:
  """Whether a config names a `ClientData` (a 'tff:' dataset, or the
  identity `prepare` recorded) rather than a dataset to partition."""
  dataset = config.get('dataset') or {}
  return (dataset.get('name') in data_lib.TFF_DATASETS or
          bool(dataset.get('client_data')))


def _hold_out_clients(settings: settings_lib.Settings,
                      clients: tff_client_data.TFFClientData):
  """Removes the server's slices from a `ClientData`: whole clients.

  Returns:
    (the remaining clients, unlabeled proxy images or None, val images, val
    labels): a seeded permutation of the clients is read until the clients
    read hold the held-out examples; they all leave the federation.
  """
  sd = settings.server_data
  n_proxy = sd.proxy_size if sd.proxy == 'split' else 0
  n_held = n_proxy + sd.val_size
  if not n_held:
    return clients, None, None, None
  ids = clients.client_ids
  order = np.random.default_rng([settings.run.seed, 7]).permutation(len(ids))
  xs, ys, held = [], [], 0
  for count, i in enumerate(order[:-1], start=1):
    x, y = clients.arrays([ids[i]])
    xs.append(x)
    ys.append(y)
    held += len(y)
    if held >= n_held:
      break
  else:
    raise errors.ConfigError(
        f'server_data holds out {n_held} training examples but all clients '
        f'of {clients.name} but one hold only {held}')
  x, y = np.concatenate(xs), np.concatenate(ys)
  rest = clients.subset([ids[i] for i in sorted(order[count:])])
  proxy = x[sd.val_size:n_held] if n_proxy else None
  val_x = x[:sd.val_size] if sd.val_size else None
  val_y = y[:sd.val_size] if sd.val_size else None
  return rest, proxy, val_x, val_y


def _federated_clients(
    settings: settings_lib.Settings, client_data: Any, test_data: Any
) -> tuple[settings_lib.Settings, tff_client_data.TFFClientData, Any]:
  """The settings' or the caller's `ClientData`, with its test set.

  Returns:
    (the settings recording the `ClientData`'s identity, the wrapped
    training clients, the test data).
  """
  d = settings.dataset
  if client_data is None:
    if test_data is not None:
      raise errors.ConfigError('prepare got test_data without client_data')
    if d.name not in data_lib.TFF_DATASETS:
      raise errors.ConfigError(
          f'dataset.client_data={d.client_data!r} is recorded by prepare: '
          'pass that ClientData as prepare(..., client_data=...)')
    train, test_data, source = data_lib.load_tff(
        d.name, data_dir=os.path.expanduser(d.data_dir) or None)
    client_data = tff_client_data.TFFClientData(
        train, name=d.name, num_classes=source.num_classes,
        x_key=source.x_key, y_key=source.y_key, pixel_max=source.pixel_max)
  else:
    if d.name in data_lib.TFF_DATASETS:
      raise errors.ConfigError(
          f'dataset.name={d.name!r} and a client_data argument: give one')
    if isinstance(client_data, tff.simulation.datasets.ClientData):
      raise errors.ConfigError(
          'wrap the ClientData first: tff_kd.federated.tff_client_data.'
          "TFFClientData(client_data, name='...', num_classes=N, ...)")
    if not isinstance(client_data, tff_client_data.TFFClientData):
      raise errors.ConfigError(
          'client_data must be a tff_client_data.TFFClientData, got '
          f'{type(client_data).__name__}')
    if test_data is None:
      raise errors.ConfigError(
          'prepare(client_data=...) needs test_data=: (x, y) arrays, a '
          'tf.data.Dataset of (x, y) or a test ClientData')
  if d.client_data and d.client_data != client_data.identity:
    raise errors.ConfigError(
        f'dataset.client_data is {d.client_data!r} but the given ClientData '
        f'is {client_data.identity!r}')
  settings = settings.replace(
      dataset=d.replace(client_data=client_data.identity))
  return settings, client_data, test_data


def _federated_data(settings: settings_lib.Settings, root_dir: str,
                    client_data: Any, test_data: Any) -> PreparedData:
  """`prepare`'s data from a `ClientData` (see the module docstring).

  Args:
    settings: The run's validated settings.
    root_dir: Output folder of the run (the server's data go under it).
    client_data: The caller's `TFFClientData`, or None for a 'tff:' dataset.
    test_data: With `client_data`, the central test set.

  Returns:
    A `PreparedData` whose settings record the `ClientData`'s identity and
    client count; no test slices.

  Raises:
    UserError: for a bad `ClientData`, test set or sampling request.
  """
  settings, clients, test_data = _federated_clients(settings, client_data,
                                                    test_data)
  clients, proxy, val_x, val_y = _hold_out_clients(settings, clients)
  settings = settings.replace(partition=settings.partition.replace(
      num_clients=len(clients.client_ids)))
  # The one check that needed the data: its clients are counted now.
  sampling.check_sampling(settings.partition.num_clients,
                          settings.run.clients_per_round)
  x_test, y_test = tff_client_data.central_test_set(test_data, clients)
  dataset = data_lib.Dataset(
      clients.name, np.zeros([0, *clients.image_shape], np.float32),
      np.zeros([0], np.int32), x_test, y_test, clients.num_classes)
  server = _server_data(
      settings, dataset, proxy, val_x, val_y,
      os.path.join(root_dir, 'server_data', _fingerprint(settings)))
  settings, builders = _classifier_builders(settings, dataset)
  return PreparedData(settings, dataset, clients, server, None, builders)


class Split(NamedTuple):
  """A central dataset as a run splits it (`split_arrays`).

  Attributes:
    dataset: The loaded `tff_kd.data.Dataset`, its training arrays less the
      server's slices (the clients' images, in the order `parts` index).
    parts: One index array into `dataset.x_train` per client, client i's
      at i (the clients `sample_clients` draws).
    test_slices: The FedGen recipe's per-user test slices (indices into
      `dataset.x_test`), or None.
    proxy: The server's unlabeled images ('split' proxy), or None.
    val_x: The server's labeled validation images, or None.
    val_y: Their labels, or None.
  """

  dataset: data_lib.Dataset
  parts: list
  test_slices: Optional[list[np.ndarray]]
  proxy: Optional[np.ndarray]
  val_x: Optional[np.ndarray]
  val_y: Optional[np.ndarray]


def split_arrays(settings: Union[settings_lib.Settings,
                                 ml_collections.ConfigDict]) -> Split:
  """The arrays a run of `settings` trains, tests and distils on, in memory.

  The very split `prepare` writes for a central dataset (loaded, the
  server's slices held out, partitioned, all seeded by `run.seed`), for
  code outside the library to run on the same work (e.g. another
  implementation of a method, `studies/parity`). A 'split' proxy only:
  another dataset's proxy is read by `prepare`.

  Raises:
    UserError: for a federated dataset (its clients are not arrays) or a
      bad data file or partition request.
  """
  settings = settings_of(settings)
  if settings.dataset.is_federated:
    raise errors.ConfigError(
        f'dataset.name={settings.dataset.name!r} is a federated dataset: its '
        'clients are a ClientData, not a split of arrays')
  dataset = _load(settings)
  dataset, proxy, val_x, val_y = _hold_out(settings, dataset)
  parts, test_slices = _partition(settings, dataset)
  return Split(dataset, list(parts), test_slices, proxy, val_x, val_y)


def _central_data(settings: settings_lib.Settings, root_dir: str,
                  client_data: Any, test_data: Any) -> PreparedData:
  """`prepare`'s data from a central dataset: loaded, the server's slices
  held out, partitioned, and written once under `root_dir`.

  Args:
    settings: The run's validated settings.
    root_dir: Output folder of the run (the clients' and the server's data
      go under it).
    client_data: Unused (None): the shared interface's argument.
    test_data: Unused (None): the shared interface's argument.

  Returns:
    A `PreparedData` with the on-disk clients.

  Raises:
    UserError: for a bad data file, pretrained weights or partition request.
  """
  del client_data, test_data  # The clients are the partition's.
  dataset, parts, test_slices, proxy, val_x, val_y = split_arrays(settings)
  # Pretrained weights are read and checked before anything is written.
  settings, builders = _classifier_builders(settings, dataset)

  fingerprint = _fingerprint(settings)
  data_dir = os.path.join(root_dir, 'client_data', fingerprint)
  server = _server_data(
      settings, dataset, proxy, val_x, val_y,
      os.path.join(root_dir, 'server_data', fingerprint))
  if os.path.exists(os.path.join(data_dir, 'manifest.json')):
    clients = client_data_lib.FileClientData(data_dir)
  else:
    clients = client_data_lib.FileClientData.create(
        data_dir, dataset.x_train, dataset.y_train, parts)
  return PreparedData(settings, dataset, clients, server, test_slices,
                      builders)


def _classifier_builders(
    settings: settings_lib.Settings,
    dataset: data_lib.Dataset) -> tuple[settings_lib.Settings, list]:
  """One seeded classifier builder per global model (`model`, or FedDF's
  prototypes), and the settings recording the architectures of the run's
  models.

  Pretrained weights (`model.weights`, the prototypes' `client_weights`)
  are read and checked here, and every model the run builds by name
  (`Settings.named_models`: these, and FedD3A's client models) is built
  once, eagerly: one that cannot be built (e.g. a `py:` function that
  returns the wrong thing) fails here, before any computation, and the
  returned settings record each one's `models.architecture_digest`
  (`Settings.architectures`).
  """
  shape = dataset.x_train.shape[1:]
  builders = [
      models.classifier_builder(
          name, input_shape=shape, num_classes=dataset.num_classes,
          norm=norm, seed=settings.run.seed, weights=weights, what=what,
          data_dir=settings.dataset.data_dir,
          manual_dir=settings.dataset.manual_dir or None)
      for (name, norm), (weights, what) in zip(settings.prototypes,
                                               settings.prototype_weights)]
  clients = [
      functools.partial(models.build_classifier, name, input_shape=shape,
                        num_classes=dataset.num_classes, norm=norm,
                        seed=settings.run.seed)
      for name, norm in settings.client_models]
  architectures = tuple(models.architecture_digest(build().model)
                        for build in builders + clients)
  return settings.replace(architectures=architectures), builders


def settings_of(config: Union[settings_lib.Settings,
                              ml_collections.ConfigDict], *,
                with_client_data: bool = False) -> settings_lib.Settings:
  """The run's settings: `config` itself, or the config validated once.

  Args:
    config: `Settings`, or an experiment config (the Python API's edge).
    with_client_data: The caller passes its own `ClientData`, whose clients
      replace the partition: `partition.num_clients` is then counted from
      it, after validation, so it is not checked against
      `clients_per_round` here.

  Raises:
    ConfigError: naming the first bad key and its value.
  """
  if isinstance(config, settings_lib.Settings):
    return config
  if with_client_data and isinstance(config.get('clients_per_round'), int):
    config = copy.deepcopy(config)
    config.partition.num_clients = max(1, config.clients_per_round)
  return settings_lib.from_config(config)


def prepare(settings: Union[settings_lib.Settings,
                            ml_collections.ConfigDict],
            root_dir: str, *,
            client_data: Optional[tff_client_data.TFFClientData] = None,
            test_data: Any = None) -> Experiment:
  """Loads and partitions data, and builds the process.

  Args:
    settings: The run's validated settings (`settings.from_config`); an
      experiment config is validated into them first (`settings_of`).
    root_dir: Output folder of the run.
    client_data: Federated training clients: a
      `tff_kd.federated.tff_client_data.TFFClientData` wrapping a
      `tff.simulation.datasets.ClientData`; its clients replace the
      partition of `settings.dataset` (see the module docstring).
    test_data: With `client_data`, the central test set: `(x, y)` arrays
      normalised like the training images, a `tf.data.Dataset` of `(x, y)`,
      or a test `ClientData` (mapped like the training clients).

  Returns:
    An `Experiment`.

  Raises:
    UserError: for any bad setting, data file or partition request.
  """
  federated = client_data is not None or test_data is not None
  settings = settings_of(settings, with_client_data=federated)
  source: _DataSource = (_federated_data
                         if federated or settings.dataset.is_federated
                         else _central_data)
  settings, dataset, clients, server, test_slices, builders = source(
      settings, root_dir, client_data, test_data)
  model_fns = tuple(models.model_fn_of(b) for b in builders)
  model_fn = model_fns[0]
  classifier_fn = builders[0]

  inputs = common.ProcessInputs(
      model_fn, clients.element_spec, dataset.num_classes,
      dataset_fn=clients.dataset_fn(settings.local_work),
      server_data=server,
      prototype_fns=model_fns if len(model_fns) > 1 else (),
      classifier_fn=classifier_fn,
      num_clients=settings.partition.num_clients,
      client_execution=settings.runtime.execution_for(settings.method,
                                                      keyed=True))
  process = server_stage.place_server(settings.method.build(inputs, settings),
                                      settings.runtime.server_device)
  evaluations = {
      **_data_evaluations(settings, dataset, test_slices,
                          evaluation.SharedModel(model_fn)),
      **_method_evaluations(settings, dataset, model_fns)}
  evaluations = {name: evaluations[name] for name in _EVALUATION_ORDER
                 if name in evaluations}
  return Experiment(settings, dataset, clients, process, model_fn,
                    evaluations, server, inputs)


def set_context(settings: settings_lib.Settings) -> None:
  """Installs the TFF context the runtime section asks for: TFF's local
  runtime (its test context for secure sums), or remote workers."""
  addresses = settings.runtime.worker_addresses
  if addresses:
    workers.set_remote_context(addresses,
                               timeout_s=settings.runtime.worker_timeout_s,
                               grappler=settings.runtime.grappler)
  else:
    context.set_context_for(
        settings.needs_secure_sum,
        concurrent_clients=settings.runtime.concurrent_clients,
        intra_op_threads=settings.runtime.intra_op_threads,
        grappler=settings.runtime.grappler)


def build_dataset_process(
    exp: Experiment) -> tff.learning.templates.LearningProcess:
  """The experiment's method as a process whose clients take datasets.

  `next(state, datasets)` takes one `tf.data.Dataset` of batches per client,
  as TFF's own algorithms do, so `tff.learning.programs.train_model` can
  drive it with `tff_kd.program.tff_programs.ClientDataSource`. Its
  rounds equal those of `exp.process` given the same clients' datasets.
  Its server step always runs in the TFF runtime, whatever
  `runtime.server_device` says: `train_model` drives only a
  `LearningProcess`.

  Raises:
    ConfigError: for methods that read per-client metadata from keyed client
      data (DaFKD, FedGen, FedFTG, heterogeneous FedDF and FedD3A).
  """
  # Clients that take datasets are one per TFF call.
  inputs = exp.inputs._replace(dataset_fn=None,
                               client_execution=execution.ONE_BY_ONE)
  return exp.settings.method.build(inputs, exp.settings)
