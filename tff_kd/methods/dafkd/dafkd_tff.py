"""DaFKD as a TFF learning process: its stages, builder and registry entry.

Wang, Li, Xu, Wang, Wu, Guo, "DaFKD: Domain-aware Federated Knowledge
Distillation", CVPR 2023 (Algorithm 1): each client trains its classifier
jointly with a domain discriminator (eq. 9; the discriminator shares the
classifier's extractor, Sec. 3.4) against a global generator (eqs. 2-3); the
server averages classifiers (eq. 6) and generators (eq. 4), generates a
pseudo pool and distils the ensemble of client predictions weighted by the
discriminators' correlation factors (eqs. 7-8). Appendix B keeps the
discriminators on the clients (secure sums). The maths is
`tff_kd.methods.dafkd.dafkd_tf` and `tff_kd.methods.dafkd.gan`; the
hyper-parameters are `tff_kd.methods.dafkd.hparams.DaFKDHparams`
(`config.dafkd`), whose ablations (Table 3) are `shared_extractor=False`
(a separate discriminator network per client) and `weighting='uniform'`
(uniform teacher weights). One round:

1. distributor: broadcast the server model, a tuple (classifier
   `ModelWeights`, generator `ModelWeights`) (line 6);
2. client work (`build_client_work`): its state is (round number, the
   discriminator store). The store is a [K, ...] structure holding every
   client's discriminator (`dafkd_tf.discriminator_variables`: the head
   when it shares the classifier's extractor, the whole network otherwise),
   indexed by client id, so that line 18 ("set theta_k^d as the same in
   previous round") holds for stateless simulated clients and the store is
   checkpointed and resumed with the rest of the state. The store is
   broadcast; client k reads row `id` (from its key `"<id>|<seed>|<round>"`),
   runs `dafkd_tf.client_round` (eq. 9 then eq. 3 per minibatch), and its
   new row comes back through a `tff.federated_aggregate` that scatters rows
   by id (`tff_kd.federated.client_store.ClientStore`, in the shared
   `client_store.build_stateful_client_work`); rows of clients not sampled
   this round are unchanged. There is no optimiser state to
   keep: local optimisers start fresh every round, as in `local_training`.
   With appendix B (`private`), the client also draws the round's pool from
   the broadcast generator and computes f_k s_k and f_k;
3. aggregator (`build_aggregator`): `tff_kd.federated.stacking.
   build_stacking_aggregator` stacks every client's classifier delta (and,
   plain mode, discriminator) into [M, ...] rows; the generator deltas are
   only summed, weighted (`build_weighted_sum_aggregator`: one generator in
   the accumulator, not M). In private mode the discriminator is
   not in the stack and the f_k s_k, f_k terms go through
   `tff.aggregators.SecureSumFactory` (clipped to [0, 1], quantised to 32
   bits, `federated_secure_sum_bitwidth`), so the server sees only
   sum_k f_k s_k and sum_k f_k;
4. finalizer (`build_finalizer`): `dafkd_tf.server_round`: plain means of
   classifiers (eq. 6) and generators (eq. 4), a pool of `pool_size`
   generated images seeded by (seed, round), alpha of eq. (7), the target of
   eq. (8) and `distillation.distill` into the mean classifier; the round's
   mechanism metrics come from its one diagnostics hook
   (`diagnostics.RoundDiagnostics`, `tff_kd.core.diagnostics`).

State: `tff.learning.templates.LearningAlgorithmState` whose
`global_model_weights` is `(classifier ModelWeights, generator
ModelWeights)`; `get_model_weights` / `set_model_weights` see the classifier
(`composer.first_model_view`). The client work's state holds the round
number and every client's discriminator (`discriminator_store`).

Cost of the server-held store: the simulation broadcasts all K rows to
every client and each client's aggregation accumulator has K rows, i.e.
K x (head size) floats (20 x 257 for ResNet-11's head; the whole
discriminator without sharing: 20 x ~0.6 M for ResNet-11). A real client
keeps its own row on its device, so `bytes_down` / `bytes_up` count only the
client's own row (plain mode: it is uploaded, line 26, and read back next
time; private mode: it never moves, so it is not counted at all, and the
store stands for the clients' own storage, never read by the finalizer).
In plain mode the uploaded row reaches the server twice in the simulation
(the stack for the finalizer, the scatter for the store); it is counted once.
With the real pool (`pool='real'`) the generator is broadcast and averaged
in the simulation but never trained, so the counts leave it out both ways;
every client reads the server's unlabeled pool, which `bytes_down` counts
in every client's round (a client keeps nothing between rounds).

A secure-sum intrinsic needs an execution context that implements it: TFF
0.87's `tff.backends.test` contexts (`tff_kd.runtime.context`'s
`set_test_context`) replace it by an insecure sum; the plain local C++
context rejects it.
"""

import collections
import functools
from typing import Callable, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd import hparams as hp
from tff_kd.core import diagnostics as core_diagnostics
from tff_kd.core import distill_hparams
from tff_kd.core import local_training
from tff_kd.core import stacking as stacking_tf
from tff_kd.core import teachers as teachers_tf
from tff_kd.federated import client_store
from tff_kd.federated import client_works
from tff_kd.federated import composer
from tff_kd.federated import finalizers
from tff_kd.federated import schedules
from tff_kd.federated import server_data as server_data_lib
from tff_kd.federated import stacking
from tff_kd.federated import tff_types
from tff_kd.methods import common
from tff_kd.methods.dafkd import dafkd_tf
from tff_kd.methods.dafkd import diagnostics
from tff_kd.methods.dafkd import gan
from tff_kd.methods.dafkd import hparams as hparams_lib
from tff_kd.models import classifiers
from tff_kd.models import generators

_FLOAT_BYTES = np.dtype(np.float32).itemsize


class ModelSpec(NamedTuple):
  """How every stage builds DaFKD's models (inside its own computation).

  Attributes:
    classifier_fn: No-arg builder of the `Classifier` (shared features).
    generator_fn: No-arg builder of the conditional generator of images,
      or of the extractor's features (appendix A).
    shared: The discriminator shares the classifier's extractor.
    discriminator_seed: Initialiser seed of the discriminator.
    settings: `gan.GanSettings`.
    projection: A projection discriminator head f_k(x, y) instead of
      DaFKD's f_k(x).
    global_discriminator: One discriminator for every client
      (`dafkd.discriminator_sharing='global'`): a one-row store that every
      client reads and that becomes the mean of the round's trained rows.
  """

  classifier_fn: Callable[[], classifiers.Classifier]
  generator_fn: Callable[[], tf.keras.Model]
  shared: bool
  discriminator_seed: int
  settings: gan.GanSettings
  projection: bool = False
  global_discriminator: bool = False

  def build(self) -> gan.GanModels:
    """(classifier, discriminator, generator), freshly built."""
    classifier = self.classifier_fn()
    discriminator = generators.build_discriminator_head(
        classifier, seed=self.discriminator_seed, shared=self.shared,
        num_classes=self.settings.num_classes if self.projection else 0)
    return gan.GanModels(classifier, discriminator, self.generator_fn())


class Optimizers(NamedTuple):
  """DaFKD's optimisers, and the joint one's schedule.

  Attributes:
    joint: Client optimiser of eq. (9) (paper: lr 1e-3, weight decay 1e-3).
    generator: Client optimiser of eq. (3) (the registry builds Adam from
      `DaFKDHparams.generator_learning_rate` and its betas).
    distill: Server student optimiser (paper: lr 0.01; fresh state every
      round).
    learning_rate: The joint optimiser's learning rate at round 0 (> 0).
    learning_rate_decay: Its multiplier per round, in (0, 1].
    local_epochs: The epochs of a client round, over which its plateau
      schedule and its GAN window in epochs run (`dafkd.client_plateau`,
      `dafkd.gan_epochs`); 0 where the local work is counted in steps.
  """

  joint: tff.learning.optimizers.Optimizer
  generator: tff.learning.optimizers.Optimizer
  distill: tff.learning.optimizers.Optimizer
  learning_rate: float
  learning_rate_decay: float = 1.0
  local_epochs: int = 0

  @property
  def client(self) -> gan.GanOptimizers:
    """The client's two optimisers."""
    return gan.GanOptimizers(self.joint, self.generator)


class PrivateSettings(NamedTuple):
  """Appendix B: pool size, seed, temperature and whether f_k is used."""

  pool_size: int
  seed: int
  temperature: float
  correlation: bool


def _model_values(spec: ModelSpec, build: Callable = lambda fn: fn()):
  """(classifier, generator) `ModelWeights` of the models `build` makes
  from the spec's two builders (the discriminator is not built)."""
  return (local_training.model_weights(build(spec.classifier_fn).model),
          local_training.model_weights(build(spec.generator_fn)))


def models_type(spec: ModelSpec) -> tff.Type:
  """TFF type of the server model: (classifier, generator) `ModelWeights`.

  Read off `local_training.structure_of`'s builds, which `model_spec`
  already made: no model is built for it.
  """
  return tff_types.spec_to_type(
      _model_values(spec, local_training.structure_of))


def build_initial_weights_fn(spec: ModelSpec) -> tff.Computation:
  """A no-arg TFF computation returning the initial server model."""

  @tff.tensorflow.computation
  def initial_weights():
    return _model_values(spec)

  return initial_weights


def _row_values(spec: ModelSpec) -> tuple:
  _, discriminator, _ = spec.build()
  return tuple(dafkd_tf.discriminator_variables(discriminator))


def build_client_work(
    spec: ModelSpec,
    element_spec: collections.OrderedDict,
    dataset_fn: tff_types.DatasetFn,
    optimizers: gan.GanOptimizers,
    *,
    num_clients: int,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
    private: Optional[PrivateSettings] = None,
    negatives_fn: Optional[Callable[[], tf.Tensor]] = None,
    seed: int = 0,
) -> tff.templates.MeasuredProcess:
  """DaFKD's client work with the per-client discriminator store.

  State: `(round_num, store)` at the server (see the module docstring). The
  round number sets the joint learning rate `lr * decay**round` (and the
  private pool's seed). Update per client: `classifier` and `generator`
  deltas (`ModelWeights`), plus `discriminator` and `label_counts` (plain)
  or `fs` [N, C] and `f` [N] (private); weight: its number of examples.
  `label_counts` (the labels trained on) feed only the server's
  simulation-only diagnostics (`dafkd.weight_diagnostics`): a deployment
  would not upload them, so `bytes_up` does not count them. Measurements:
  the standard sums of `client_works.build_scheduled_client_work` and the
  client means of `dafkd_tf.MEAN_NAMES`.

  Args:
    spec: `ModelSpec`.
    element_spec: Batch structure of the client datasets.
    dataset_fn: Key -> dataset (the fast path: keys carry the client id),
      or None: clients take `OrderedDict(client_id=int32, data=<dataset>)`
      (`tff_types.client_data_type`).
    optimizers: `gan.GanOptimizers` of eq. (9) and eq. (3).
    num_clients: K, the rows of the store; client ids must be in [0, K).
    learning_rate: Joint learning rate at round 0.
    learning_rate_decay: Its multiplier per round.
    private: Appendix B settings, or None (plain DaFKD).
    negatives_fn: The oracle-pool ablation: a no-arg TF function returning
      real images of the global distribution (the server's proxy pool,
      read inside the client's computation as if broadcast, and counted in
      `bytes_down`) that replace the generated negatives; None: generated
      negatives (DaFKD).
    seed: The process seed; with `dataset_fn=None` it seeds each client's
      round as the keys' seed field does (`tff_types.client_input`).

  Returns:
    A `tff.templates.MeasuredProcess`.
  """
  weights_type = models_type(spec)
  data_type = tff_types.client_data_type(element_spec, dataset_fn,
                                        with_id=True)
  store = client_store.ClientStore(
      lambda: _row_values(spec), 1 if spec.global_discriminator else num_clients,
      what='client')
  model_bytes = float(tff_types.payload_bytes(weights_type))
  row_bytes = store.row_bytes
  if negatives_fn is not None:
    # The real pool: no client trains the generator, so a deployment sends
    # neither it nor its (zero) delta; every client reads the pool instead
    # (`client_fn` adds its bytes down).
    model_bytes = float(tff_types.payload_bytes(weights_type[0]))
  if private is None:
    # Down: the models and the client's row (and the real pool); up: the
    # models, the row, its weight, its id.
    bytes_down = model_bytes + row_bytes
    bytes_up = model_bytes + row_bytes + 2 * _FLOAT_BYTES
  else:
    num_terms = private.pool_size * (spec.settings.num_classes + 1)
    bytes_down = model_bytes
    bytes_up = model_bytes + (num_terms + 1) * _FLOAT_BYTES

  def client_fn(weights, data, lr, round_num, rows):
    client = tff_types.client_input(data, dataset_fn, seed=seed,
                                   round_num=round_num)
    client_id = client.client_id
    # A shared discriminator is row 0 for everyone; rows that come back to
    # one row are averaged (`client_store.ClientStore`).
    row_id = (tf.zeros_like(client_id) if spec.global_discriminator
              else client_id)
    row = list(store.read(rows, row_id))
    private_pool = None
    if private is not None:
      private_pool = dafkd_tf.PrivatePool(
          private.pool_size, dafkd_tf.pool_seed(private.seed, round_num),
          private.temperature, private.correlation)
    negatives = None if negatives_fn is None else negatives_fn()
    r = dafkd_tf.client_round(
        spec.build(), weights, row, client.dataset, optimizers,
        dafkd_tf.Round(lr, round_num),
        tff_types.key_seed(client.key), spec.settings,
        private_pool=private_pool, negatives_pool=negatives)
    # The real pool's shape is static: its bytes are known at trace time.
    pool_bytes = (0.0 if negatives is None else
                  float(negatives.shape.num_elements() * negatives.dtype.size))
    update = collections.OrderedDict(classifier=r.classifier_delta,
                                     generator=r.generator_delta)
    if private is None:
      update['discriminator'] = tuple(r.discriminator)
      update['label_counts'] = r.label_counts
    else:
      update['fs'], update['f'] = r.private_terms
    client_result, stats, keep = client_works.screen_client(
        tff.learning.templates.ClientResult(
            update=update, update_weight=r.local.num_examples),
        client_works.client_stats(r.local, bytes_down + pool_bytes, bytes_up))
    # An excluded client keeps its old discriminator row, and its GAN
    # measurements get weight 0 in the mean.
    means = tf.where(keep, r.means, tf.zeros_like(r.means))
    return client_store.ClientOutput(
        client_result, stats, store.entry(r.discriminator, row_id, keep),
        collections.OrderedDict(zip(dafkd_tf.MEAN_NAMES, tf.unstack(means))),
        tf.cast(keep, tf.float32))

  return client_store.build_stateful_client_work(
      client_fn, store, weights_type, data_type, learning_rate,
      learning_rate_decay)


def build_aggregator(update_type: tff.Type, num_slots: int, *,
                     private: bool = False,
                     uniform_mean: bool = False
                     ) -> tff.templates.AggregationProcess:
  """Stacks the teachers; averages the generators; (private) secure sums.

  The server needs every client's classifier (a teacher) and, in plain
  mode, its discriminator row and label counts: those are stacked
  (`stacking.build_stacking_aggregator`). It only averages the generators
  (eq. 4), so they go through `stacking.build_weighted_sum_aggregator`,
  whose accumulator holds one generator instead of M: a stacked DCGAN
  generator (0.85 M parameters on MNIST) made the stack 30 times the
  classifiers' and its memory grow with the square of the clients per round
  (studies/dafkd_pool/README.md "Cost at scale"). In private mode the f_k s_k and f_k
  terms go through `tff.aggregators.SecureSumFactory` ([0, 1], 32-bit
  quantisation).

  Args:
    update_type: Unplaced type of a client update (`classifier`,
      `generator`, and `discriminator`, `label_counts` or `fs`, `f`).
    num_slots: M, the most clients per round.
    private: Appendix B's update (`fs`, `f` instead of the discriminator).
    uniform_mean: Average the generators with the paper's 1/K_t (each client
      that took part weighs 1) instead of by examples.

  Returns:
    An `AggregationProcess` whose result is `OrderedDict(stack=Stack of the
    other update parts, generator=(sum_k w_k g_k, sum_k w_k))`, plus
    `terms={fs: sum_k f_k s_k, f: sum_k f_k}` in private mode; measurements:
    the stacked count (and the secure sum's).
  """
  term_keys = ('fs', 'f') if private else ()
  stack_keys = [k for k, _ in tff.structure.iter_elements(update_type)
                if k not in ('generator', *term_keys)]
  stack_type = tff.to_type(collections.OrderedDict(
      (k, update_type[k]) for k in stack_keys))
  stacker = stacking.build_stacking_aggregator(stack_type, num_slots)
  summer = stacking.build_weighted_sum_aggregator(update_type.generator)

  @tff.tensorflow.computation(update_type)
  def stack_part(update):
    return collections.OrderedDict((k, update[k]) for k in stack_keys)

  @tff.tensorflow.computation(update_type)
  def generator_part(update):
    return update['generator']

  @tff.tensorflow.computation(np.float32)
  def generator_weight(weight):
    # An excluded client has weight 0 (`client_works.screen_client`).
    return tf.cast(weight > 0, tf.float32) if uniform_mean else weight

  if private:
    terms_type = tff.to_type(collections.OrderedDict(
        (k, update_type[k]) for k in term_keys))
    secure = tff.aggregators.SecureSumFactory(
        upper_bound_threshold=1.0, lower_bound_threshold=0.0).create(
            terms_type)

    @tff.tensorflow.computation(update_type)
    def terms_part(update):
      return collections.OrderedDict((k, update[k]) for k in term_keys)

  @tff.federated_computation
  def init_fn():
    if private:
      return tff.federated_zip((stacker.initialize(), secure.initialize()))
    return stacker.initialize()

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(update_type, tff.CLIENTS),
      tff.FederatedType(np.float32, tff.CLIENTS))
  def next_fn(state, value, weight):
    stacked = stacker.next(state[0] if private else state,
                           tff.federated_map(stack_part, value), weight)
    generator = summer.next(
        summer.initialize(), tff.federated_map(generator_part, value),
        tff.federated_map(generator_weight, weight))
    result = collections.OrderedDict(stack=stacked.result,
                                     generator=generator.result)
    if not private:
      return tff.templates.MeasuredProcessOutput(
          state=stacked.state, result=tff.federated_zip(result),
          measurements=stacked.measurements)
    summed = secure.next(state[1], tff.federated_map(terms_part, value))
    result['terms'] = summed.result
    return tff.templates.MeasuredProcessOutput(
        state=tff.federated_zip((stacked.state, summed.state)),
        result=tff.federated_zip(result),
        measurements=tff.federated_zip(collections.OrderedDict(
            num_stacked=stacked.measurements,
            secure_sum=summed.measurements)))

  return tff.templates.AggregationProcess(init_fn, next_fn)


class _ServerInputs(NamedTuple):
  """What the server reads besides the clients' uploads."""

  real_pool_fn: Optional[Callable[[], tf.Tensor]]
  validation_fn: Optional[Callable[[], tuple[tf.Tensor, tf.Tensor]]]
  pool_size: int


def _server_inputs(hparams: hparams_lib.DaFKDHparams,
                   server_data: Optional[server_data_lib.ServerData]
                   ) -> _ServerInputs:
  """The oracle pool (`pool='real'`), the labeled set and the pool size."""
  real_pool_fn = server_data.read_pool if hparams.pool == 'real' else None
  validation_fn = (server_data.read_validation
                   if server_data is not None and server_data.val_size
                   else None)
  pool_size = (hparams.pool_size if real_pool_fn is None
               else server_data.pool_size)
  return _ServerInputs(real_pool_fn, validation_fn, pool_size)


def server_settings(spec: ModelSpec, hparams: hparams_lib.DaFKDHparams,
                    config: distill_hparams.DistillConfig,
                    pool_size: int) -> dafkd_tf.ServerSettings:
  """The finalizer's `dafkd_tf.ServerSettings` (pool of `pool_size`)."""
  return dafkd_tf.ServerSettings(
      spec.settings, config, pool_size,
      pool_from_broadcast=hparams.resolved_pool_generator == 'broadcast',
      ensemble=hparams.ensemble,
      correlation=hparams.weighting == 'discriminator',
      batch_statistics=hparams.server_batchnorm == 'batch',
      first_distill_round=hparams.first_distill_round)


def build_finalizer(
    spec: ModelSpec,
    hparams: hparams_lib.DaFKDHparams,
    aggregate_type: tff.Type,
    distill_optimizer: tff.learning.optimizers.Optimizer,
    config: distill_hparams.DistillConfig,
    *,
    server_data: Optional[server_data_lib.ServerData] = None,
    seed: int = 0,
) -> tff.templates.MeasuredProcess:
  """`dafkd_tf.server_round` as a finalizer; its state is the round number.

  Measurements: `num_teachers`, the distillation's `steps`, `first_loss`,
  `last_loss`, `pool_size`, `server_seconds` (the wall time of the
  server's whole round) and its parts `teacher_seconds` (up to eq. 8's
  target) and `distill_seconds` (the distillation; the diagnostics take
  the rest); with a labeled validation set
  (`server_data.val_size` > 0) `labeled_accuracy_before` / `_after` and
  `accepted` (`DistillConfig.accept`). The mechanism metrics come from the
  round's one diagnostics hook, `diagnostics.RoundDiagnostics`:
  `alpha_entropy` (mean entropy of eq. 7's weights; -1 in private mode),
  `alpha_sum_error`, `mean_disc_score`, `agreement_before` /
  `agreement_after` (classifier argmax = target argmax on the pool, before
  / after distillation), `label_fidelity` (the share of the generated pool
  that the averaged classifier labels as G's pseudo label; -1 for a real
  pool), `target_entropy` (the mean entropy of the distillation targets,
  ln C for uniform ones); with the labeled set, `twin_labeled_accuracy_after`
  with `hparams.twin_student`, and in plain mode
  `diagnostics.diagnostic_metrics` (eq. 7's holder mass against uniform,
  weighted / uniform / oracle ensemble accuracy on the labeled images, pool
  quality, discriminator scores on real images and on the pool), NaN in
  the rounds that `hparams.diagnostics_every` skips.

  Args:
    spec: `ModelSpec`.
    hparams: `config.dafkd`: the pool (`pool_size`,
      `pool`, `pool_generator`), the teachers' `ensemble` and
      `weighting`, `private` (the aggregate is
      `build_private_aggregator`'s), the models' `aggregation` and the
      diagnostics' `holder_share` and `diagnostics_every`.
    aggregate_type: Unplaced type of the aggregator's result.
    distill_optimizer: Student optimiser (fresh state every round).
    config: `DistillConfig` (its temperature also tempers the teachers).
    server_data: The server's data: the real pool of `pool='real'`, and the
      labeled validation set (diagnostics, `config.validation` /
      `config.accept`), or None.
    seed: Seed of the pool (with the round number).

  Returns:
    A `tff.templates.MeasuredProcess` with the finalizer signature.
  """
  weights_type = models_type(spec)
  private = hparams.private
  real_pool_fn, validation_fn, pool_size = _server_inputs(hparams,
                                                          server_data)
  diagnose = validation_fn is not None and not private
  settings = server_settings(spec, hparams, config, pool_size)

  @finalizers.server_computation(np.int32, weights_type, aggregate_type)
  def server_tf(round_num, weights, aggregate):
    stack = stacking_tf.Stack(*aggregate['stack'])
    if private:
      sums = aggregate['terms']
      discriminator_rows, private_sums = None, (sums['fs'], sums['f'])
    else:
      discriminator_rows, private_sums = stack.values['discriminator'], None
    valid = tf.range(int(stack.weights.shape[0])) < stack.count
    labeled = validation = None
    if validation_fn is not None:
      labeled = validation_fn()
      if diagnose:
        validation = diagnostics.Validation(
            *labeled, stack.values['label_counts'], hparams.holder_share)
    generator_sum, generator_total = aggregate['generator']
    uploads = dafkd_tf.Uploads(
        stack.values['classifier'],
        stacking_tf.weighted_mean(
            generator_sum, generator_total,
            tff.learning.models.ModelWeights(
                [tf.zeros_like(w) for w in weights[1].trainable],
                weights[1].non_trainable)),
        valid, discriminator_rows, private_sums,
        stack.weights if hparams.aggregation == 'examples' else None)
    hook = diagnostics.RoundDiagnostics(
        settings, distill_optimizer, validation,
        core_diagnostics.due(hparams.diagnostics_every, round_num),
        twin_student=hparams.twin_student)
    r = dafkd_tf.server_round(
        spec.build(), distill_optimizer, (weights[0], weights[1]), uploads,
        settings, dafkd_tf.pool_seed(seed, round_num),
        real_pool=None if real_pool_fn is None else real_pool_fn(),
        labeled=labeled, diagnostics=hook, round_num=round_num)
    metrics = collections.OrderedDict(
        num_teachers=tf.cast(stack.count, tf.float32),
        steps=tf.cast(r.distill.steps_run, tf.float32),
        first_loss=r.distill.first_loss,
        last_loss=r.distill.last_loss,
        pool_size=tf.constant(float(pool_size)),
        server_seconds=r.seconds,
        teacher_seconds=r.teacher_seconds,
        distill_seconds=r.distill_seconds)
    if labeled is not None:
      metrics.update(
          labeled_accuracy_before=r.distill.labeled_accuracy_before,
          labeled_accuracy_after=r.distill.labeled_accuracy_after,
          accepted=r.distill.accepted)
    metrics.update(r.metrics)
    return round_num + 1, (r.classifier, r.generator), metrics

  @tff.tensorflow.computation
  def init_tf():
    return tf.constant(0, tf.int32)

  return finalizers.build_server_finalizer(init_tf, server_tf)


def _check_arguments(classifier_fn, num_clients: int, clients_per_round: int,
                     learning_rate: float, learning_rate_decay: float) -> None:
  """Checks the builder's arguments that `DaFKDHparams` does not hold.

  Raises:
    ConfigError: naming the first bad argument.
  """

  def fail(message):
    raise errors.ConfigError(f'dafkd: {message}')

  if classifier_fn is None:
    fail('needs a classifier builder with a feature extractor '
         '(ProcessInputs.classifier_fn)')
  hp.positive_int('num_clients', num_clients)
  hp.positive_int('clients_per_round', clients_per_round)
  if clients_per_round > num_clients:
    fail(f'clients_per_round={clients_per_round} is more than '
         f'num_clients={num_clients}')
  schedules.check_schedule(learning_rate, learning_rate_decay)


def model_spec(classifier_fn: Callable[[], classifiers.Classifier],
               hparams: hparams_lib.DaFKDHparams,
               seed: int = 0, local_epochs: int = 0) -> ModelSpec:
  """The `ModelSpec` of `build_dafkd_process` (generator, GAN settings).

  Args:
    classifier_fn: No-arg builder of the seeded `Classifier`.
    hparams: `config.dafkd`.
    seed: The process seed (generator: seed + 1, discriminator: seed + 2).
    local_epochs: The clients' local epochs per round (read by
      `hparams.gan_epochs`; 0 where the local work is counted in steps).

  Returns:
    A `ModelSpec`.

  Raises:
    DataError: A classifier without a fixed input shape.
    ConfigError: A generator that cannot make the classifier's images.
  """
  h = hparams
  clf = local_training.structure_of(classifier_fn)
  input_shape = tuple(clf.model.input_shape[1:])
  num_classes = int(clf.model.output_shape[-1])
  if None in input_shape:
    raise errors.DataError(
        f'dafkd needs a classifier with a fixed input shape, got {input_shape}')
  if h.generator == 'dcgan':
    generator_fn = functools.partial(
        generators.build_dcgan_generator, noise_dim=h.noise_dim,
        num_classes=num_classes, image_shape=input_shape,
        width=h.generator_width, seed=seed + 1)
  elif h.generator == 'feature':
    generator_fn = functools.partial(
        generators.build_feature_generator, noise_dim=h.noise_dim,
        num_classes=num_classes, feature_dim=clf.feature_dim,
        hidden=h.hidden_widths[0],
        output_activation=(None if h.feature_activation == 'linear'
                           else h.feature_activation), seed=seed + 1)
  else:
    generator_fn = functools.partial(
        generators.build_image_generator, noise_dim=h.noise_dim,
        num_classes=num_classes, image_shape=input_shape,
        hidden=h.hidden_widths, seed=seed + 1)
  # Raises ConfigError for shapes it cannot generate.
  local_training.structure_of(generator_fn)
  settings = gan.GanSettings(
      h.noise_dim, num_classes, h.adv_weight, h.gp_weight, h.generator_form,
      h.discriminator_mode, h.gan_steps, h.gan_window,
      generator_labels=h.generator_labels, aux_weight=h.aux_weight,
      feature_space=h.generator == 'feature',
      detach_extractor=h.detach_extractor, gan_epochs=h.gan_epochs,
      local_epochs=local_epochs, disc_rounds=h.disc_rounds,
      generator_rounds=h.generator_rounds, gan_passes=h.gan_passes,
      gp_norm=h.gp_norm, client_plateau=h.client_plateau)
  if (h.gan_epochs or h.client_plateau) and not local_epochs:
    raise errors.ConfigError(
        'dafkd.gan_epochs and dafkd.client_plateau count local epochs: the '
        'clients must train in epochs (local.unit=epochs)')
  return ModelSpec(classifier_fn, generator_fn, h.shared_extractor, seed + 2,
                   settings, projection=h.discriminator == 'projection',
                   global_discriminator=h.discriminator_sharing == 'global')


def build_dafkd_process(
    classifier_fn: Callable[[], classifiers.Classifier],
    element_spec: collections.OrderedDict,
    dataset_fn: Optional[tff_types.DatasetFn],
    *,
    num_clients: int,
    clients_per_round: int,
    optimizers: Optimizers,
    distill_config: distill_hparams.DistillConfig,
    hparams: hparams_lib.DaFKDHparams = hparams_lib.DaFKDHparams(),
    server_data: Optional[server_data_lib.ServerData] = None,
    seed: int = 0,
) -> tff.learning.templates.LearningProcess:
  """Builds DaFKD (Algorithm 1) and its ablations.

  Args:
    classifier_fn: No-arg builder of the seeded `Classifier`.
    element_spec: Batch structure of the client datasets.
    dataset_fn: Key -> dataset (the fast path: keys carry the client id),
      or None: clients take `OrderedDict(client_id=int32, data=<dataset>)`;
      the id finds the client's discriminator.
    num_clients: K; client ids are 0..K-1.
    clients_per_round: M, the most clients per round.
    optimizers: `Optimizers` (joint, generator and distillation, and the
      joint one's learning rate and its decay per round).
    distill_config: Distillation settings (reference: T = 20, 1,600 steps).
    hparams: `config.dafkd` (`hparams_lib.DaFKDHparams`): the generator,
      the GAN terms of eqs. (2), (3) and (9), the ablations, private mode,
      the pool and the diagnostics' `holder_share`.
    server_data: The server's data: the proxy pool (needed by
      `hparams.pool='real'`) and the labeled validation set, which turns on the
      per-round mechanism diagnostics (`diagnostics.RoundDiagnostics`)
      and is what `distill_config.validation='labeled'` and
      `accept='no_worse'` use.
    seed: Seed of the discriminator initialisation and the pools.

  Returns:
    A `tff.learning.templates.LearningProcess` taking `(state, keys)`.

  Raises:
    ConfigError: Bad hyper-parameters (before any TFF computation is built).
    DataError: A classifier that cannot take the generated images.
  """
  learning_rate = optimizers.learning_rate
  learning_rate_decay = optimizers.learning_rate_decay
  _check_arguments(classifier_fn, num_clients, clients_per_round,
                   learning_rate, learning_rate_decay)
  if hparams.pool == 'real' and (server_data is None or
                                 not server_data.pool_size):
    raise errors.ConfigError(
        "dafkd: pool='real' (the oracle pool) needs the server's proxy "
        'pool: set server_data.proxy and server_data.proxy_size')
  distill_config.check_labeled(0 if server_data is None
                               else server_data.val_size)
  h = hparams
  spec = model_spec(classifier_fn, h, seed, optimizers.local_epochs)
  server = _server_inputs(h, server_data)
  if server.real_pool_fn is not None:
    teachers_tf.check_pool_shape(
        server_data.image_shape,
        local_training.structure_of(classifier_fn).model.input_shape[1:])
  private_settings = (PrivateSettings(
      server.pool_size, seed, distill_config.temperature,
      h.weighting == 'discriminator') if h.private else None)
  client_work = build_client_work(
      spec, element_spec, dataset_fn, optimizers.client,
      num_clients=num_clients, learning_rate=learning_rate,
      learning_rate_decay=learning_rate_decay, private=private_settings,
      negatives_fn=server.real_pool_fn, seed=seed)
  update_type = client_work.next.type_signature.result.result.member.update
  aggregator = build_aggregator(update_type, clients_per_round,
                               private=h.private,
                               uniform_mean=h.aggregation == 'mean')
  aggregate_type = aggregator.next.type_signature.result.result.member
  finalizer = build_finalizer(spec, h, aggregate_type, optimizers.distill,
                              distill_config, server_data=server_data,
                              seed=seed)
  weights_type = models_type(spec)
  process = composer.compose_learning_process(
      build_initial_weights_fn(spec),
      tff.learning.templates.build_broadcast_process(weights_type),
      client_work, aggregator, finalizer)
  return composer.first_model_view(process)


def discriminator_store(state) -> list[np.ndarray]:
  """Every client's discriminator values ([K, ...] arrays) from a state."""
  return [np.asarray(v) for v in state.client_work[1]]


def generator_weights(state) -> tff.learning.models.ModelWeights:
  """The global generator's `ModelWeights` from a DaFKD process state."""
  w = state.global_model_weights[1]
  return tff.learning.models.ModelWeights(list(w.trainable),
                                          list(w.non_trainable))


def optimizers_from_settings(settings: common.Settings) -> Optimizers:
  """DaFKD's `Optimizers` from the run's settings.

  The joint optimiser is `settings.client_optimizer` (AdamW with its
  `weight_decay`, which `dafkd.weight_decay`'s old key sets), the
  generator's Adam has `settings.hparams`' learning rate and betas, the
  student's Adam `distill.learning_rate`; the joint schedule is
  `client_optimizer`'s.
  """
  hparams, opt = settings.hparams, settings.client_optimizer
  return Optimizers(
      joint=common.build_optimizer(settings.client_optimizer),
      generator=tff.learning.optimizers.build_adam(
          learning_rate=hparams.generator_learning_rate,
          beta_1=hparams.generator_beta_1, beta_2=hparams.generator_beta_2),
      distill=tff.learning.optimizers.build_adam(
          learning_rate=settings.distill.learning_rate),
      learning_rate=opt.learning_rate, learning_rate_decay=opt.lr_decay,
      local_epochs=(settings.local_work.amount
                    if settings.local_work.unit == 'epochs' else 0))


def build_from_settings(
    inputs: common.ProcessInputs, settings: common.Settings
) -> tff.learning.templates.LearningProcess:
  """The registry's builder: dafkd from the run's validated settings."""
  if inputs.classifier_fn is None:
    raise errors.ConfigError(
        'dafkd needs a classifier_fn (its discriminator shares the '
        "classifier's feature extractor)")
  return build_dafkd_process(
      inputs.classifier_fn, inputs.element_spec, inputs.dataset_fn,
      num_clients=inputs.num_clients,
      clients_per_round=settings.run.clients_per_round,
      optimizers=optimizers_from_settings(settings),
      distill_config=settings.distill, hparams=settings.hparams,
      server_data=inputs.server_data, seed=settings.run.seed)


METHOD = common.Method(
    'dafkd', build_from_settings,
    'DaFKD domain-aware data-free KD (Wang et al., 2023)',
    hparams=hparams_lib.DaFKDHparams, uses_distill=True,
    distill_defaults=hparams_lib.DISTILL_DEFAULTS,
    secure_sum=lambda hparams: bool(hparams.private),
    smoke={'dafkd.variant': 'paper', 'dafkd.pool_size': 32,
           'dafkd.noise_dim': 8, 'dafkd.generator_hidden': '16',
           'dafkd.gan_steps': 0,
           'server_data.proxy': 'split', 'server_data.proxy_size': 100,
           'distill.steps': 5, 'distill.batch_size': 32,
           'distill.val_fraction': 0.0})
