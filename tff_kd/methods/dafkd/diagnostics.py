"""DaFKD's server diagnostics: the `tff_kd.core.diagnostics` hook of its round.

DaFKD (Wang et al., "DaFKD: Domain-aware Federated Knowledge Distillation",
CVPR 2023) claims that eq. (7)'s discriminator weights find, per sample, the
clients whose domain it belongs to, and that distilling eq. (8)'s weighted
target therefore beats a uniform average. `RoundDiagnostics` measures that
claim every round, beside `dafkd_tf.server_round` rather than inside it:

* mechanism metrics of the round (always): eq. 7's weight entropy and
  normalisation error, the mean discriminator score, the averaged and the
  distilled classifier's agreement with the target on the pool, the
  generated pool's label fidelity and the targets' entropy;
* with the server's labeled images (`server_data.val_size`, plain mode):
  every teacher scored on them as on the pool (`diagnose`:
  `weight_diagnostics`' holder mass and ensemble accuracies, pool quality,
  discriminator scores), in the rounds `DaFKDHparams.diagnostics_every`
  keeps, NaN in the others (`skipped_diagnostics`);
* `DaFKDHparams.twin_student`: the averaged classifier distilled on the
  uniform ensemble of the same teachers and pool (`twin_student`), and its
  labeled accuracy.

None of them feeds back into training: `server_round` takes its result
before it calls the hook (`tests/methods/dafkd/test_diagnostics_hook.py`).
"""

import collections
from typing import NamedTuple, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import diagnostics as core_diagnostics
from tff_kd.core import distillation
from tff_kd.core import links
from tff_kd.core import teachers as teachers_tf
from tff_kd.methods.dafkd import dafkd_tf
from tff_kd.methods.dafkd import weight_diagnostics

ModelWeights = tff.learning.models.ModelWeights


class Validation(NamedTuple):
  """The server's labeled images and the round's label counts (diagnostics).

  Attributes:
    x: Labeled validation images [V, ...] (real data, held out).
    y: Their int labels [V].
    label_counts: Stacked [M, C] label counts of the received clients.
    holder_share: A client holds a label with at least this share of its
      examples (`weight_diagnostics.holders`).
  """

  x: tf.Tensor
  y: tf.Tensor
  label_counts: tf.Tensor
  holder_share: float


class Diagnostics(NamedTuple):
  """Whether eq. (7) knows who knows, measured on the labeled images.

  Attributes:
    weights: `weight_diagnostics.WeightDiagnostics` of eq. (7)'s alpha on the
      labeled validation images (the mechanism's domain awareness and the
      weighted / uniform / oracle ensemble accuracies).
    pool: `weight_diagnostics.PoolQuality` of the teachers on the pool.
    score_real: Mean server-mode discriminator score f_k on the validation
      images (received clients).
    score_pool: The same on the distillation pool.
    teacher_accuracy: The received teachers' mean accuracy on the labeled
      images (`links.teacher_accuracies`, the shared link column).
    uniform_logits_accuracy: Accuracy of their plain logit average
      (FedDF's target, the shared `ensemble_labeled_accuracy_logits`).
    pool_weights: `weight_diagnostics.WeightDiagnostics` of eq. (7)'s alpha
      on the generated pool, with each sample's pseudo label y of G(z, y)
      as its class (the holders of y are the teachers that should get the
      weight; the "accuracies" are agreements with y), or None for a real
      pool, whose labels the server does not have.
  """

  weights: weight_diagnostics.WeightDiagnostics
  pool: weight_diagnostics.PoolQuality
  score_real: tf.Tensor
  score_pool: tf.Tensor
  teacher_accuracy: tf.Tensor
  uniform_logits_accuracy: tf.Tensor
  pool_weights: Optional[weight_diagnostics.WeightDiagnostics] = None


def _num_clients(valid: tf.Tensor) -> tf.Tensor:
  return tf.maximum(tf.reduce_sum(tf.cast(valid, tf.float32)), 1.0)


def _mean_score(scores: tf.Tensor, valid: tf.Tensor) -> tf.Tensor:
  """Mean f_k over the received clients ([M, N] scores, zero invalid rows)."""
  return tf.reduce_sum(tf.reduce_mean(scores, axis=1)) / _num_clients(valid)


def diagnose(teachers: dafkd_tf.Teachers, terms: dafkd_tf.PoolTerms,
             target: tf.Tensor, validation: Validation,
             settings: dafkd_tf.ServerSettings) -> Diagnostics:
  """`Diagnostics` of this round's teachers (scored as on the pool).

  Args:
    teachers: The round's `dafkd_tf.Teachers` (plain mode).
    terms: The teachers' logits and scores on the pool and its pseudo
      labels (None: a real pool).
    target: Eq. (8)'s target on the pool.
    validation: The labeled images and the clients' label counts.
    settings: The round's `dafkd_tf.ServerSettings`: eq. (7)'s weights or
      uniform ones (`correlation`), and the BatchNorm mode and batch size
      in which the server scores its pool (`batch_statistics`), which the
      labeled images are scored in too.

  Returns:
    `Diagnostics`.
  """
  models, uploads = teachers.models, teachers.uploads
  valid = uploads.valid
  correlation = settings.correlation
  logits, scores = dafkd_tf.teacher_outputs(
      models.classifier, models.discriminator, teachers.global_classifier,
      uploads.classifier_deltas, uploads.discriminator_rows, valid,
      validation.x, settings.scoring, labels=validation.y)
  shares = weight_diagnostics.label_shares(validation.label_counts)

  def weights_on(alpha_scores, sample_logits, labels):
    holder = weight_diagnostics.holders(shares, labels, valid,
                                        validation.holder_share)
    return weight_diagnostics.weight_diagnostics(
        dafkd_tf.teacher_weights(alpha_scores, valid,
                                 correlation=correlation),
        sample_logits, labels, holder, valid)

  return Diagnostics(
      weights_on(scores, logits, validation.y),
      weight_diagnostics.pool_quality(terms.logits, valid, target),
      _mean_score(scores, valid), _mean_score(terms.scores, valid),
      links.teacher_accuracies(logits, valid, validation.y),
      teachers_tf.accuracy(
          links.uniform_ensemble(logits, valid, ensemble='logits'),
          validation.y),
      None if terms.labels is None else weights_on(
          terms.scores, terms.logits, terms.labels))


def skipped_diagnostics(pool_labels: bool) -> Diagnostics:
  """NaN `Diagnostics` for a round that skips them (`diagnostics_every`).

  Args:
    pool_labels: The pool has pseudo labels (a generated pool), so the
      diagnostics have `pool_weights`.
  """

  def nan(cls):
    return cls(*[tf.constant(float('nan'))] * len(cls._fields))

  none = tf.constant(float('nan'))
  return Diagnostics(
      nan(weight_diagnostics.WeightDiagnostics),
      nan(weight_diagnostics.PoolQuality), none, none, none, none,
      nan(weight_diagnostics.WeightDiagnostics) if pool_labels else None)


def diagnostic_metrics(d: Diagnostics) -> collections.OrderedDict:
  """Flat, named metrics of a round's `Diagnostics`.

  The `pool_*` weight metrics read eq. (7) on the generated pool against
  its pseudo labels (-1 for a real pool): `pool_holder_ratio` is the holder
  ratio with the holders of y of G(z, y), `pool_ensemble_agreement_*`
  the share of the pool whose weighted / uniform / holders-only ensemble
  predicts y, and `pool_label_mass_*` the mean probability the weighted /
  uniform ensemble (teachers at T = 1) puts on y. `label_mass_*` are the
  same on the labeled images with their labels.
  """
  w, p, q = d.weights, d.pool, d.pool_weights
  if q is None:
    pool_weights = dict.fromkeys(
        ('pool_holder_ratio', 'pool_informative_fraction',
         'pool_ensemble_agreement_weighted', 'pool_ensemble_agreement_uniform',
         'pool_ensemble_agreement_oracle', 'pool_label_mass_weighted',
         'pool_label_mass_uniform'), tf.constant(-1.0))
  else:
    pool_weights = dict(
        pool_holder_ratio=q.holder_ratio,
        pool_informative_fraction=q.informative_fraction,
        pool_ensemble_agreement_weighted=q.accuracy_weighted,
        pool_ensemble_agreement_uniform=q.accuracy_uniform,
        pool_ensemble_agreement_oracle=q.accuracy_oracle,
        pool_label_mass_weighted=q.label_mass_weighted,
        pool_label_mass_uniform=q.label_mass_uniform)
  return collections.OrderedDict(
      holder_mass=w.holder_mass,
      uniform_holder_mass=w.uniform_holder_mass,
      holder_ratio=w.holder_ratio,
      informative_fraction=w.informative_fraction,
      ensemble_accuracy_weighted=w.accuracy_weighted,
      ensemble_accuracy_uniform=w.accuracy_uniform,
      ensemble_accuracy_oracle=w.accuracy_oracle,
      label_mass_weighted=w.label_mass_weighted,
      label_mass_uniform=w.label_mass_uniform,
      pool_max_prob=p.max_prob,
      pool_entropy=p.entropy,
      pool_class_entropy=p.class_entropy,
      pool_top_class_share=p.top_class_share,
      disc_score_real=d.score_real,
      disc_score_pool=d.score_pool,
      teacher_labeled_accuracy=d.teacher_accuracy,
      ensemble_labeled_accuracy_logits=d.uniform_logits_accuracy,
      **pool_weights)


def twin_student(server_round: core_diagnostics.ServerRound,
                 optimizer: tff.learning.optimizers.Optimizer,
                 settings: dafkd_tf.ServerSettings) -> tf.Tensor:
  """The uniform-weight twin's student, from the same start and pool.

  Distils the round's student from its start (the averaged classifier) on
  the uniform ensemble of the same teachers and returns its labeled
  accuracy after.

  Args:
    server_round: The round (plain mode, with a labeled set).
    optimizer: The distillation optimiser (fresh state).
    settings: `dafkd_tf.ServerSettings` (its distillation config and
      ensemble).

  Returns:
    The twin student's labeled accuracy (float32 scalar).
  """
  r, terms = server_round, server_round.terms
  uniform = distillation.weighted_ensemble(
      terms.logits, dafkd_tf.teacher_weights(
          terms.scores, r.teachers.uploads.valid, correlation=False),
      temperature=settings.distill.temperature, ensemble=settings.ensemble)
  core_diagnostics.load(r.student_variables, r.before)
  return distillation.distill(r.student, optimizer, r.pool, uniform,
                              settings.distill,
                              labeled=r.labeled).labeled_accuracy_after


class RoundDiagnostics(NamedTuple):
  """DaFKD's `core_diagnostics.Hook`: the mechanism metrics of a round.

  Attributes:
    settings: The round's `dafkd_tf.ServerSettings`.
    distill_optimizer: The distillation optimiser (the twin's).
    validation: The labeled images and label counts (plain mode with
      `server_data.val_size` > 0), or None: no `Diagnostics`.
    diagnose: A bool scalar: compute the `Diagnostics` this round, or
      `skipped_diagnostics` (NaN); None: every round
      (`core_diagnostics.due`).
    twin_student: Also distil the uniform-weight twin (`twin_student`) and
      report its labeled accuracy (needs a labeled set and plain mode).
  """

  settings: dafkd_tf.ServerSettings
  distill_optimizer: tff.learning.optimizers.Optimizer
  validation: Optional[Validation] = None
  diagnose: Optional[tf.Tensor] = None
  twin_student: bool = False

  def __call__(self, server_round: core_diagnostics.ServerRound
               ) -> collections.OrderedDict:
    """The round's metrics (names as `dafkd_tff.build_finalizer` reports).

    Args:
      server_round: The `core_diagnostics.ServerRound` of
        `dafkd_tf.server_round`.

    Returns:
      `alpha_entropy` (-1 in private mode), `alpha_sum_error` (0 there),
      `mean_disc_score`, `agreement_before` / `_after`, `label_fidelity`
      (-1 for a real pool), `target_entropy`; then
      `twin_labeled_accuracy_after` with `twin_student`, and
      `diagnostic_metrics` with `validation`.
    """
    r, terms = server_round, server_round.terms
    valid = r.teachers.uploads.valid
    metrics = collections.OrderedDict()
    if r.weights is None:  # Appendix B: the server sees only the sums.
      metrics.update(
          alpha_entropy=tf.constant(-1.0),
          alpha_sum_error=tf.constant(0.0),
          mean_disc_score=(tf.reduce_mean(terms.private_sums[1]) /
                           _num_clients(valid)))
    else:
      metrics.update(
          alpha_entropy=distillation.mean_entropy(r.weights, axis=0),
          alpha_sum_error=tf.reduce_max(
              tf.abs(tf.reduce_sum(r.weights, axis=0) - 1.0)),
          mean_disc_score=_mean_score(terms.scores, valid))
    agreement = core_diagnostics.argmax_agreement
    core_diagnostics.load(r.student_variables, r.before)
    logits_before = distillation.teacher_logits([r.student], r.pool)[0]
    core_diagnostics.load(r.student_variables, r.after)
    metrics.update(
        agreement_before=agreement(logits_before, r.target),
        agreement_after=agreement(
            distillation.teacher_logits([r.student], r.pool)[0], r.target),
        label_fidelity=(tf.constant(-1.0) if terms.labels is None
                        else agreement(logits_before, terms.labels)),
        target_entropy=distillation.mean_entropy(r.target, axis=-1))
    plain = r.weights is not None
    if self.twin_student and plain and r.labeled is not None:
      metrics['twin_labeled_accuracy_after'] = twin_student(
          r, self.distill_optimizer, self.settings)
    if self.validation is not None and plain:

      def run_diagnostics():
        return diagnose(r.teachers, terms, r.target, self.validation,
                        self.settings)

      metrics.update(diagnostic_metrics(
          run_diagnostics() if self.diagnose is None else tf.cond(
              self.diagnose, run_diagnostics,
              lambda: skipped_diagnostics(terms.labels is not None))))
    return metrics
