"""FedFTG as a TFF learning process.

Zhang, Shen, Ding, Tao and Duan, "Fine-tuning Global Model via Data-Free
Knowledge Distillation for Non-IID Federated Learning", CVPR 2022: FedAvg,
then server-side data-free fine-tuning of the averaged model with a
conditional image generator (hard-sample mining, customised label sampling,
class-level ensemble; `tff_kd.core.fedftg`). This module validates the
settings and wires the stages of `tff_kd.federated.fedftg` (data flow of one
round: see there).

State: `tff.learning.templates.LearningAlgorithmState` whose
`global_model_weights` is the classifier's `ModelWeights`; the generator and
its optimiser state are in `state.finalizer` (`generator_weights` reads
them).
"""

import collections
import math
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors
from tff_kd.algorithms import hparams as hparams_lib
from tff_kd.core import distillation
from tff_kd.federated import composer
from tff_kd.federated import fedftg as fedftg_tff
from tff_kd.federated import label_counts
from tff_kd.federated import learning
from tff_kd.federated import stacking
from tff_kd.models import generators


def build_fedftg_process(
    classifier_fn: label_counts.ClassifierFn,
    element_spec: collections.OrderedDict,
    *,
    num_classes: int,
    clients_per_round: int,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    generator_optimizer: tff.learning.optimizers.Optimizer,
    student_optimizer: tff.learning.optimizers.Optimizer,
    learning_rate: float,
    dataset_fn: Optional[learning.DatasetFn],
    learning_rate_decay: float = 1.0,
    hparams: hparams_lib.FedFTGHparams = hparams_lib.FedFTGHparams(),
    seed: int = 0,
) -> tff.learning.templates.LearningProcess:
  """Builds FedFTG (defaults: the reference's settings where known).

  Args:
    classifier_fn: Builds the `tff_kd.models.Classifier`.
    element_spec: Batch structure of the client datasets.
    num_classes: C.
    clients_per_round: M, the most clients per round (teacher slots).
    client_optimizer: Client optimizer.
    server_optimizer: Applies the mean delta (SGD lr 1: FedAvg).
    generator_optimizer: Reference: Adam, lr 0.01 (the registry builds it
      from `hparams.generator_learning_rate`).
    student_optimizer: Reference: SGD, lr 0.1 (from
      `hparams.student_learning_rate`).
    learning_rate: Client learning rate at round 0 (> 0).
    dataset_fn: Key -> dataset function (the fast path), or None: clients
      then take plain `tf.data.Dataset`s, as TFF's own algorithms do.
    learning_rate_decay: Client lr multiplier per round, in (0, 1].
    hparams: `config.fedftg` (`hparams_lib.FedFTGHparams`; defaults: the
      reference's settings where known). The student steps run through
      `distillation.distill`; `kl_reduction` is `distillation.kd_loss`'s.
    seed: Seed of the generator's initial weights and of its noise.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ConfigError: A bad setting.
  """
  def fail(message):
    raise errors.ConfigError(f'fedftg {message}')

  hparams.validate()
  h = hparams
  if (not isinstance(clients_per_round, int) or
      isinstance(clients_per_round, bool) or clients_per_round < 1):
    fail(f'clients_per_round must be an integer >= 1, got '
         f'{clients_per_round!r}')
  if not learning_rate > 0:
    fail(f'client learning rate must be > 0, got {learning_rate!r}')
  if not (math.isfinite(learning_rate_decay) and
          0 < learning_rate_decay <= 1):
    fail(f'learning_rate_decay must be in (0, 1], got '
         f'{learning_rate_decay!r}')
  config = distillation.DistillConfig(
      steps=h.student_steps, batch_size=h.batch_size,
      temperature=h.temperature, eval_every=h.student_steps, seed=seed,
      student_training=h.student_training, kl_reduction=h.kl_reduction)
  config.validate()
  with tf.Graph().as_default():
    model = classifier_fn().model
    image_shape = tuple(model.input_shape[1:])
    if model.output_shape[-1] != num_classes:
      fail(f'classifier has {model.output_shape[-1]} outputs but num_classes '
           f'is {num_classes}')

  def generator_fn():
    return generators.build_image_generator(
        noise_dim=h.noise_dim, num_classes=num_classes,
        image_shape=image_shape, seed=seed)

  def model_fn():
    return classifier_fn().model

  client_work = label_counts.build_client_work(
      classifier_fn, element_spec, client_optimizer, num_classes=num_classes,
      learning_rate=learning_rate, learning_rate_decay=learning_rate_decay,
      dataset_fn=dataset_fn)
  aggregator, stack_type = stacking.build_client_stack(
      client_work, clients_per_round)
  finalizer = fedftg_tff.build_fine_tune_finalizer(
      model_fn, stack_type, server_optimizer,
      fedftg_tff.FineTuning(
          generator_fn=generator_fn, generator_optimizer=generator_optimizer,
          student_optimizer=student_optimizer, distill_config=config,
          iterations=h.iterations, noise_dim=h.noise_dim, noise=h.noise,
          transfer_weight=h.transfer_weight,
          diversity_weight=h.diversity_weight, mask=h.mask,
          ensemble=h.ensemble, lr_decay=h.lr_decay, seed=seed,
          generator_steps=h.generator_steps))
  initial = learning.build_initial_weights_fn(model_fn)
  return composer.compose_learning_process(
      initial,
      tff.learning.templates.build_broadcast_process(
          initial.type_signature.result),
      client_work, aggregator, finalizer)


def generator_weights(state) -> tff.learning.models.ModelWeights:
  """The server generator's `ModelWeights` from a FedFTG process state."""
  return state.finalizer['generator']
