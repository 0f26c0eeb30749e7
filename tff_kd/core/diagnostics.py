"""The one hook through which a KD method's server step reports its mechanism.

A method's server step (DaFKD's `dafkd_tf.server_round`, Wang et al., CVPR
2023, Algorithm 1 lines 9-13; in general: teachers, their per-sample
weights, an ensemble target on a pool, a student distilled from a start)
is the algorithm alone. What a study wants to know about that step (is
eq. 7 domain-aware, how good is the pool, what would uniform weights have
done, how far did the student move) is computed by a `Hook` that the step
calls exactly once, after its result is fixed, with a `ServerRound` view
of the round. The hook returns flat, named scalar metrics, which the
method's finalizer reports beside the algorithm's own (prefixed as the
method prefixes its measurements, e.g. `distill/`).

The contract a hook keeps: it may overwrite the models it is handed (the
step's result is a snapshot taken before the hook runs) and may draw no
stateful random numbers, so that a round's result is the same with any
hook or with none (`tests/methods/dafkd/test_diagnostics_hook.py` pins it
for DaFKD).

Pure TensorFlow, no TFF placement: hooks run inside the step's
`tf.function`, eagerly in tests and inside a `tff.tensorflow.computation`.
"""

import collections
from typing import Any, Mapping, NamedTuple, Optional, Protocol, Union

import tensorflow as tf
import tensorflow_federated as tff

ModelWeights = tff.learning.models.ModelWeights
Metrics = Mapping[str, tf.Tensor]


class ServerRound(NamedTuple):
  """One server round, as the step hands it to its `Hook`.

  Attributes:
    teachers: The method's teachers in its own form (DaFKD: the broadcast
      classifier and the clients' `Uploads`).
    weights: [M, N] per-teacher, per-sample ensemble weights alpha on the
      pool, or None where the server never sees them (DaFKD's appendix B).
    pool: The distillation pool [N, ...].
    target: The ensemble target [N, C] the student was distilled on.
    student: The model distillation trained (the classifier, or a part of
      it: DaFKD's head on appendix A's features).
    student_variables: The variables `before` / `after` load into (the
      whole classifier's, which `student` reads).
    before: The student's start (the averaged model).
    after: The student as the step returns it.
    labeled: The server's labeled images, as the student reads them, and
      their labels; None without a labeled set.
    terms: Method-specific terms of the round (DaFKD: `dafkd_tf.PoolTerms`).
  """

  teachers: Any
  weights: Optional[tf.Tensor]
  pool: tf.Tensor
  target: tf.Tensor
  student: tf.keras.Model
  student_variables: ModelWeights
  before: ModelWeights
  after: ModelWeights
  labeled: Optional[tuple[tf.Tensor, tf.Tensor]] = None
  terms: Any = None


class Hook(Protocol):
  """A method's mechanism diagnostics: one server round -> named metrics."""

  def __call__(self, server_round: ServerRound) -> Metrics:
    ...


def run(hook: Optional[Hook], server_round: ServerRound
        ) -> collections.OrderedDict:
  """The hook's metrics of `server_round` (none without a hook)."""
  if hook is None:
    return collections.OrderedDict()
  return collections.OrderedDict(hook(server_round))


def load(variables: ModelWeights, values: ModelWeights) -> None:
  """Assigns `values` to `variables` (e.g. `before` to `student_variables`)."""
  tf.nest.map_structure(lambda v, t: v.assign(t), variables, values)


def argmax_agreement(logits_or_probs: tf.Tensor, reference) -> tf.Tensor:
  """Fraction of rows whose argmax equals `reference`'s (argmax or labels)."""
  reference = tf.convert_to_tensor(reference)
  if reference.shape.rank == 2:
    reference = tf.argmax(reference, axis=-1)
  return tf.reduce_mean(tf.cast(tf.equal(
      tf.argmax(logits_or_probs, axis=-1, output_type=tf.int32),
      tf.cast(reference, tf.int32)), tf.float32))


def due(every: int, round_num: Union[int, tf.Tensor]) -> Optional[tf.Tensor]:
  """Whether round `round_num` (from 0) runs diagnostics kept to 1 in `every`.

  Args:
    every: Run them in the rounds r (counted from 1) with r % every == 0.
    round_num: The round, from 0 (int or int tensor).

  Returns:
    A bool scalar tensor, or None when every round runs them.
  """
  return None if every == 1 else tf.equal((round_num + 1) % every, 0)
