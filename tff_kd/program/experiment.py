"""The training program shared by the `train` binary and notebooks.

`run(config, root_dir)` does, in order:

1. validate the whole config (`validate_config`), then load the dataset and
   partition it: every user error surfaces here, before any TFF computation;
2. hold the server's slices (`server_data`: an unlabeled proxy split and a
   labeled validation set) out of the training set, whatever the method;
   write the clients' arrays once under `root_dir/client_data/<fingerprint>`
   and the server's under `root_dir/server_data/<fingerprint>`, and compose
   the method's learning process with the dataset computation that reads
   them (`tff_kd.federated.client_data`, `.server_data`);
3. resume from the newest checkpoint in `root_dir/checkpoints` (a
   `tff.program.FileProgramStateManager`; no pickle) or initialise from the
   seeded Keras model;
4. per round: sample clients from (seed, round), run `process.next`,
   evaluate the global model on the whole test set, release metrics to CSV,
   TensorBoard and the log (`tff.program` release managers), checkpoint;
5. export the final global model as a Keras SavedModel that plain
   TensorFlow can load (`tff_kd.program.export`).

Because the client sample and every client's shuffle depend only on (seed,
round), an interrupted run that is restarted with the same root_dir replays
exactly the rounds it lost.
"""

import asyncio
import functools
import hashlib
import json
import math
import os
import time
from typing import Any, NamedTuple, Optional, Union

from absl import logging
import concurrent.futures
import ml_collections
import numpy as np
import tensorflow_federated as tff
import tqdm

from tff_kd import data as data_lib
from tff_kd import errors
from tff_kd import models
from tff_kd.federated import client_data as client_data_lib
from tff_kd.federated import composer
from tff_kd.federated import learning
from tff_kd.federated import server_data as server_data_lib
from tff_kd.methods import common
from tff_kd.methods import registry
from tff_kd.program import context
from tff_kd.program import evaluation
from tff_kd.program import export
from tff_kd.program import runtime
from tff_kd.program import sampling
from tff_kd.program import server_stage
from tff_kd.program import settings as settings_lib

PARTITIONS = settings_lib.PARTITIONS
_CONFIG_FILE = 'config.json'
# Keys that may change between a run and its resumption.
_RESUMABLE_KEYS = ('rounds', 'eval_every', 'checkpoint_every', 'export',
                   'keep_checkpoints', 'runtime.workers',
                   'runtime.worker_timeout_s', 'runtime.server_device',
                   'runtime.concurrent_clients', 'runtime.intra_op_threads')


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
    evaluator: Whole-test-set `Evaluator`.
    slice_evaluator: For the FedGen recipe only: evaluation on the union of
      the per-user test slices the reference code reports.
    server_data: The server's proxy pool / validation set, if configured.
    prototype_evaluators: For heterogeneous FedDF, whole-test-set
      evaluators of prototypes 1..P-1 (prototype 0 uses `evaluator`).
    domain_evaluators: For multi-domain data (`dataset.domains`), one
      (domain name, evaluator on that domain's whole test set) per client
      domain; `test/accuracy` is then their mean.
    inputs: What the method's builder received (`build_dataset_process`
      rebuilds the process from it for dataset-taking clients).
  """

  config: ml_collections.ConfigDict
  dataset: data_lib.Dataset
  client_data: client_data_lib.FileClientData
  process: Union[tff.learning.templates.LearningProcess,
                 server_stage.DriverServerProcess]
  model_fn: learning.ModelFn
  evaluator: evaluation.Evaluator
  slice_evaluator: Optional[evaluation.Evaluator]
  server_data: Optional[server_data_lib.ServerData] = None
  prototype_evaluators: tuple[evaluation.Evaluator, ...] = ()
  domain_evaluators: tuple[tuple[str, evaluation.Evaluator], ...] = ()
  inputs: Optional[common.ProcessInputs] = None


class RunResult(NamedTuple):
  """What `run` returns.

  Attributes:
    history: The metrics of the rounds run in this call, one dict per round.
    final: The final round's test metrics.
    export_dir: The SavedModel folder, or None.
    resumed_after: The checkpointed round this call resumed after (0: a
      fresh run).
  """

  history: list[dict[str, Any]]
  final: dict[str, Any]
  export_dir: Optional[str]
  resumed_after: int = 0


def _sync(coroutine):
  """Runs a `tff.program` coroutine to completion from synchronous code.

  Inside a running event loop (a Jupyter kernel runs one), `asyncio.run`
  refuses to start; the coroutine then runs on a loop of its own in a
  worker thread.
  """
  try:
    asyncio.get_running_loop()
  except RuntimeError:
    return asyncio.run(coroutine)
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    return pool.submit(asyncio.run, coroutine).result()


def set_context(config: ml_collections.ConfigDict) -> None:
  """Installs the TFF context the config's runtime section asks for: TFF's
  local runtime (its test context for secure sums), or remote workers."""
  workers = runtime.parse_workers(config.runtime.workers)
  if workers:
    runtime.set_remote_context(workers,
                               timeout_s=config.runtime.worker_timeout_s)
  else:
    context.set_context_for(
        needs_secure_sum(config),
        concurrent_clients=config.runtime.concurrent_clients,
        intra_op_threads=config.runtime.intra_op_threads)


def needs_secure_sum(config: ml_collections.ConfigDict) -> bool:
  """Whether the config's process uses secure sums (DaFKD's private mode)."""
  return settings_lib.needs_secure_sum(config)


def validate_config(config: ml_collections.ConfigDict) -> settings_lib.Settings:
  """Checks every setting that can be checked without loading data.

  Args:
    config: An experiment config derived from `configs/base.py`.

  Returns:
    The validated settings tree (`tff_kd.program.settings.from_config`).

  Raises:
    ConfigError: naming the first bad value.
  """
  return settings_lib.from_config(config)


def domain_names(config: ml_collections.ConfigDict) -> list[str]:
  """The client domains of `dataset.domains` ([] for single-domain data)."""
  return settings_lib.DatasetSettings.from_config(config.dataset).domain_names


def image_shape(config: ml_collections.ConfigDict) -> tuple[int, int, int]:
  """`dataset.image_shape` ('H,W,C') as integers."""
  return settings_lib.DatasetSettings.from_config(config.dataset).shape


def prototypes(config: ml_collections.ConfigDict) -> list[tuple[str, str]]:
  """(model name, norm) of each global model prototype: one per entry of
  the method's `client_models` where it keeps a global model per
  architecture (FedDF), else [model]."""
  method = registry.get_method(config.method)
  spec = ''
  if method.global_model_per_architecture:
    spec = registry.method_hparams(config).client_models
  return models.parse_model_list(
      spec, default_norm=config.model.norm,
      key=f'{method.name}.client_models') or [
          (config.model.name, config.model.norm)]


def local_work(config: ml_collections.ConfigDict) -> client_data_lib.LocalWork:
  """The config's local work (unit, amount, batch size)."""
  return client_data_lib.LocalWork(config.local.unit, config.local.amount,
                                   config.local.batch_size)


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
  validate_config(config)
  method = registry.get_method(config.method)
  if domain_names(config):
    dataset = data_lib.load_domains(
        domain_names(config), image_shape(config),
        data_dir=os.path.expanduser(config.dataset.data_dir) or None,
        manual_dir=config.dataset.manual_dir or None,
        train_limit=config.dataset.train_limit or None)
  else:
    dataset = data_lib.load_dataset(
        config.dataset.name,
        data_dir=os.path.expanduser(config.dataset.data_dir) or None,
        manual_dir=config.dataset.manual_dir or None,
        train_limit=config.dataset.train_limit or None)
  dataset, proxy, val_x, val_y = _hold_out(config, dataset)
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

  protos = prototypes(config)
  model_fns = tuple(
      functools.partial(
          lambda **kw: models.build_classifier(**kw).model,
          name=name, input_shape=dataset.x_train.shape[1:],
          num_classes=dataset.num_classes, norm=norm, seed=config.seed)
      for name, norm in protos)
  model_fn = model_fns[0]
  classifier_fn = functools.partial(
      models.build_classifier, protos[0][0],
      input_shape=dataset.x_train.shape[1:], num_classes=dataset.num_classes,
      norm=protos[0][1], seed=config.seed)
  inputs = common.ProcessInputs(
      model_fn, clients.element_spec, dataset.num_classes,
      dataset_fn=clients.dataset_fn(local_work(config)),
      server_data=server,
      prototype_fns=model_fns if len(model_fns) > 1 else (),
      classifier_fn=classifier_fn,
      num_clients=config.partition.num_clients)
  process = server_stage.place_server(method.build(inputs, config),
                                     config.runtime.server_device)

  eval_model = model_fn()  # Shared: the evaluators share one trace.
  evaluator = evaluation.Evaluator(eval_model, dataset.x_test, dataset.y_test,
                                   batch_size=config.eval_batch_size)
  slice_evaluator = None
  if test_slices is not None:
    idx = np.concatenate(test_slices)
    slice_evaluator = evaluation.Evaluator(
        eval_model, dataset.x_test[idx], dataset.y_test[idx],
        batch_size=config.eval_batch_size)
  prototype_evaluators = tuple(
      evaluation.Evaluator(fn(), dataset.x_test, dataset.y_test,
                           batch_size=config.eval_batch_size)
      for fn in model_fns[1:])
  domain_evaluators = ()
  if dataset.test_domains is not None:
    domain_evaluators = tuple(
        (name, evaluation.Evaluator(
            eval_model, dataset.x_test[dataset.test_domains == i],
            dataset.y_test[dataset.test_domains == i],
            batch_size=config.eval_batch_size))
        for i, name in enumerate(dataset.domain_names))
  return Experiment(config, dataset, clients, process, model_fn, evaluator,
                    slice_evaluator, server, prototype_evaluators,
                    domain_evaluators, inputs)


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


def _method_sections(method: common.Method) -> tuple[str, ...]:
  """The config sections only this method reads (as its registry entry says).

  A run folder's config is compared with a resumed run's on the shared
  sections and on its own method's sections only.
  """
  own = (method.hparams.SECTION,) if method.hparams is not None else ()
  return own + (('distill',) if method.uses_distill else ())


def _flat(tree: dict, prefix: str = '') -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flat(value, f'{prefix}{key}.'))
    else:
      out[f'{prefix}{key}'] = value
  return out


def _resume_keys(config: dict) -> dict[str, Any]:
  """The dotted keys that must match for a run to resume (see below)."""
  sections = {name: _method_sections(m)
              for name, m in registry.METHODS.items()}
  unused = ({s for own in sections.values() for s in own}
            - set(sections.get(config.get('method'), ())))
  return {k: v for k, v in _flat(config).items()
          if k.split('.')[0] not in unused and k not in _RESUMABLE_KEYS}


def _check_resumable(config: ml_collections.ConfigDict, root_dir: str) -> None:
  """Refuses to resume a root_dir written by a different experiment.

  Compared key by key: the shared settings and the sections the method
  reads (`_method_sections`); other methods' sections never block. A key
  the saved run does not have (added to configs/base.py since) blocks only
  if it is set away from its default; a key it has that no longer exists
  is ignored.
  """
  path = os.path.join(root_dir, _CONFIG_FILE)
  if os.path.exists(path):
    try:
      with open(path) as f:
        saved = _resume_keys(settings_lib.canonical_dict(json.load(f)))
    except (OSError, ValueError) as e:
      raise errors.CheckpointError(
          f'{path} is unreadable ({e}); use a new --root_dir') from None
    current = _resume_keys(settings_lib.canonical_dict(config.to_dict()))
    defaults = _flat(settings_lib.canonical_dict(
        settings_lib.default_config().to_dict()))
    for key in sorted(current):
      now = current[key]
      before = saved.get(key, defaults.get(key, now))
      if before != now:
        raise errors.CheckpointError(
            f'{root_dir} holds a run with a different {key!r} '
            f'({before!r} there, {now!r} now); use a new --root_dir')
  with open(path, 'w') as f:
    json.dump(config.to_dict(), f, indent=2, sort_keys=True)


def _seeded_initial_weights(model_fn) -> tff.learning.models.ModelWeights:
  model = model_fn()
  return tff.learning.models.ModelWeights(
      trainable=[v.numpy() for v in model.trainable_weights],
      non_trainable=[v.numpy() for v in model.non_trainable_weights])


def _load_or_initialize(exp: Experiment,
                        manager: tff.program.FileProgramStateManager):
  """Returns (state, completed_rounds).

  Tries the checkpoints from the newest down. When the newest ones cannot be
  read (e.g. a disk filled up or a copy was cut short while saving), the
  run resumes from the newest readable one with a warning; the unreadable
  folders are moved to `<root>/checkpoints_unreadable/` (kept, not deleted),
  so the rounds after it are re-run and saved again. When none can be read,
  a `CheckpointError` says so and nothing is moved.
  """
  initial = exp.process.initialize()
  initial = exp.process.set_model_weights(
      initial, _seeded_initial_weights(exp.model_fn))
  versions = sorted(_sync(manager.get_versions()) or [])
  failures = []
  for version in reversed(versions):
    try:
      state = _sync(manager.load(version, initial))
    except Exception as e:  # pylint: disable=broad-except
      # TFF raises a mix of TF, IO and structure errors here.
      failures.append((version, _first_line(e)))
      continue
    if failures:
      _set_aside(manager, [v for v, _ in failures])
      logging.warning(
          'checkpoint(s) of round(s) %s in %s are unreadable (%s); resuming '
          'from round %d, the newest readable one. The unreadable ones are '
          'kept in %s', ', '.join(str(v) for v, _ in failures),
          manager._root_dir, failures[0][1], version,  # pylint: disable=protected-access
          _unreadable_dir(manager))
    return state, int(version)
  if failures:
    raise errors.CheckpointError(
        f'checkpoint in {manager._root_dir} is unreadable or incompatible '  # pylint: disable=protected-access
        f'with this experiment: {failures[0][1]} (no readable checkpoint '
        f'among rounds {", ".join(str(v) for v in versions)})')
  return initial, 0


def _first_line(e: Exception) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def _unreadable_dir(manager: tff.program.FileProgramStateManager) -> str:
  return manager._root_dir.rstrip(os.sep) + '_unreadable'  # pylint: disable=protected-access


def _set_aside(manager: tff.program.FileProgramStateManager,
               versions: list[int]) -> None:
  """Moves unreadable checkpoint folders out of the manager's sight."""
  target = _unreadable_dir(manager)
  os.makedirs(target, exist_ok=True)
  for version in versions:
    path = manager._get_path_for_version(version)  # pylint: disable=protected-access
    dest = os.path.join(target, os.path.basename(path))
    suffix = 0
    while os.path.exists(dest):
      suffix += 1
      dest = os.path.join(target, f'{os.path.basename(path)}.{suffix}')
    os.replace(path, dest)


def load_state(config: ml_collections.ConfigDict, root_dir: str):
  """The newest checkpointed process state of a run, and its round.

  For notebooks and checks: e.g. the global model is
  `Experiment.process.get_model_weights(state)`, and a method's own state
  (DaFKD's discriminator store, FedFTG's generator) is in `state` too.

  Args:
    config: The run's config.
    root_dir: The run's folder.

  Returns:
    (state, completed rounds); (the initial state, 0) when nothing is saved.

  Raises:
    UserError: a bad config or data, or an unreadable checkpoint.
  """
  exp = prepare(config, root_dir)
  manager = tff.program.FileProgramStateManager(
      os.path.join(root_dir, 'checkpoints'),
      keep_total=config.keep_checkpoints)
  return _load_or_initialize(exp, manager)


def _round_metrics(output, config) -> dict[str, Any]:
  cw = output.metrics['client_work']['train']
  examples = float(cw['num_examples'])
  metrics = {
      'train/loss': float(cw['train_loss_sum']) / max(examples, 1.0),
      'train/num_examples': examples,
      'train/num_steps': float(cw['num_steps']),
      'train/learning_rate': float(cw['learning_rate']),
      'comm/bytes_down': float(cw['bytes_down']),
      'comm/bytes_up': float(cw['bytes_up']),
      'clients_per_round': config.clients_per_round,
  }
  # Method-specific client measurements (e.g. DaFKD's discriminator
  # accuracy) report under `client/`.
  for key, value in cw.items():
    if key not in _STANDARD_CLIENT_METRICS and _is_scalar(value):
      metrics[f'client/{key}'] = float(value)
  # Server-side stages (distillation, generator training) report under
  # `distill/`.
  finalizer = output.metrics.get('finalizer')
  if isinstance(finalizer, dict):
    for key, value in finalizer.items():
      if _is_scalar(value):
        metrics[f'distill/{key}'] = float(value)
  return metrics


def _check_round(metrics: dict, round_num: int, last_saved: int,
                 root_dir: str) -> None:
  """Stops a run whose round has no usable client or a non-finite loss.

  Clients with a non-finite update are excluded and counted
  (`client/num_excluded`); the run goes on while at least one is left.
  """
  excluded = metrics.get('client/num_excluded', 0.0)
  num_clients = metrics.get('client/num_clients', math.inf)
  if excluded >= num_clients:
    reason = (f'every client\'s update ({int(excluded)} of '
              f'{int(num_clients)}) was non-finite')
  elif not math.isfinite(metrics['train/loss']):
    reason = f"training loss is {metrics['train/loss']}"
  else:
    return
  raise errors.TrainingError(
      f'round {round_num + 1}: {reason}; the last good state (round '
      f'{last_saved}) stays in {root_dir}; lower the learning rate or '
      'check the client data')


_STANDARD_CLIENT_METRICS = frozenset((
    'num_examples', 'train_loss_sum', 'num_steps', 'learning_rate',
    'bytes_down', 'bytes_up'))


def _is_scalar(value) -> bool:
  return np.ndim(value) == 0 and not isinstance(value, (dict, str, bytes))


def _evaluate(exp: Experiment, state) -> dict[str, float]:
  """Whole-test-set loss and accuracy of the global model (and of every
  other FedDF prototype). With client domains: per domain
  (`test/accuracy_<domain>`, `test/loss_<domain>`), and `test/accuracy` /
  `test/loss` are the unweighted means over the client domains."""
  metrics = {}
  if exp.domain_evaluators:
    weights = exp.process.get_model_weights(state)
    results = [(name, ev(weights)) for name, ev in exp.domain_evaluators]
    for name, r in results:
      metrics[f'test/loss_{name}'] = r.loss
      metrics[f'test/accuracy_{name}'] = r.accuracy
    metrics['test/loss'] = float(np.mean([r.loss for _, r in results]))
    metrics['test/accuracy'] = float(np.mean([r.accuracy
                                              for _, r in results]))
  else:
    metrics['test/loss'], metrics['test/accuracy'] = exp.evaluator(
        exp.process.get_model_weights(state))
  if exp.prototype_evaluators:
    others = composer.global_models(state)[1:]
    for p, (ev, w) in enumerate(zip(exp.prototype_evaluators, others), 1):
      metrics[f'test/accuracy_p{p}'] = ev(w).accuracy
  return metrics


def warm_up(exp: Experiment) -> concurrent.futures.Future:
  """Does the one-time work of a first round ahead of it.

  Compiles the process's runtime computations for the current context
  (`context.precompile`) and traces the evaluators, so that round 1 costs
  about what later rounds do. `next`, the big one (1 s for FedGen, most of
  it TFF's static Grappler pass), compiles on a background thread while
  this one traces the evaluators and the caller initialises and checkpoints
  round 0 (measured: FedGen's start-up 0.2-0.4 s shorter than in
  sequence). Nothing is trained and no state is touched: rounds are the
  same with or without it.

  Returns:
    A future whose result is the seconds the background compile took; wait
    for it before round 1 (its exceptions are the compiler's).
  """
  process = getattr(exp.process, 'runtime_process', exp.process)
  cache = context.compiler_cache()  # Looked up here: contexts are per thread.
  context.precompile(process.initialize, process.get_model_weights,
                     cache=cache)
  pool = concurrent.futures.ThreadPoolExecutor(
      max_workers=1, thread_name_prefix='tff_kd_warm_up')

  def compile_next() -> float:
    t0 = time.perf_counter()
    context.precompile(process.next, cache=cache)
    return time.perf_counter() - t0

  future = pool.submit(compile_next)
  pool.shutdown(wait=False)
  evaluators = [exp.evaluator, exp.slice_evaluator,
                *exp.prototype_evaluators,
                *(ev for _, ev in exp.domain_evaluators)]
  for ev in evaluators:
    if ev is not None:
      ev.trace()
  return future


def _release(manager: tff.program.ReleaseManager, value: dict,
             key: int) -> None:
  _sync(manager.release(value, key=key))


def run(config: ml_collections.ConfigDict, root_dir: str, *,
        progress: bool = True) -> RunResult:
  """Trains, evaluates, checkpoints and exports one experiment.

  Args:
    config: Experiment config (see `configs/base.py`).
    root_dir: Output folder; restarting with the same folder resumes.
    progress: Show a tqdm progress bar.

  Returns:
    A `RunResult` with the per-round metrics of the rounds run in this call,
    the final metrics and the SavedModel directory.

  Raises:
    UserError: for bad input (before any training) or a non-finite loss.
  """
  exp = prepare(config, root_dir)
  os.makedirs(root_dir, exist_ok=True)
  _check_resumable(config, root_dir)
  warm = warm_up(exp)
  manager = tff.program.FileProgramStateManager(
      os.path.join(root_dir, 'checkpoints'),
      keep_total=config.keep_checkpoints)
  state, start = _load_or_initialize(exp, manager)
  resumed_after = start
  # A run stopped before its first checkpoint after round 0 resumes from
  # round 0's, which is already saved.
  if not _sync(manager.get_versions()):
    _sync(manager.save(state, 0))
  else:
    logging.info('Resuming %s after round %d', root_dir, start)

  releaser = tff.program.GroupingReleaseManager([
      tff.program.CSVFileReleaseManager(
          os.path.join(root_dir, 'metrics.csv'), key_fieldname='round'),
      tff.program.TensorBoardReleaseManager(os.path.join(root_dir, 'tb')),
      tff.program.LoggingReleaseManager(),
  ])
  logging.info('compiling the round took %.2f s (in the background)',
               warm.result())
  history = []
  num_clients = config.partition.num_clients
  bar = tqdm.tqdm(total=config.rounds, initial=start, disable=not progress,
                  desc=config.method, unit='round')
  for round_num in range(start, config.rounds):
    clients = sampling.sample_clients(num_clients, config.clients_per_round,
                                      seed=config.seed, round_num=round_num)
    keys = exp.client_data.keys(clients, seed=config.seed,
                                round_num=round_num)
    t0 = time.perf_counter()
    output = exp.process.next(state, keys)
    t_train = time.perf_counter() - t0
    metrics = _round_metrics(output, config)
    _check_round(metrics, round_num, start, root_dir)
    state = output.state
    metrics['time/train_s'] = t_train

    last = round_num + 1 == config.rounds
    if (round_num + 1) % config.eval_every == 0 or last:
      t0 = time.perf_counter()
      metrics.update(_evaluate(exp, state))
      if exp.slice_evaluator is not None:
        sliced = exp.slice_evaluator(exp.process.get_model_weights(state))
        metrics['test_slices/accuracy'] = sliced.accuracy
      metrics['time/eval_s'] = time.perf_counter() - t0

    if (round_num + 1) % config.checkpoint_every == 0 or last:
      t0 = time.perf_counter()
      _sync(manager.save(state, round_num + 1))
      start = round_num + 1
      metrics['time/checkpoint_s'] = time.perf_counter() - t0
    _release(releaser, metrics, round_num + 1)
    history.append(dict(metrics, round=round_num + 1))
    bar.set_postfix(acc=f"{metrics.get('test/accuracy', float('nan')):.4f}",
                    s_per_round=f'{t_train:.1f}')
    bar.update(1)
  bar.close()

  weights = exp.process.get_model_weights(state)
  # The last round is always evaluated; only a run that had no round left
  # to train evaluates here.
  final = dict(round=config.rounds, **(
      {k: v for k, v in history[-1].items() if k.startswith('test/')}
      if history else _evaluate(exp, state)))
  export_dir = None
  if config.export:
    model = exp.model_fn()
    weights.assign_weights_to(model)
    export_dir = export.export_saved_model(
        model, os.path.join(root_dir, 'export'))
  with open(os.path.join(root_dir, 'final.json'), 'w') as f:
    json.dump(final, f, indent=2)
  return RunResult(history, final, export_dir, resumed_after)
