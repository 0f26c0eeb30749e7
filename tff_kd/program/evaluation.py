"""Centralised evaluation of the global model(s), as a name -> evaluation map.

Evaluation deliberately runs outside TFF, on Keras models whose weights are
overwritten each round: the test set is never split across clients (DaFKD's
reference code split it, which changes the metric) and never serialised into
a federated computation.

An experiment's evaluations (`setup.Experiment.evaluations`) map a name to
an `Evaluation`: a callable from the round's global `ModelWeights` and
process state to named metrics. The data contributes the whole test set (or
one test set per client domain, with their mean) and, for the FedGen recipe,
its per-user test slices; a method with several global models (FedDF's
architecture prototypes) contributes the evaluation of the others. The
round loop calls them all in order (`evaluate`).

The Keras models are made at their first use (`SharedModel`), and the
evaluation function is traced then: a Keras model made in a
`tf.compat.v1.Graph`, as TFF does whenever it builds a process, switches
Keras's layer classes to their graph-mode versions, and a model made eagerly
before that can no longer be called (Keras's "invalid state" error). Made
and traced together, later builds cannot invalidate it: the trace is reused
and only the weights are assigned.
"""

import abc
import functools
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence
import weakref

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import loops
from tff_kd.federated import composer


class EvalResult(NamedTuple):
  loss: float
  accuracy: float


# One evaluation `tf.function` per model, freed with the model: evaluators
# that share a model (and batch structure) share its trace.
_EVAL_FNS: 'weakref.WeakKeyDictionary[tf.keras.Model, Callable]' = (
    weakref.WeakKeyDictionary())


def _eval_fn(model: tf.keras.Model) -> Callable:
  if model not in _EVAL_FNS:
    _EVAL_FNS[model] = tf.function(functools.partial(_sums, model),
                                   autograph=False)
  return _EVAL_FNS[model]


def _sums(model: tf.keras.Model,
          dataset: tf.data.Dataset) -> tuple[tf.Tensor, tf.Tensor]:
  """Summed cross-entropy and correct predictions of `model` on `dataset`."""

  def step(sums, batch):
    x, y = batch
    logits = model(x, training=False)
    loss = tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(
        y, logits, from_logits=True))
    correct = tf.reduce_sum(tf.cast(
        tf.equal(tf.argmax(logits, -1, output_type=tf.int32), y),
        tf.float32))
    return sums[0] + loss, sums[1] + correct

  return loops.fold_batches(dataset, step,
                            (tf.constant(0.0), tf.constant(0.0)))


class SharedModel:
  """A Keras model made at its first use, for the evaluators that share it.

  Evaluators that share one (and their batch structure) share one trace of
  the evaluation function: a measured start-up win (`loop.warm_up`).
  """

  def __init__(self, model_fn: Callable[[], tf.keras.Model]):
    self._model_fn = model_fn
    self._model: Optional[tf.keras.Model] = None

  def get(self) -> tf.keras.Model:
    """The model, made (eagerly) on the first call."""
    if self._model is None:
      self._model = self._model_fn()
    return self._model


class Evaluator:
  """Accuracy and cross-entropy of given `ModelWeights` on fixed data.

  Evaluators may share one model (the weights are assigned on every call):
  they then share one trace of the evaluation function.
  """

  def __init__(self, model: SharedModel, x: np.ndarray, y: np.ndarray,
               *, batch_size: int = 1000):
    self._model = model
    self._num = len(y)
    self._data = (tf.data.Dataset.from_tensor_slices((x, y.astype(np.int32)))
                  .batch(batch_size).cache())

  def trace(self) -> None:
    """Traces (and runs once, with the model's current weights) the
    evaluation function, so that the first call costs what later ones do."""
    _eval_fn(self._model.get())(self._data)

  def __call__(self, weights: tff.learning.models.ModelWeights) -> EvalResult:
    model = self._model.get()
    weights.assign_weights_to(model)
    loss_sum, correct = _eval_fn(model)(self._data)
    return EvalResult(float(loss_sum) / self._num,
                      float(correct) / self._num)


class Evaluation(abc.ABC):
  """One entry of an experiment's evaluation map."""

  @abc.abstractmethod
  def __call__(self, weights: tff.learning.models.ModelWeights,
               state: Any) -> dict[str, float]:
    """Named metrics of a round.

    Args:
      weights: The global classifier's weights (`get_model_weights(state)`).
      state: The process state, for evaluations of other global models.
    """

  @abc.abstractmethod
  def evaluators(self) -> Sequence[Evaluator]:
    """The evaluators it calls (`loop.warm_up` traces them ahead)."""


class TestSet(Evaluation):
  """`test/loss` and `test/accuracy` on the whole test set."""

  def __init__(self, evaluator: Evaluator):
    self._evaluator = evaluator

  def __call__(self, weights, state) -> dict[str, float]:
    del state  # Unused.
    result = self._evaluator(weights)
    return {'test/loss': result.loss, 'test/accuracy': result.accuracy}

  def evaluators(self) -> Sequence[Evaluator]:
    return (self._evaluator,)


class DomainTestSets(Evaluation):
  """Per client domain, `test/loss_<domain>` and `test/accuracy_<domain>` on
  that domain's whole test set; `test/loss` and `test/accuracy` are their
  unweighted means."""

  def __init__(self, evaluators: Sequence[tuple[str, Evaluator]]):
    self._evaluators = tuple(evaluators)

  def __call__(self, weights, state) -> dict[str, float]:
    del state  # Unused.
    results = [(name, ev(weights)) for name, ev in self._evaluators]
    metrics = {}
    for name, r in results:
      metrics[f'test/loss_{name}'] = r.loss
      metrics[f'test/accuracy_{name}'] = r.accuracy
    metrics['test/loss'] = float(np.mean([r.loss for _, r in results]))
    metrics['test/accuracy'] = float(np.mean([r.accuracy
                                              for _, r in results]))
    return metrics

  def evaluators(self) -> Sequence[Evaluator]:
    return tuple(ev for _, ev in self._evaluators)


class TestSlices(Evaluation):
  """`test_slices/accuracy`: for the FedGen recipe, the accuracy on the union
  of the per-user test slices that the reference code reports."""

  def __init__(self, evaluator: Evaluator):
    self._evaluator = evaluator

  def __call__(self, weights, state) -> dict[str, float]:
    del state  # Unused.
    return {'test_slices/accuracy': self._evaluator(weights).accuracy}

  def evaluators(self) -> Sequence[Evaluator]:
    return (self._evaluator,)


class OtherGlobalModels(Evaluation):
  """`test/accuracy_p<k>` of the global models 1..P-1 of a state whose
  `global_model_weights` is a tuple of models (`composer.global_models`;
  FedDF's architecture prototypes), on the whole test set."""

  def __init__(self, evaluators: Sequence[Evaluator]):
    self._evaluators = tuple(evaluators)

  def __call__(self, weights, state) -> dict[str, float]:
    del weights  # Model 0's: evaluated by the test set's entry.
    others = composer.global_models(state)[1:]
    return {f'test/accuracy_p{p}': ev(w).accuracy
            for p, (ev, w) in enumerate(zip(self._evaluators, others), 1)}

  def evaluators(self) -> Sequence[Evaluator]:
    return self._evaluators


def evaluate(evaluations: Mapping[str, Evaluation],
             weights: tff.learning.models.ModelWeights,
             state: Any) -> dict[str, float]:
  """Every evaluation's metrics, in the map's order."""
  metrics = {}
  for evaluation in evaluations.values():
    metrics.update(evaluation(weights, state))
  return metrics
