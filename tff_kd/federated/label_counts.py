"""Client work that uploads the client's label counts with its update.

The data-free KD methods FedGen (Zhu, Hong and Zhou, ICML 2021; its
supplement Sec. 9 weights each client's teacher by its label counts) and
FedFTG (Zhang et al., CVPR 2022; label-aware hard samples and the counts'
class weights) need, besides each client's model delta, how many examples
of each label it trained on. Each client caches this round's dataset,
counts its labels n_{k,y} over the very batches it trains on, trains, and
uploads `{'delta': ModelWeights, 'label_counts': [C] float32}`, weighted by
its number of examples. Plain local cross-entropy training (FedFTG), or a
method's own objective with an extra broadcast model (FedGen's generator
regulariser, `LocalObjective`).
"""

import collections
from typing import Callable, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import fused
from tff_kd.core import local_training
from tff_kd.federated import client_works
from tff_kd.federated import execution
from tff_kd.federated import tff_types
from tff_kd.models import classifiers

ClassifierFn = Callable[[], classifiers.Classifier]


class LocalObjective(NamedTuple):
  """A method's own local training, with one extra broadcast model.

  Attributes:
    model_fn: Builds the extra model the clients receive (FedGen: its
      generator).
    train: `train(classifier, extra_model, optimizer, classifier_weights,
      extra_weights, dataset, lr, label_counts, round_num, key_hash)`
      returning a `local_training.train_locally` result; `key_hash` is an
      int64 hash of the client's key, to seed the client's own noise.
    fused_term: The same objective for fused clients: `fused_term(
      classifier, extra_model, extra_weights, batches, key_hashes,
      label_counts, round_num)` -> the `tff_kd.core.fused.Term` that
      `train`'s training adds to plain local training, for the G clients
      of `batches` (`execution.FusedBatches`), with their [G] key hashes
      and [G, C] label counts; None: the objective does not fuse.
  """

  model_fn: Callable[[], tf.keras.Model]
  train: Callable[..., local_training.LocalResult]
  fused_term: Optional[Callable[..., fused.Term]] = None


def count_labels(dataset: tf.data.Dataset, num_classes: int) -> tf.Tensor:
  """[C] float32 counts of the labels of every batch of `dataset`."""

  @tf.autograph.experimental.do_not_convert
  def add_batch(acc, batch):
    return acc + tf.math.bincount(
        tf.cast(batch['y'], tf.int32), minlength=num_classes,
        maxlength=num_classes, dtype=tf.float32)

  return dataset.reduce(tf.zeros([num_classes]), add_batch)


def fused_label_counts(batches: execution.FusedBatches,
                       num_classes: int) -> tf.Tensor:
  """[G, C] float32: `count_labels` of each fused client's batches."""
  schedule = batches.schedule
  labels = tf.one_hot(tf.gather(batches.y, schedule.indices), num_classes)
  return tf.reduce_sum(labels * schedule.mask[..., tf.newaxis], axis=[0, 2])


def build_client_work(
    classifier_fn: ClassifierFn,
    element_spec: collections.OrderedDict,
    client_optimizer: tff.learning.optimizers.Optimizer,
    *,
    num_classes: int,
    learning_rate: float,
    learning_rate_decay: float = 1.0,
    dataset_fn: Optional[tff_types.DatasetFn] = None,
    objective: Optional[LocalObjective] = None,
    seed: int = 0,
    client_execution: execution.ClientExecution = execution.ONE_BY_ONE,
) -> tff.templates.MeasuredProcess:
  """Local training that also uploads the client's label counts.

  Without `objective`, clients receive the classifier's weights and train
  plain cross-entropy (FedFTG's clients). With it, they receive
  (classifier weights, extra model weights) and train with
  `objective.train`. The update is `{'delta': ModelWeights, 'label_counts':
  [C] float32}`, weighted by the number of examples. State and
  measurements: those of `client_works.build_scheduled_client_work`.

  Args:
    classifier_fn: Builds the `Classifier` (model, features, head).
    element_spec: Batch structure of the client datasets.
    client_optimizer: A `tff.learning.optimizers` optimizer.
    num_classes: C.
    learning_rate: Client learning rate at round 0.
    learning_rate_decay: Multiplicative decay per round.
    dataset_fn: Key -> dataset function (the fast path), or None: clients
      then take `OrderedDict(client_id, data)` with an objective (each
      client seeds its own noise by its id and the round), plain sequences
      without (`tff_types.client_data_type`).
    objective: A method's own local training, or None.
    seed: The process seed, which seeds the dataset path's client keys (the
      keys carry it on the keyed path).
    client_execution: How each TFF client call runs its clients (grouped
      or fused: `dataset_fn`; fused: an `objective` with a `fused_term`, or
      none). Grouped, the update is a `tff_kd.core.stacking.GroupRows` of
      G clients' updates; fused clients count the labels of the batches
      they train on (`fused_label_counts`) before training.

  Returns:
    A `tff.templates.MeasuredProcess`; the round number comes from its
    state.

  Raises:
    ValueError: fused clients with an `objective` that has no
      `fused_term`.
  """
  if (client_execution.fused and objective is not None and
      objective.fused_term is None):
    raise ValueError("fused clients need the method's objective in "
                     'lockstep form (LocalObjective.fused_term)')
  classifier_weights = local_training.model_weights(
      local_training.structure_of(classifier_fn).model)
  if objective is None:
    weights_spec = classifier_weights
  else:
    weights_spec = (classifier_weights, local_training.model_weights(
        local_training.structure_of(objective.model_fn)))
  weights_type = tff_types.spec_to_type(weights_spec)
  group = client_execution.clients_per_call
  data_type = tff_types.client_data_type(
      element_spec, dataset_fn, with_id=objective is not None,
      clients_per_call=group if client_execution.grouped else 1)
  bytes_down = float(tff_types.payload_bytes(weights_type))
  # The classifier delta, the label counts and the weight go up.
  bytes_up = float(tff_types.payload_bytes(tff_types.spec_to_type(
      classifier_weights)) + (num_classes + 1) * np.dtype(np.float32).itemsize)
  local_steps = execution.LocalSteps(client_optimizer, 0.0,
                                     (bytes_down, bytes_up))
  if client_execution.grouped:
    execution.check_execution(
        client_execution,
        lambda: classifier_fn().model, dataset_fn, local_steps)

  def one_client(classifier, extra_model, weights, data, lr, round_num):
    client = tff_types.client_input(data, dataset_fn, seed=seed,
                                   round_num=round_num)
    # Cached: the counting pass and training see the very same batches.
    dataset = client.dataset.cache()
    counts = count_labels(dataset, num_classes)
    # Counted first: that pass fills the cache, and training replays it.
    with tf.control_dependencies([counts]):
      dataset = dataset.map(tf.autograph.experimental.do_not_convert(
          lambda batch: batch))
    if objective is None:
      result = local_training.train_locally(
          classifier.model, client_optimizer, weights, dataset, lr)
    else:
      result = objective.train(
          classifier, extra_model, client_optimizer, weights[0],
          weights[1], dataset, lr, counts, round_num,
          tff_types.key_seed(client.key))
    update = collections.OrderedDict(delta=result.weights_delta,
                                     label_counts=counts)
    return client_works.screen_client(
        tff.learning.templates.ClientResult(
            update=update, update_weight=result.num_examples),
        client_works.client_stats(result, bytes_down, bytes_up))[:2]

  def extra_model():
    return None if objective is None else objective.model_fn()

  def client_update(weights, data, lr, round_num):
    return one_client(classifier_fn(), extra_model(), weights, data, lr,
                      round_num)

  def grouped_update(weights, keys, lr, round_num):
    classifier, extra = classifier_fn(), extra_model()
    keys = tf.reshape(keys, [group])
    steps = local_steps
    if objective is not None and client_execution.fused:
      steps = local_steps._replace(term=lambda batches, keys: (
          objective.fused_term(
              classifier, extra, weights[1], batches,
              tff_types.key_seed(keys),
              fused_label_counts(batches, num_classes), round_num)))
    rows = execution.train_rows(
        client_execution, classifier.model,
        weights if objective is None else weights[0], keys, dataset_fn, lr,
        client_of_key=lambda key: one_client(classifier, extra, weights, key,
                                             lr, round_num),
        local_steps=steps, row_specs=collections.OrderedDict(
            delta=tf.nest.map_structure(
                lambda v: tf.TensorSpec(v.shape, v.dtype),
                classifier_weights),
            label_counts=tf.TensorSpec([num_classes], tf.float32)))
    values = rows.values
    if rows.batches is not None:
      counts = fused_label_counts(rows.batches, num_classes)
      values = collections.OrderedDict(
          delta=values, label_counts=tf.where(
              (rows.weights > 0)[:, tf.newaxis], counts, 0.0))
    return rows.client_result(values)

  return client_works.build_scheduled_client_work(
      tff.tensorflow.computation(weights_type, data_type, np.float32,
                                 np.int32)(
          grouped_update if client_execution.grouped else client_update),
      learning_rate=learning_rate, learning_rate_decay=learning_rate_decay)
