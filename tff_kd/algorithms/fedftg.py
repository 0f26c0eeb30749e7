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
from tff_kd.core import distillation
from tff_kd.core import fedftg as fedftg_tf
from tff_kd.federated import composer
from tff_kd.federated import feddf as feddf_tff
from tff_kd.federated import fedftg as fedftg_tff
from tff_kd.federated import fedgen as fedgen_tff
from tff_kd.federated import learning
from tff_kd.models import generators


def build_fedftg_process(
    classifier_fn: fedgen_tff.ClassifierFn,
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
    iterations: int = 10,
    student_steps: int = 5,
    batch_size: int = 64,
    temperature: float = 1.0,
    student_training: bool = False,
    noise_dim: int = 100,
    noise: str = 'gaussian',
    transfer_weight: float = 1.0,
    diversity_weight: float = 1.0,
    mask: str = 'agree',
    ensemble: str = 'logits',
    lr_decay: float = 0.998,
    generator_steps: int = 0,
    kl_reduction: str = 'mean',
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
    generator_optimizer: Reference: Adam, lr 0.01.
    student_optimizer: Reference: SGD, lr 0.1.
    learning_rate: Client learning rate at round 0 (> 0).
    dataset_fn: Key -> dataset function (the fast path), or None: clients
      then take plain `tf.data.Dataset`s, as TFF's own algorithms do.
    learning_rate_decay: Client lr multiplier per round, in (0, 1].
    iterations: Generator/student iterations per round (reference 10).
    student_steps: Student steps per iteration (reference 5), through
      `distillation.distill`.
    batch_size: Generated samples per generator step and per student batch.
    temperature: Distillation temperature (also the transfer term's).
    student_training: Student in training mode (BatchNorm statistics move
      towards the generated data's) or frozen statistics (default).
    noise_dim: Generator noise size.
    noise: 'gaussian' or 'uniform'.
    transfer_weight: beta_tran of the hard-sample term.
    diversity_weight: beta_div.
    mask: 'agree' (push only samples the student still agrees on) or 'none'.
    ensemble: Class-level ensemble of 'logits' or 'probs'.
    lr_decay: Per-round factor of the generator and student learning rates
      (reference 0.998).
    generator_steps: Generator steps per iteration; 0 (default): one per
      teacher of the round, as the reference code steps once per client.
    kl_reduction: The student loss's reduction, `distillation.kd_loss`:
      'mean' (default, the reference code's: over batch x classes, so SGD's
      step is C times smaller than with 'batchmean').
    seed: Seed of the generator's initial weights and of its noise.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ConfigError: A bad setting.
  """
  def fail(message):
    raise errors.ConfigError(f'fedftg {message}')

  for name, value in (('clients_per_round', clients_per_round),
                      ('iterations', iterations),
                      ('student_steps', student_steps),
                      ('batch_size', batch_size), ('noise_dim', noise_dim)):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      fail(f'{name} must be an integer >= 1, got {value!r}')
  if not learning_rate > 0:
    fail(f'client learning rate must be > 0, got {learning_rate!r}')
  for name, value in (('learning_rate_decay', learning_rate_decay),
                      ('lr_decay', lr_decay)):
    if not (math.isfinite(value) and 0 < value <= 1):
      fail(f'{name} must be in (0, 1], got {value!r}')
  for name, value in (('transfer_weight', transfer_weight),
                      ('diversity_weight', diversity_weight)):
    if not (math.isfinite(value) and value >= 0):
      fail(f'{name} must be >= 0, got {value!r}')
  if noise not in generators.NOISE_KINDS:
    fail(f"noise {noise!r} is unknown; choose one of "
         f"{', '.join(generators.NOISE_KINDS)}")
  if mask not in fedftg_tf.MASKS:
    fail(f"mask {mask!r} is unknown; choose one of "
         f"{', '.join(fedftg_tf.MASKS)}")
  if ensemble not in ('logits', 'probs'):
    fail(f'ensemble {ensemble!r} is unknown; choose one of logits, probs')
  if (not isinstance(generator_steps, int) or
      isinstance(generator_steps, bool) or generator_steps < 0):
    fail('generator_steps must be an integer >= 0 (0: one per teacher), got '
         f'{generator_steps!r}')
  if kl_reduction not in distillation.KL_REDUCTIONS:
    fail(f'kl_reduction {kl_reduction!r} is unknown; choose one of '
         f"{', '.join(distillation.KL_REDUCTIONS)}")
  config = distillation.DistillConfig(
      steps=student_steps, batch_size=batch_size, temperature=temperature,
      eval_every=student_steps, seed=seed, student_training=student_training,
      kl_reduction=kl_reduction)
  config.validate()
  with tf.Graph().as_default():
    model = classifier_fn().model
    image_shape = tuple(model.input_shape[1:])
    if model.output_shape[-1] != num_classes:
      fail(f'classifier has {model.output_shape[-1]} outputs but num_classes '
           f'is {num_classes}')

  def generator_fn():
    return generators.build_image_generator(
        noise_dim=noise_dim, num_classes=num_classes, image_shape=image_shape,
        seed=seed)

  def model_fn():
    return classifier_fn().model

  client_work = fedgen_tff.build_client_work(
      classifier_fn, element_spec, client_optimizer, num_classes=num_classes,
      learning_rate=learning_rate, learning_rate_decay=learning_rate_decay,
      dataset_fn=dataset_fn)
  aggregator, stack_type = feddf_tff.build_client_stack(
      client_work, clients_per_round)
  finalizer = fedftg_tff.build_fine_tune_finalizer(
      model_fn, stack_type, server_optimizer,
      fedftg_tff.FineTuning(
          generator_fn=generator_fn, generator_optimizer=generator_optimizer,
          student_optimizer=student_optimizer, distill_config=config,
          iterations=iterations, noise_dim=noise_dim, noise=noise,
          transfer_weight=transfer_weight, diversity_weight=diversity_weight,
          mask=mask, ensemble=ensemble, lr_decay=lr_decay, seed=seed,
          generator_steps=generator_steps))
  initial = learning.build_initial_weights_fn(model_fn)
  return composer.compose_learning_process(
      initial,
      tff.learning.templates.build_broadcast_process(
          initial.type_signature.result),
      client_work, aggregator, finalizer)


def generator_weights(state) -> tff.learning.models.ModelWeights:
  """The server generator's `ModelWeights` from a FedFTG process state."""
  return state.finalizer['generator']
