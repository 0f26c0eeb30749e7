"""Sets an experiment up: data, partition, server data, process, evaluations.

`prepare(config, root_dir)` validates the whole config
(`tff_kd.program.validation`), then loads the dataset and partitions it:
every user error surfaces here, before any TFF computation. It holds the
server's slices (`server_data`: an unlabeled proxy split and a labeled
validation set) out of the training set, whatever the method; writes the
clients' arrays once under `root_dir/client_data/<fingerprint>` and the
server's under `root_dir/server_data/<fingerprint>`; and composes the
method's learning process with the dataset computation that reads them
(`tff_kd.federated.client_data`, `.server_data`). The data and the method
contribute the evaluations of the global model (`tff_kd.program.evaluation`).
"""

import hashlib
import json
import os
from typing import Mapping, NamedTuple, Optional, Union

import ml_collections
import numpy as np
import tensorflow_federated as tff

from tff_kd import data as data_lib
from tff_kd import errors
from tff_kd import models
from tff_kd.federated import client_data as client_data_lib
from tff_kd.federated import learning
from tff_kd.federated import server_data as server_data_lib
from tff_kd.methods import common
from tff_kd.methods import registry
from tff_kd.program import evaluation
from tff_kd.program import server_stage
from tff_kd.program import validation


class Experiment(NamedTuple):
  """Everything a round loop needs, built by `prepare`.

  Attributes:
    config: The validated config.
    dataset: The loaded `tff_kd.data.Dataset`.
    client_data: The clients' on-disk data.
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

  config: ml_collections.ConfigDict
  dataset: data_lib.Dataset
  client_data: client_data_lib.FileClientData
  process: Union[tff.learning.templates.LearningProcess,
                 server_stage.DriverServerProcess]
  model_fn: learning.ModelFn
  evaluations: Mapping[str, evaluation.Evaluation]
  server_data: Optional[server_data_lib.ServerData] = None
  inputs: Optional[common.ProcessInputs] = None


# The evaluations' order: the order of the metrics in a round's record.
_EVALUATION_ORDER = ('test', 'prototypes', 'test_slices')


def _partition(config: ml_collections.ConfigDict, dataset: data_lib.Dataset):
  """Client index arrays and, for the FedGen recipe, their test slices."""
  p = config.partition
  if p.kind == 'iid':
    return data_lib.iid_partition(len(dataset.y_train), p.num_clients,
                                  seed=config.seed), None
  if p.kind == 'domain':
    # One domain per client (cross-silo) or Dir(alpha) label skew over
    # clients_per_domain clients inside every domain (cross-device).
    return data_lib.domain_partition(
        dataset.train_domains, clients_per_domain=p.clients_per_domain,
        alpha=p.alpha if p.clients_per_domain > 1 else None,
        labels=dataset.y_train, seed=config.seed,
        min_size=p.min_size), None
  if p.kind == 'fedgen':
    return data_lib.fedgen_partition(
        dataset.y_train, p.num_clients, p.alpha, per_class=p.per_class,
        seed=config.seed, test_labels=dataset.y_test, min_size=p.min_size)
  return data_lib.dirichlet_partition(
      dataset.y_train, p.num_clients, p.alpha, seed=config.seed,
      min_size=p.min_size), None


def _fingerprint(config: ml_collections.ConfigDict) -> str:
  key = dict(dataset=config.dataset.to_dict(),
             partition=config.partition.to_dict(), seed=config.seed)
  if not config.dataset.domains:  # Keeps older fingerprints unchanged.
    for k in ('domains', 'image_shape'):
      key['dataset'].pop(k, None)
    if key['partition'].get('clients_per_domain') == 1:
      key['partition'].pop('clients_per_domain')
  sd = config.server_data
  if sd.proxy or sd.val_size:  # Keeps older fingerprints unchanged.
    key['server_data'] = sd.to_dict()
  key = json.dumps(key, sort_keys=True)
  return hashlib.sha256(key.encode()).hexdigest()[:16]


def _hold_out(config: ml_collections.ConfigDict, dataset: data_lib.Dataset):
  """Removes the server's slices from the training set.

  Returns:
    (client dataset, unlabeled proxy images or None, val images, val labels)
    with the held-out indices drawn by a seeded permutation.
  """
  sd = config.server_data
  n_proxy = sd.proxy_size if sd.proxy == 'split' else 0
  n_held = n_proxy + sd.val_size
  if not n_held:
    return dataset, None, None, None
  n = len(dataset.y_train)
  if n_held >= n:
    raise errors.ConfigError(
        f'server_data holds out {n_held} training examples but the training '
        f'set has only {n}')
  perm = np.random.default_rng([config.seed, 7]).permutation(n)
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


def _server_data(config: ml_collections.ConfigDict,
                 dataset: data_lib.Dataset, proxy: Optional[np.ndarray],
                 val_x: Optional[np.ndarray], val_y: Optional[np.ndarray],
                 directory: str) -> Optional[server_data_lib.ServerData]:
  """Builds (once) and opens the server's data, or None if not configured."""
  sd = config.server_data
  if not sd.proxy:
    return None
  try:
    return server_data_lib.ServerData(directory)
  except errors.DataError:
    pass
  if sd.proxy != 'split':
    other = data_lib.load_dataset(
        sd.proxy,
        data_dir=os.path.expanduser(config.dataset.data_dir) or None,
        manual_dir=config.dataset.manual_dir or None,
        image_shape=dataset.x_train.shape[1:])
    if sd.proxy_size > len(other.x_train):
      raise errors.ConfigError(
          f'server_data.proxy_size={sd.proxy_size} is more than the '
          f'{len(other.x_train)} training images of {sd.proxy}')
    idx = np.random.default_rng([config.seed, 8]).permutation(
        len(other.x_train))[:sd.proxy_size]
    proxy = other.x_train[np.sort(idx)]
  return server_data_lib.ServerData.create(directory, proxy, val_x, val_y,
                                           proxy_name=sd.proxy)


def _data_evaluations(
    config: ml_collections.ConfigDict, dataset: data_lib.Dataset,
    test_slices: Optional[list[np.ndarray]],
    model: evaluation.SharedModel) -> dict[str, evaluation.Evaluation]:
  """What the data contributes: the whole test set (per client domain, with
  their mean, for multi-domain data) and the FedGen recipe's test slices.
  They share one model, hence one trace."""
  batch_size = config.eval_batch_size
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
    config: ml_collections.ConfigDict, dataset: data_lib.Dataset,
    model_fns: tuple[learning.ModelFn, ...]
) -> dict[str, evaluation.Evaluation]:
  """What the method contributes: its other global models (FedDF's
  prototypes 1..P-1, read from the state), each on its own model."""
  if len(model_fns) < 2:
    return {}
  return {'prototypes': evaluation.OtherGlobalModels(tuple(
      evaluation.Evaluator(evaluation.SharedModel(fn), dataset.x_test,
                           dataset.y_test, batch_size=config.eval_batch_size)
      for fn in model_fns[1:]))}


def _load(config: ml_collections.ConfigDict) -> data_lib.Dataset:
  """The configured dataset (every client domain's, for multi-domain data)."""
  if validation.domain_names(config):
    return data_lib.load_domains(
        validation.domain_names(config), validation.image_shape(config),
        data_dir=os.path.expanduser(config.dataset.data_dir) or None,
        manual_dir=config.dataset.manual_dir or None,
        train_limit=config.dataset.train_limit or None)
  return data_lib.load_dataset(
      config.dataset.name,
      data_dir=os.path.expanduser(config.dataset.data_dir) or None,
      manual_dir=config.dataset.manual_dir or None,
      train_limit=config.dataset.train_limit or None)


def prepare(config: ml_collections.ConfigDict, root_dir: str) -> Experiment:
  """Validates, loads and partitions data, and builds the process.

  Args:
    config: Experiment config.
    root_dir: Output folder of the run.

  Returns:
    An `Experiment`.

  Raises:
    UserError: for any bad setting, data file or partition request.
  """
  validation.validate_config(config)
  method = registry.get_method(config.method)
  dataset = _load(config)
  dataset, proxy, val_x, val_y = _hold_out(config, dataset)
  # One seeded builder per global model; pretrained weights (`model.weights`
  # or the prototypes' `client_weights`) are read and checked here, before
  # anything is written or any computation is built.
  builders = [
      models.classifier_builder(
          name, input_shape=dataset.x_train.shape[1:],
          num_classes=dataset.num_classes, norm=norm, seed=config.seed,
          weights=weights, what=what)
      for (name, norm), (weights, what) in zip(
          validation.prototypes(config),
          validation.prototype_weights(config))]
  model_fns = tuple(models.model_fn_of(b) for b in builders)
  model_fn = model_fns[0]
  classifier_fn = builders[0]
  parts, test_slices = _partition(config, dataset)

  data_dir = os.path.join(root_dir, 'client_data', _fingerprint(config))
  server = _server_data(
      config, dataset, proxy, val_x, val_y,
      os.path.join(root_dir, 'server_data', _fingerprint(config)))
  if os.path.exists(os.path.join(data_dir, 'manifest.json')):
    clients = client_data_lib.FileClientData(data_dir)
  else:
    clients = client_data_lib.FileClientData.create(
        data_dir, dataset.x_train, dataset.y_train, parts)

  inputs = common.ProcessInputs(
      model_fn, clients.element_spec, dataset.num_classes,
      dataset_fn=clients.dataset_fn(validation.local_work(config)),
      server_data=server,
      prototype_fns=model_fns if len(model_fns) > 1 else (),
      classifier_fn=classifier_fn,
      num_clients=config.partition.num_clients)
  process = server_stage.place_server(method.build(inputs, config),
                                      config.runtime.server_device)
  evaluations = {
      **_data_evaluations(config, dataset, test_slices,
                          evaluation.SharedModel(model_fn)),
      **_method_evaluations(config, dataset, model_fns)}
  evaluations = {name: evaluations[name] for name in _EVALUATION_ORDER
                 if name in evaluations}
  return Experiment(config, dataset, clients, process, model_fn, evaluations,
                    server, inputs)


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
  method = registry.get_method(exp.config.method)
  return method.build(exp.inputs._replace(dataset_fn=None), exp.config)
