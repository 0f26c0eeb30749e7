"""The round loop: train, evaluate, release metrics, checkpoint, export.

`run(settings, root_dir)` locks the run folder for the whole run
(`tff_kd.program.run_folder`), prepares the experiment
(`tff_kd.program.setup`) and runs its rounds; `run_experiment(exp,
root_dir)` runs the rounds of an experiment prepared elsewhere (FedJAX's
shape: a notebook hands the loop its own process or data, as
`exp._replace(process=...)`). The loop resumes from the newest checkpoint in
`root_dir/checkpoints` or initialises from the seeded Keras model
(`tff_kd.program.checkpoints`), then per round: samples clients from (seed,
round), runs `process.next`, calls the experiment's evaluations of the
global model (`tff_kd.program.evaluation`), releases metrics to CSV,
TensorBoard and the log (`tff_kd.program.releases`) and then checkpoints.
TensorBoard also gets the run's settings, for its HParams dashboard.
It exports the final global model as a Keras SavedModel that plain
TensorFlow can load (`tff_kd.program.export`).

Because the client sample and every client's shuffle depend only on (seed,
round), an interrupted run that is restarted with the same root_dir replays
exactly the rounds it lost; the metrics released after its last checkpoint
are dropped first, so every round is logged exactly once. A write that
fails mid-run (a full disk, a folder turned read-only) stops the run with
one line naming the path and the last good round (`errors.StorageError`).
"""

import concurrent.futures
import contextlib
import json
import math
import os
import signal
import time
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence, Union

from absl import logging
import ml_collections
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tqdm

from tff_kd import errors
from tff_kd.federated import tff_types
from tff_kd.program import checkpoints
from tff_kd.program import evaluation
from tff_kd.program import export
from tff_kd.program import releases
from tff_kd.program import run_folder
from tff_kd.program import sampling
from tff_kd.program import setup
from tff_kd.program import settings as settings_lib
from tff_kd.runtime import aio
from tff_kd.runtime import context
from tff_kd.runtime import server_stage


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


# What `run`'s `on_round` is called with: one round's metrics.
RoundCallback = Callable[[dict[str, Any]], None]


def _round_metrics(output, clients_per_round: int) -> dict[str, Any]:
  cw = output.metrics['client_work']['train']
  examples = float(cw['num_examples'])
  metrics = {
      'train/loss': float(cw['train_loss_sum']) / max(examples, 1.0),
      'train/num_examples': examples,
      'train/num_steps': float(cw['num_steps']),
      'train/learning_rate': float(cw['learning_rate']),
      'comm/bytes_down': float(cw['bytes_down']),
      'comm/bytes_up': float(cw['bytes_up']),
      'clients_per_round': clients_per_round,
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


def _excluded_clients(exp: setup.Experiment, metrics: dict,
                      clients: np.ndarray, round_num: int) -> list[str]:
  """Warns about a round's excluded clients; returns the data problems.

  A client is excluded for a non-finite update, which unreadable, truncated
  or mis-shaped client data also gives (`FileClientData.read_arrays`); in a
  round that excluded any, the sampled clients' files are checked on the
  driver, and each bad file is named in a warning.
  """
  if not metrics.get('client/num_excluded', 0.0):
    return []
  check = getattr(exp.client_data, 'problem', None)
  problems = [p for p in (check(int(c)) for c in clients) if p] if check else []
  excluded = int(metrics['client/num_excluded'])
  # A round without any client left stops with one line (`_check_round`);
  # its files then go to the log only.
  log = (logging.info if excluded >= metrics.get('client/num_clients',
                                                 math.inf)
         else logging.warning)
  for problem in problems:
    log('round %d: a client is excluded for its data: %s', round_num + 1,
        problem)
  if len(problems) < excluded:
    log('round %d: %d client(s) excluded for a non-finite update',
        round_num + 1, excluded - len(problems))
  return problems


def _check_round(metrics: dict, round_num: int, last_saved: int,
                 root_dir: str, problems: Sequence[str] = ()) -> None:
  """Stops a run whose round has no usable client or a non-finite loss.

  Clients with a non-finite update or unreadable data are excluded and
  counted (`client/num_excluded`); the run goes on while at least one is
  left.
  """
  excluded = metrics.get('client/num_excluded', 0.0)
  num_clients = metrics.get('client/num_clients', math.inf)
  advice = 'lower the learning rate or check the client data'
  if excluded >= num_clients and problems:
    more = (f' and {len(problems) - 1} more (in the log)'
            if len(problems) > 1 else '')
    reason = (f'every client ({int(excluded)} of {int(num_clients)}) was '
              f'excluded; unreadable client data: {problems[0]}{more}')
    advice = 'check the client data'
  elif excluded >= num_clients:
    reason = (f'every client\'s update ({int(excluded)} of '
              f'{int(num_clients)}) was non-finite')
  elif not math.isfinite(metrics['train/loss']):
    reason = f"training loss is {metrics['train/loss']}"
  else:
    return
  raise errors.TrainingError(
      f'round {round_num + 1}: {reason}; the last good state (round '
      f'{last_saved}) stays in {root_dir}; {advice}')


_STANDARD_CLIENT_METRICS = frozenset((
    'num_examples', 'train_loss_sum', 'num_steps', 'learning_rate',
    'bytes_down', 'bytes_up'))


def _is_scalar(value) -> bool:
  return np.ndim(value) == 0 and not isinstance(value, (dict, str, bytes))


def evaluate(exp: setup.Experiment, state: Any) -> dict[str, float]:
  """Every evaluation of the experiment (`Experiment.evaluations`) of the
  global model(s) of `state`, in the map's order."""
  return evaluation.evaluate(exp.evaluations,
                             exp.process.get_model_weights(state), state)


def warm_up(exp: setup.Experiment) -> concurrent.futures.Future:
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
  process = server_stage.runtime_part(exp.process)
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
  for entry in exp.evaluations.values():
    for evaluator in entry.evaluators():
      evaluator.trace()
  return future


def _release(manager: tff.program.ReleaseManager, value: dict,
             key: int) -> None:
  aio.run_sync(manager.release(value, key=key))


# Fault injection for tests/faults/: with this variable set to r, the
# process SIGKILLs itself after releasing round r's metrics and before
# saving its checkpoint, the one instant where the two differ.
KILL_BEFORE_CHECKPOINT_ENV = 'TFF_KD_TEST_KILL_BEFORE_CHECKPOINT'


def _before_checkpoint(round_num: int) -> None:
  """Runs between round `round_num`'s metrics and its checkpoint."""
  if os.environ.get(KILL_BEFORE_CHECKPOINT_ENV) == str(round_num):
    os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def _writing(path: str, root_dir: str, last_saved: int) -> Iterator[None]:
  """Turns a failed write of the run folder (a full disk, a folder that
  became read-only) into a one-line `StorageError` with how to resume."""
  try:
    yield
  except (OSError, tf.errors.OpError) as e:
    if isinstance(e, OSError):
      reason = e.strerror or str(e) or type(e).__name__
      path = e.filename or path
    else:  # TF's file errors read '<path>; <strerror>'.
      reason = (e.message or type(e).__name__).strip().splitlines()[0]
      reason = reason.rsplit('; ', 1)[-1]
    raise errors.StorageError(
        f'cannot write {path}: {reason}; the last good state (round '
        f'{last_saved}) stays in {os.path.join(root_dir, "checkpoints")}; '
        'free space or make the folder writable, then run the same command '
        'to resume') from e


def run(settings: Union[settings_lib.Settings, ml_collections.ConfigDict],
        root_dir: str, *, progress: bool = True, client_data: Any = None,
        test_data: Any = None,
        on_round: Optional[RoundCallback] = None) -> RunResult:
  """Trains, evaluates, checkpoints and exports one experiment.

  Holds the run folder's lock throughout (`tff_kd.program.run_folder`): a
  second run on the same folder is refused.

  Args:
    settings: The run's validated settings, or an experiment config (see
      `configs/base.py`), validated once here, before the folder is made.
    root_dir: Output folder; restarting with the same folder resumes.
    progress: Show a tqdm progress bar.
    client_data: Optional federated training clients (a
      `tff_kd.federated.tff_client_data.TFFClientData`) instead of the
      settings' partition; see `setup.prepare`.
    test_data: Their central test set; see `setup.prepare`.
    on_round: Called after each round with its metrics (a `RunResult.history`
      entry), once they are released (e.g. `compare`'s progress bar).

  Returns:
    A `RunResult` with the per-round metrics of the rounds run in this call,
    the final metrics and the SavedModel directory.

  Raises:
    UserError: for bad input (before any training), a folder in use by
      another run, a round without a usable client or with a non-finite
      loss, or a write that failed mid-run (`StorageError`).
  """
  settings = setup.settings_of(
      settings, with_client_data=client_data is not None or
      test_data is not None)
  with run_folder.locked(root_dir):
    run_folder.remove_debris(root_dir, 'checkpoints')
    exp = setup.prepare(settings, root_dir, client_data=client_data,
                        test_data=test_data)
    return _rounds(exp, root_dir, progress, on_round)


def run_experiment(exp: setup.Experiment, root_dir: str, *,
                   progress: bool = True,
                   on_round: Optional[RoundCallback] = None) -> RunResult:
  """The rounds of an experiment prepared elsewhere, as `run` runs them.

  For a notebook that brings its own process or data: `prepare` an
  experiment, replace what it brings (`exp._replace(process=...)`), and
  hand it to the loop with its folder. The run settings (rounds,
  evaluation and checkpoint cadence, export) are `exp.settings.run`.

  Args:
    exp: A prepared experiment (`setup.prepare`).
    root_dir: Output folder; restarting with the same folder resumes. It
      must be the folder `exp` was prepared in, or hold nothing else.
    progress: Show a tqdm progress bar.
    on_round: Called after each round with its metrics, as in `run`.

  Returns:
    A `RunResult`, as `run`'s.
  """
  with run_folder.locked(root_dir):
    run_folder.remove_debris(root_dir, 'checkpoints')
    return _rounds(exp, root_dir, progress, on_round)


def _rounds(exp: setup.Experiment, root_dir: str, progress: bool,
            on_round: Optional[RoundCallback] = None) -> RunResult:
  """`run`'s rounds, under the run folder's lock."""
  settings = exp.settings
  rs = settings.run
  checkpoints.check_resumable(settings, root_dir)
  warm = warm_up(exp)
  manager = checkpoints.manager_for(settings, root_dir)
  state, start = checkpoints.load_or_initialize(exp, manager)
  resumed_after = start
  # A run stopped before its first checkpoint after round 0 resumes from
  # round 0's, which is already saved.
  if not aio.run_sync(manager.get_versions()):
    with _writing(manager.path_for_version(0), root_dir, 0):
      aio.run_sync(manager.save(state, 0))
  else:
    logging.info('Resuming %s after round %d', root_dir, start)
  # Rounds released after the checkpoint resumed from are run again.
  releases.drop_after(root_dir, start)
  # The settings go to TensorBoard's HParams dashboard with the first
  # events (`releases`).
  with _writing(os.path.join(root_dir, releases.TENSORBOARD_DIR), root_dir,
                start):
    releaser = releases.release_manager(root_dir, settings.flat_config())
  logging.info('compiling the round took %.2f s (in the background)',
               warm.result())
  history = []
  num_clients = settings.partition.num_clients
  bar = tqdm.tqdm(total=rs.rounds, initial=start, disable=not progress,
                  desc=rs.method, unit='round')
  for round_num in range(start, rs.rounds):
    clients = sampling.sample_clients(num_clients, rs.clients_per_round,
                                      seed=rs.seed, round_num=round_num)
    keys = tff_types.group_keys(
        exp.client_data.keys(clients, seed=rs.seed, round_num=round_num),
        exp.inputs.client_execution.clients_per_call)
    t0 = time.perf_counter()
    output = exp.process.next(state, keys)
    t_train = time.perf_counter() - t0
    metrics = _round_metrics(output, rs.clients_per_round)
    problems = _excluded_clients(exp, metrics, clients, round_num)
    _check_round(metrics, round_num, start, root_dir, problems)
    state = output.state
    metrics['time/train_s'] = t_train

    last = round_num + 1 == rs.rounds
    if (round_num + 1) % rs.eval_every == 0 or last:
      t0 = time.perf_counter()
      metrics.update(evaluate(exp, state))
      metrics['time/eval_s'] = time.perf_counter() - t0

    # Metrics first, then the checkpoint: a run stopped between the two
    # resumes from the previous checkpoint and drops this round's metrics
    # (`releases.drop_after`), so every round is logged exactly once.
    with _writing(os.path.join(root_dir, releases.METRICS_CSV), root_dir,
                  start):
      _release(releaser, metrics, round_num + 1)
    _before_checkpoint(round_num + 1)
    if (round_num + 1) % rs.checkpoint_every == 0 or last:
      t0 = time.perf_counter()
      with _writing(manager.path_for_version(round_num + 1), root_dir,
                    start):
        aio.run_sync(manager.save(state, round_num + 1))
      start = round_num + 1
      # In the history and the log; the round's released row precedes it.
      metrics['time/checkpoint_s'] = time.perf_counter() - t0
      logging.info('round %d checkpointed in %.2f s', start,
                   metrics['time/checkpoint_s'])
    history.append(dict(metrics, round=round_num + 1))
    if on_round is not None:
      on_round(history[-1])
    bar.set_postfix(acc=f"{metrics.get('test/accuracy', float('nan')):.4f}",
                    s_per_round=f'{t_train:.1f}')
    bar.update(1)
  bar.close()

  weights = exp.process.get_model_weights(state)
  # The last round is always evaluated; only a run that had no round left
  # to train evaluates here.
  latest = history[-1] if history else evaluate(exp, state)
  final = dict(round=rs.rounds,
               **{k: v for k, v in latest.items() if k.startswith('test/')})
  export_dir = None
  if rs.export:
    model = exp.model_fn()
    weights.assign_weights_to(model)
    with _writing(os.path.join(root_dir, 'export'), root_dir, start):
      export_dir = export.export_saved_model(
          model, os.path.join(root_dir, 'export'))
  final_path = os.path.join(root_dir, 'final.json')
  with _writing(final_path, root_dir, start), open(final_path, 'w') as f:
    json.dump(final, f, indent=2)
  return RunResult(history, final, export_dir, resumed_after)
