"""FedGen as a TFF learning process.

Zhu, Hong and Zhou, "Data-Free Knowledge Distillation for Heterogeneous
Federated Learning", ICML 2021 (Algorithm 1; generator objective eq. 4 with
the supplement's label-count weighting, Sec. 9; client objective eq. 5).
This module validates the settings and wires the stages of
`tff_kd.federated.fedgen` (data flow of one round: see there) with the
stacking aggregator of `tff_kd.federated.stacking`.

State: `tff.learning.templates.LearningAlgorithmState` whose
`global_model_weights` is `(classifier ModelWeights, generator
ModelWeights)`; `get_model_weights` / `set_model_weights` see the
classifier (`composer.first_model_view`); `generator_weights` reads the
generator.
"""

import collections
import math
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.algorithms import hparams as hparams_lib
from tff_kd.federated import composer
from tff_kd.federated import fedgen as fedgen_tff
from tff_kd.federated import learning
from tff_kd.federated import stacking
from tff_kd.models import generators


def build_fedgen_process(
    classifier_fn: fedgen_tff.ClassifierFn,
    element_spec: collections.OrderedDict,
    *,
    num_classes: int,
    clients_per_round: int,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    generator_optimizer: tff.learning.optimizers.Optimizer,
    learning_rate: float,
    dataset_fn: Optional[learning.DatasetFn],
    local_batch_size: int,
    learning_rate_decay: float = 1.0,
    hparams: hparams_lib.FedGenHparams = hparams_lib.FedGenHparams(),
    seed: int = 0,
) -> tff.learning.templates.LearningProcess:
  """Builds FedGen (defaults: the reference's MNIST settings).

  Args:
    classifier_fn: Builds the `tff_kd.models.Classifier`; its head must be
      one Dense layer (FedGen's generator imitates the head's input).
    element_spec: Batch structure of the client datasets.
    num_classes: C.
    clients_per_round: M, the most clients per round (stack slots).
    client_optimizer: Client optimizer (reference: SGD).
    server_optimizer: Applies the mean classifier delta (SGD lr 1: FedAvg).
    generator_optimizer: Reference: Adam, lr 3e-4 (MNIST; the registry
      builds it from `hparams.generator_learning_rate`).
    learning_rate: Client learning rate at round 0 (> 0).
    dataset_fn: Key -> dataset function (the fast path), or None: clients
      then take `OrderedDict(client_id=int32, data=<dataset>)`, the id
      seeding their own generator noise (`learning.client_input`).
    local_batch_size: B, the clients' batch size (scales alpha by B'/B).
    learning_rate_decay: Client lr multiplier per round, in (0, 1].
    hparams: `config.fedgen` (`hparams_lib.FedGenHparams`; defaults: the
      reference's MNIST settings). `reference_steps` scales the
      regulariser's coefficients (`federated.fedgen.LocalRegularizer`).
    seed: Seed of the generator's initial weights and of its noise.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ConfigError: A bad setting, or a classifier whose head is not linear.
  """
  hparams.validate()
  _check(learning_rate=learning_rate, learning_rate_decay=learning_rate_decay,
         clients_per_round=clients_per_round,
         local_batch_size=local_batch_size)
  h = hparams
  with tf.Graph().as_default():
    classifier = classifier_fn()
    try:
      fedgen_tff.head_variables(classifier)
    except ValueError as e:
      raise errors.ConfigError(str(e)) from None
    feature_dim = classifier.feature_dim
    if classifier.model.output_shape[-1] != num_classes:
      raise errors.ConfigError(
          f'the classifier has {classifier.model.output_shape[-1]} outputs '
          f'but num_classes is {num_classes}')

  def generator_fn():
    return generators.build_feature_generator(
        noise_dim=h.noise_dim, num_classes=num_classes,
        feature_dim=feature_dim, hidden=h.hidden,
        output_activation=h.output_activation or None, seed=seed)

  regularizer = fedgen_tff.LocalRegularizer(
      generator_fn=generator_fn, noise_dim=h.noise_dim, alpha=h.local_alpha,
      beta=h.local_beta, decay=h.coefficient_decay, floor=1e-4,
      gen_batch_size=h.local_gen_batch_size, batch_size=local_batch_size,
      noise=h.noise, start_round=h.start_round,
      reference_steps=h.reference_steps)
  client_work = fedgen_tff.build_client_work(
      classifier_fn, element_spec, client_optimizer, num_classes=num_classes,
      learning_rate=learning_rate, learning_rate_decay=learning_rate_decay,
      dataset_fn=dataset_fn, regularizer=regularizer, seed=seed)
  aggregator, stack_type = stacking.build_client_stack(
      client_work, clients_per_round)
  finalizer = fedgen_tff.build_generator_finalizer(
      classifier_fn, stack_type, server_optimizer,
      fedgen_tff.GeneratorTraining(
          generator_fn=generator_fn, optimizer=generator_optimizer,
          steps=h.generator_steps, batch_size=h.generator_batch_size,
          noise_dim=h.noise_dim, noise=h.noise,
          teacher_weight=h.teacher_weight,
          diversity_weight=h.diversity_weight, ensemble=h.teacher_ensemble,
          seed=seed))
  initial = fedgen_tff.initial_weights_fn(classifier_fn, generator_fn)
  process = composer.compose_learning_process(
      initial,
      tff.learning.templates.build_broadcast_process(
          initial.type_signature.result),
      client_work, aggregator, finalizer)
  return composer.first_model_view(process)


def generator_weights(state) -> tff.learning.models.ModelWeights:
  """The global generator's `ModelWeights` from a FedGen process state."""
  return state.global_model_weights[1]


def _check(**v) -> None:
  """Checks the settings that are not `config.fedgen`'s."""
  def fail(message):
    raise errors.ConfigError(f'fedgen {message}')

  def finite(x):
    return isinstance(x, (int, float)) and not isinstance(
        x, bool) and math.isfinite(x)

  if not (finite(v['learning_rate']) and v['learning_rate'] > 0):
    fail(f"client learning rate must be > 0, got {v['learning_rate']!r}")
  if not (finite(v['learning_rate_decay']) and
          0 < v['learning_rate_decay'] <= 1):
    fail('client learning-rate decay must be in (0, 1], got '
         f"{v['learning_rate_decay']!r}")
  for name in ('clients_per_round', 'local_batch_size'):
    if not isinstance(v[name], int) or isinstance(v[name], bool) or (
        v[name] < 1):
      fail(f'{name} must be an integer >= 1, got {v[name]!r}')
