"""The link table of a KD server round: which link of the chain carries it.

Every distillation method here has the same chain (FedDF, Lin et al.,
NeurIPS 2020, Algorithm 1; FedGen, Zhu et al., ICML 2021; FedFTG, Zhang et
al., CVPR 2022; FedD3A; DaFKD, Wang et al., CVPR 2023): clients train
teachers, the server forms an ensemble target, a student starting from the
averaged model is distilled towards it. A method can only gain over FedAvg
where its target is better than the averaged model and the student takes
that gain over. `LinkHook` measures each link on the server's labeled
validation images (never the test set), every round:

* `teacher_labeled_accuracy`: the mean accuracy of the round's teachers;
* `ensemble_labeled_accuracy`: the method's own ensemble;
  `ensemble_labeled_accuracy_logits` / `_probs`: the uniform logit average
  (FedDF's AVGLOGITS) and probability average of the same teachers;
* `labeled_accuracy_before` / `labeled_accuracy_after`: the averaged model
  (the student's start) and the student the server step returns;
* `target_entropy`: the mean entropy (nats) of the target the student was
  distilled on, on the pool (a target of entropy log C teaches nothing).

It is a `tff_kd.core.diagnostics.Hook`: the step calls it once, after its
result is fixed; it may overwrite the models it is handed. Pure TensorFlow.
"""

import collections
from typing import Any, Callable, NamedTuple, Optional, Sequence

import tensorflow as tf

from tff_kd.core import diagnostics
from tff_kd.core import distillation
from tff_kd.core import teachers as teachers_tf

# The metric names a `LinkHook` reports, in order (-1: not measured).
NAMES = ('teacher_labeled_accuracy', 'ensemble_labeled_accuracy',
         'ensemble_labeled_accuracy_logits', 'ensemble_labeled_accuracy_probs',
         'labeled_accuracy_before', 'labeled_accuracy_after',
         'target_entropy')

EnsembleFn = Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tf.Tensor]


class Teachers(NamedTuple):
  """A round's teachers as `LinkHook` reads them (`ServerRound.teachers`).

  Attributes:
    logits_fn: Inputs [N, ...] -> the teachers' logits [K, N, C] (rows that
      hold no client may be anything; `valid` masks them).
    valid: [K] bool, rows holding a teacher of this round.
    ensemble_fn: The method's own ensemble on labeled images: (logits
      [K, V, C], valid [K], labels [V]) -> [V, C] probabilities or logits
      (labels only for methods whose weights depend on a sample's class,
      as FedFTG's do on a generated sample's). None: the uniform logit
      average.
  """

  logits_fn: Callable[[tf.Tensor], tf.Tensor]
  valid: tf.Tensor
  ensemble_fn: Optional[EnsembleFn] = None


@tf.autograph.experimental.do_not_convert
def uniform_ensemble(logits: tf.Tensor, valid: tf.Tensor, *,
                     ensemble: str) -> tf.Tensor:
  """The uniform average of the valid teachers: [K, N, C] -> [N, C] probs."""
  weights = distillation.normalize_weights(
      tf.ones(tf.shape(logits)[:2]), mask=tf.cast(valid, tf.float32))
  return distillation.weighted_ensemble(logits, weights, ensemble=ensemble)


@tf.autograph.experimental.do_not_convert
def mean_entropy(probs: tf.Tensor) -> tf.Tensor:
  """Mean over rows of the entropy (nats) of [N, C] probabilities."""
  probs = tf.convert_to_tensor(probs, tf.float32)
  logs = tf.math.log(tf.clip_by_value(probs, 1e-12, 1.0))
  return tf.reduce_mean(-tf.reduce_sum(probs * logs, axis=-1))


@tf.autograph.experimental.do_not_convert
def teacher_accuracies(logits: tf.Tensor, valid: tf.Tensor,
                       labels: tf.Tensor) -> tf.Tensor:
  """Mean accuracy over the valid teachers of [K, V, C] logits."""
  valid_f = tf.cast(valid, tf.float32)
  each = tf.map_fn(lambda z: teachers_tf.accuracy(z, labels), logits)
  return tf.reduce_sum(each * valid_f) / tf.maximum(
      tf.reduce_sum(valid_f), 1.0)


@tf.autograph.experimental.do_not_convert
def link_metrics(teacher_logits: Optional[tf.Tensor], valid: tf.Tensor,
                 labels: Optional[tf.Tensor], *,
                 own_ensemble: Optional[tf.Tensor] = None,
                 before_logits: Optional[tf.Tensor] = None,
                 after_logits: Optional[tf.Tensor] = None,
                 target: Optional[tf.Tensor] = None
                 ) -> collections.OrderedDict:
  """The link table's metrics (`NAMES`) from logits on the labeled images.

  Args:
    teacher_logits: [K, V, C] the teachers on the labeled images, or None
      (no labeled images: only `target_entropy` is measured).
    valid: [K] bool, the rows that hold a teacher.
    labels: [V] int labels.
    own_ensemble: [V, C] the method's own ensemble (probabilities or
      logits); None: the logit average's accuracy is reported for it.
    before_logits: [V, C] the averaged model (the student's start).
    after_logits: [V, C] the student the step returns; None where the
      server distils nothing (FedGen): then it is the averaged model.
    target: [N, C] the target probabilities on the pool, or None.

  Returns:
    An OrderedDict over `NAMES`; -1 for a link not measured.
  """
  missing = tf.constant(-1.0)
  out = collections.OrderedDict((name, missing) for name in NAMES)
  if target is not None:
    out['target_entropy'] = mean_entropy(target)
  if teacher_logits is None:
    return out
  out['teacher_labeled_accuracy'] = teacher_accuracies(teacher_logits, valid,
                                                       labels)
  for ensemble in ('logits', 'probs'):
    out[f'ensemble_labeled_accuracy_{ensemble}'] = teachers_tf.accuracy(
        uniform_ensemble(teacher_logits, valid, ensemble=ensemble), labels)
  out['ensemble_labeled_accuracy'] = (
      out['ensemble_labeled_accuracy_logits'] if own_ensemble is None else
      teachers_tf.accuracy(own_ensemble, labels))
  if before_logits is not None:
    out['labeled_accuracy_before'] = teachers_tf.accuracy(before_logits,
                                                          labels)
    out['labeled_accuracy_after'] = (
        out['labeled_accuracy_before'] if after_logits is None else
        teachers_tf.accuracy(after_logits, labels))
  return out


def labeled_set(server_data: Any, input_shape: Sequence[int]) -> bool:
  """Whether the server's data holds labeled images for the link table.

  Args:
    server_data: A `tff_kd.federated.server_data.ServerData`, or None.
    input_shape: The classifier's per-example input shape.

  Raises:
    DataError: labeled images whose shape is not `input_shape`.
  """
  if server_data is None or not server_data.val_size:
    return False
  teachers_tf.check_pool_shape(server_data.image_shape, input_shape,
                               'server validation')
  return True


class LinkHook:
  """`diagnostics.Hook`: the link table of a round on the labeled images.

  Reads `ServerRound.teachers` as `Teachers`; `before` / `after` are loaded
  into `student_variables` in turn and `student` is scored (`after=None`:
  the server step did not change the averaged model). Without labeled
  images only the target's entropy is measured.
  """

  def __init__(self, batch_size: int = 256):
    """Scores the labeled images in batches of `batch_size`."""
    self._batch_size = int(batch_size)

  def _scores(self, r: diagnostics.ServerRound, weights, x: tf.Tensor
              ) -> tf.Tensor:
    diagnostics.load(r.student_variables, weights)
    return distillation.teacher_logits([r.student], x, self._batch_size)[0]

  def __call__(self, server_round: diagnostics.ServerRound
               ) -> collections.OrderedDict:
    r = server_round
    teachers = r.teachers
    if r.labeled is None:
      return link_metrics(None, teachers.valid, None, target=r.target)
    x, y = r.labeled
    logits = teachers.logits_fn(x)
    own = (None if teachers.ensemble_fn is None else
           teachers.ensemble_fn(logits, teachers.valid, y))
    before = self._scores(r, r.before, x)
    after = None if r.after is None else self._scores(r, r.after, x)
    return link_metrics(logits, teachers.valid, y, own_ensemble=own,
                        before_logits=before, after_logits=after,
                        target=r.target)
