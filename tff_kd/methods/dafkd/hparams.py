"""DaFKD's hyper-parameters: the `config.dafkd` section.

Wang et al., "DaFKD: Domain-aware Federated Knowledge Distillation", CVPR
2023. Defaults, documentation and checks in one place (`tff_kd.hparams`),
with the choice lists that `gan` also checks against: this module imports
no TensorFlow module of the package. Which switch is the paper's, an ablation, the
reference code's or a diagnostic, and which measured negatives left, is
the table in `tff_kd/methods/dafkd/NOTES.md`.
"""

import dataclasses
import operator
import types
from typing import Any, ClassVar, Mapping

from tff_kd import errors
from tff_kd import hparams as hp


GENERATORS = ('mlp', 'dcgan', 'feature')
FEATURE_ACTIVATIONS = ('relu', 'linear')
ENSEMBLES = ('probs', 'logits')
WEIGHTINGS = ('discriminator', 'uniform')
POOL_GENERATORS = ('aggregated', 'broadcast')
AGGREGATIONS = ('mean', 'examples')
POOLS = ('generator', 'real')
DISCRIMINATORS = ('plain', 'projection')
# Eq. (3)'s form (`gan.generator_loss`).
GENERATOR_FORMS = ('minimax', 'non_saturating')
# Where the generator step's pseudo labels y of g(z, y) come from
# (`gan.GanSettings.generator_labels`).
GENERATOR_LABELS = ('uniform', 'local')
# How the discriminator's BatchNorm normalises what it scores during client
# training (`gan.client_gan_step`); the server always scores in inference
# mode.
DISCRIMINATOR_MODES = ('inference', 'real_train', 'batch', 'batch_update')
# Where a round's GAN steps are (`dafkd_tf.client_round`).
GAN_WINDOWS = ('first', 'last')
# Whether the GAN's forward passes run outside its window too
# (`gan.GanSettings.gan_passes`).
GAN_PASSES = ('window', 'every_step')
# The gradient penalty's norm (`gan.gradient_penalty`).
GP_NORMS = ('image', 'pixel')
# Whose discriminator a client trains (`dafkd_tff.build_client_work`).
DISCRIMINATOR_SHARINGS = ('client', 'global')
# How the server's BatchNorm normalises the pool it draws and scores
# (`dafkd_tf.ServerSettings.batch_statistics`).
SERVER_BATCHNORMS = ('inference', 'batch')


# The presets of `dafkd.variant` (docs/variants.md). Measured in DaFKD's
# drift regime (configs/dafkd_paper_cpu.py, seeds 0-2; the server's 500
# labeled images after the last round, studies/table1/README.md):
# paper_dcgan .410 at Dir(0.05) and .756 at Dir(0.1), features .749 at
# Dir(0.05), real_pool .901 and .907. 'reference' is the authors' code's
# choices (studies/parity).
VARIANTS: Mapping[str, hp.Variant] = types.MappingProxyType({
    'paper': hp.Variant(
        summary='Algorithm 1 as printed: the MLP generator (Sec. 4.2), '
        'eq. 7 on discriminators that score images without labels.',
        differs='',
        keys={}),
    'paper_dcgan': hp.Variant(
        summary='The paper with the reference code\'s DCGAN generator, as '
        'Table 1 at CPU size ran it.',
        differs='The DCGAN generator of the reference code: the paper\'s '
        'MLP generator gave eq. 7 no domain signal (holder ratio 1.0, '
        'tff_kd/methods/dafkd/NOTES.md). In the drift regime its pool is '
        'mostly one class and the step lowers the labeled accuracy in '
        'most rounds (39.92 at Dir(0.05)).',
        keys={'dafkd.generator': 'dcgan'}),
    'features': hp.Variant(
        summary='Appendix A\'s generator of features, conditional and '
        'label-respecting; the best data-free preset in the drift regime.',
        differs='A conditional feature generator trained on the clients\' '
        'own labels with an auxiliary classifier term (ACGAN-style), '
        'projection discriminators, eq. 2 kept out of the shared '
        'extractor, distillation at T = 1 (the reference code\'s T = 20 '
        'makes every target nearly uniform). The server distils only the '
        'head on generated features.',
        keys={'dafkd.generator': 'feature', 'dafkd.generator_labels': 'local',
              'dafkd.aux_weight': 1.0, 'dafkd.discriminator': 'projection',
              'dafkd.detach_extractor': True, 'distill.temperature': 1.0}),
    'real_pool': hp.Variant(
        summary='Domain-aware distillation on the server\'s real unlabeled '
        'images (`server_data.proxy`, FedDF\'s pool) instead of generated '
        'ones; the preset that works in the drift regime.',
        differs='Not data-free: the discriminators train against, and the '
        'server distils on, real unlabeled images, as FedDF\'s server '
        'does; no generator is trained. Eq. 7\'s weights and eq. 8\'s '
        'ensemble are the paper\'s.',
        keys={'dafkd.pool': 'real'}),
    'reference': hp.Variant(
        summary='What the authors\' code (haozhaowang/DaFKD2023 at '
        '39a536c) runs, as far as the library\'s design allows '
        '(studies/parity runs it beside that code).',
        differs='The reference code\'s choices where the paper is silent '
        'or says otherwise: the DCGAN generator; eq. 2 as the sum of its '
        'real and fake means (adv_weight 2) with a per-pixel gradient '
        'penalty (0.3), both only in the first 5 local epochs of rounds '
        '0-2 and the generator steps only in those of rounds 0-4, while '
        'the GAN\'s training-mode forward passes run in every step and '
        'update the BatchNorm statistics; a pool drawn from the broadcast '
        'generator, scored and labelled with each batch of 32 normalised '
        'by its own statistics; eq. 7 on logits; no distillation in round '
        '0; 1,600 Adam steps of batch 32 at lr 1e-4 and T = 20, KL mean '
        'over classes, the student in training mode; one discriminator '
        'for every client (here the mean of the round\'s, there one head '
        'the clients train in turn); its clients\' ReduceLROnPlateau. Not '
        'reproduced: its server\'s ReduceLROnPlateau, the generator\'s '
        'AMSGrad and weight decay, the fixed batch orders '
        '(docs/methods/dafkd.md, "The reference code against the paper").',
        keys={'dafkd.generator': 'dcgan', 'dafkd.adv_weight': 2.0,
              'dafkd.gp_weight': 0.3, 'dafkd.gp_norm': 'pixel',
              'dafkd.discriminator_mode': 'batch_update',
              'dafkd.gan_epochs': 5, 'dafkd.disc_rounds': 3,
              'dafkd.generator_rounds': 5, 'dafkd.gan_passes': 'every_step',
              'dafkd.pool_generator': 'broadcast',
              'dafkd.server_batchnorm': 'batch', 'dafkd.ensemble': 'logits',
              'dafkd.aggregation': 'examples',
              'dafkd.first_distill_round': 1,
              'dafkd.discriminator_sharing': 'global',
              'dafkd.client_plateau': True,
              'distill.learning_rate': 1e-4, 'distill.temperature': 20.0,
              'distill.steps': 1600, 'distill.batch_size': 32,
              'distill.kl_reduction': 'mean', 'distill.clip_norm': 0.0,
              'distill.val_fraction': 0.0, 'distill.cosine_decay': False,
              'distill.student_training': True}),
})


@dataclasses.dataclass(frozen=True)
class DaFKDHparams(hp.Hparams):
  """DaFKD (Wang et al., CVPR 2023), `config.dafkd`.

  The client optimiser is `config.client_optimizer` (paper: lr 1e-3,
  weight decay 1e-3 -> name=adam plus weight_decay, i.e. AdamW); the
  distillation is `config.distill` (paper: lr 0.01; reference: T = 20).

  The clients' weight decay (the paper's 1e-3) is
  `client_optimizer.weight_decay`, with `client_optimizer.name=adam`
  (AdamW); its old key `dafkd.weight_decay` moves there when DaFKD runs.

  Attributes:
    variant: The preset (`VARIANTS`, docs/variants.md) that fills in the
      keys it sets where the config leaves them unset: 'paper' |
      'paper_dcgan' | 'features' | 'real_pool' | 'reference'. ''
      (default): 'real_pool'
      where the server has unlabeled images (`server_data.proxy`), else
      'features', the two that did best in the drift regime on the
      server's labeled images (`default_variant`).
    pool_size: Generated distillation images per round (reference: 1,280).
    noise_dim: The generator's noise size (paper: 100).
    generator_hidden: The MLP generator's FC+BN+LeakyReLU widths, a comma
      list.
    generator_learning_rate: The generator's Adam learning rate (paper
      1e-3).
    generator_beta_1: Its Adam beta_1 (reference code: 0.5).
    generator_beta_2: Its Adam beta_2 (reference code: 0.99).
    generator: 'mlp' (the paper's) | 'dcgan' (the reference code's) |
      'feature' (appendix A, Fig. 7: the generator makes features of the
      classifier's extractor, FedGen's generator with one hidden layer of
      `generator_hidden`'s first width; the discriminators read them with
      their heads, the teachers with their classifier heads, and the
      server distils the averaged classifier's head on them).
    detach_extractor: Eq. (2)'s real term trains only the discriminator's
      head, not the classifier's extractor it shares (not the paper's; see
      `gan.GanSettings`). Needs shared_extractor.
    feature_activation: The feature generator's output activation: 'relu'
      (the CNN's and ResNet's features are post-ReLU) | 'linear'.
    generator_width: The DCGAN generator's last hidden channels (twice
      that before it; reference-like 64).
    generator_labels: Labels of g(z, y) in the clients' generator step:
      'uniform' (the paper; nothing ties g to its label) | 'local' (drawn
      from the client's real batch, so a client trains g only for the
      classes it holds). See `gan.GanSettings`.
    aux_weight: Weight of the auxiliary term CE(classifier_k(g(z, y)), y)
      in the generator step (ACGAN-style; 0 = the paper's eq. 3 alone).
    discriminator: 'plain' (the paper's f_k(x)) | 'projection' (a
      label-conditioned head f_k(x, y), Miyato & Koyama 2018: eq. 7 then
      scores each pool sample with its pseudo label y of G(z, y)).
    generator_form: 'non_saturating' | 'minimax' (eq. 3 as printed).
    discriminator_mode: BatchNorm mode of everything the discriminator
      scores in training: 'inference' (as the server scores; default) |
      'real_train' | 'batch' | 'batch_update' (the reference code). See
      `dafkd.gan.client_gan_step`.
    gan_steps: GAN terms (eq. 2 in eq. 9, eq. 3) only in gan_steps local
      steps of a round, plain CE steps in the others; 0 = every step
      (Algorithm 1).
    gan_window: Where those steps are: 'first' (reference code: first
      epochs) | 'last' (the head ends the round in step with the extractor
      it uploads).
    gan_epochs: GAN terms only in the first gan_epochs local epochs of a
      round (the reference code's 5; needs local.unit='epochs'); 0: the
      window is `gan_steps`'.
    disc_rounds: Eq. 2 (and the gradient penalty) enter eq. 9 only in
      rounds r < disc_rounds (counted from 0; the reference code's 3); 0:
      every round.
    generator_rounds: The generator steps of eq. 3 only in rounds r <
      generator_rounds (the reference code's 5); 0: every round.
    gan_passes: 'window' (outside the GAN window a step is plain
      cross-entropy) | 'every_step' (the reference code's loop: every step
      makes the pseudo batch and runs the discriminator's and the
      generator's forward passes in `discriminator_mode`, whose
      training-mode passes update the BatchNorm statistics; only their
      losses and updates are limited to the windows).
    gp_norm: The gradient penalty's norm: 'image' (WGAN-GP's, over each
      sample) | 'pixel' (the reference code's, over the channels of each
      pixel: every pixel's gradient is pushed to norm 1).
    client_plateau: The clients' learning rate follows the reference
      code's ReduceLROnPlateau within a round: x0.2 after 3 epochs in which
      the mean of the epochs' last-batch cross-entropies does not improve
      (needs local.unit='epochs').
    adv_weight: Weight of eq. 2 in eq. 9.
    gp_weight: Gradient-penalty weight (reference code 0.3, paper 0).
    discriminator_sharing: 'client' (Algorithm 1, line 18: each client
      keeps its own discriminator between rounds) | 'global' (one
      discriminator for every client, the mean of the round's trained ones;
      the closest a federated round comes to the reference code's single
      head, which its clients train one after another).
    shared_extractor: The discriminator is a head on the classifier's
      feature extractor (the paper); False is Table 3's ablation, a
      separate discriminator network. Old name: `no_sharing` (its
      negation), read until the next release.
    weighting: The teachers' per-sample weights: 'discriminator' (eq. 7,
      the normalised discriminator outputs) | 'uniform' (Table 3's ablation,
      "no correlation"). Old name: `no_correlation` (True: 'uniform').
    ensemble: What eq. 7's weights average: 'probs' (eq. 8) | 'logits' (the
      reference code). Old name: `weights_on`.

    private: Appendix B: discriminators stay on the clients; needs a
      secure-sum (test) context.
    pool_generator: '' auto ('broadcast' if private, else 'aggregated') |
      'aggregated' (theta_{t+1}, Algorithm 1 line 11) | 'broadcast'
      (theta_t).
    aggregation: Averaging of classifiers and generators: 'mean' (the
      paper's 1/K_t) | 'examples' (FedAvg's n_k / n).
    pool: 'generator' (DaFKD) | 'real': the oracle-pool ablation
      (negatives and distillation pool are the server's real proxy
      images).
    server_batchnorm: How the server's BatchNorm layers see the pool:
      'inference' (the generator draws it and the teachers and
      discriminators score it with their moving statistics) | 'batch' (the
      reference code: each batch of `distill.batch_size` is normalised by
      its own statistics, in the generator and in every teacher; moving
      statistics unchanged).
    first_distill_round: The server distils from this round on (counted
      from 0; the reference code's 1); before it the round's classifier is
      the average of eq. 6.
    holder_share: Diagnostics (with server_data.val_size > 0): a client
      holds a label when at least this share of its examples have it.
    twin_student: A diagnostic: every round, also distil the averaged
      classifier on the uniform ensemble of the same teachers and pool, and
      report its labeled accuracy (`distill/twin_labeled_accuracy_after`,
      against `distill/labeled_accuracy_after`); the run is otherwise
      unchanged. Costs one more distillation per round; needs
      server_data.val_size > 0 and plain (non-private) mode.
    diagnostics_every: The mechanism diagnostics (with server_data.val_size
      > 0: `diagnostics.RoundDiagnostics`, which score every teacher on the
      labeled validation images) run in the rounds r (counted from 1) with
      r % diagnostics_every == 0 and read NaN in the others; 1: every
      round. Training is the same either way (the labeled accuracies of
      `distill.validation` / `distill.accept` are not diagnostics).
  """

  SECTION: ClassVar[str] = 'dafkd'
  ALIASES: ClassVar[Mapping[str, hp.Alias]] = {
      'no_sharing': hp.Alias('shared_extractor', operator.not_),
      'no_correlation': hp.Alias(
          'weighting', lambda uniform: 'uniform' if uniform
          else 'discriminator', bool),
      'weights_on': hp.Alias('ensemble'),
      'weight_decay': hp.Alias('client_optimizer.weight_decay',
                               field_type=float)}
  VARIANTS: ClassVar[Mapping[str, hp.Variant]] = VARIANTS

  variant: str = hp.field('', hp.one_of('', *VARIANTS))

  pool_size: int = hp.field(1280, hp.positive_int)
  noise_dim: int = hp.field(100, hp.positive_int)
  generator_hidden: str = hp.field('256,512', hp.widths)
  generator_learning_rate: float = hp.field(1e-3, hp.positive_number)
  generator_beta_1: float = hp.field(0.5, hp.unit_fraction)
  generator_beta_2: float = hp.field(0.99, hp.unit_fraction)
  generator: str = hp.field('mlp', hp.one_of(*GENERATORS))
  feature_activation: str = hp.field('relu',
                                     hp.one_of(*FEATURE_ACTIVATIONS))
  generator_width: int = hp.field(64, hp.positive_int)
  generator_labels: str = hp.field('uniform',
                                   hp.one_of(*GENERATOR_LABELS))
  aux_weight: float = hp.field(0.0, hp.non_negative_number)
  discriminator: str = hp.field('plain', hp.one_of(*DISCRIMINATORS))
  generator_form: str = hp.field('non_saturating',
                               hp.one_of(*GENERATOR_FORMS))
  discriminator_mode: str = hp.field('inference',
                                   hp.one_of(*DISCRIMINATOR_MODES))
  gan_steps: int = hp.field(0, hp.non_negative_int)
  gan_window: str = hp.field('last', hp.one_of(*GAN_WINDOWS))
  gan_epochs: int = hp.field(0, hp.non_negative_int)
  disc_rounds: int = hp.field(0, hp.non_negative_int)
  generator_rounds: int = hp.field(0, hp.non_negative_int)
  gan_passes: str = hp.field('window', hp.one_of(*GAN_PASSES))
  gp_norm: str = hp.field('image', hp.one_of(*GP_NORMS))
  client_plateau: bool = hp.field(False, hp.boolean)
  adv_weight: float = hp.field(1.0, hp.non_negative_number)
  gp_weight: float = hp.field(0.0, hp.non_negative_number)
  discriminator_sharing: str = hp.field(
      'client', hp.one_of(*DISCRIMINATOR_SHARINGS))
  shared_extractor: bool = hp.field(True, hp.boolean)
  detach_extractor: bool = hp.field(False, hp.boolean)
  weighting: str = hp.field('discriminator', hp.one_of(*WEIGHTINGS))
  ensemble: str = hp.field('probs', hp.one_of(*ENSEMBLES))
  private: bool = hp.field(False, hp.boolean)
  pool_generator: str = hp.field('', hp.one_of('', *POOL_GENERATORS))
  aggregation: str = hp.field('mean', hp.one_of(*AGGREGATIONS))
  pool: str = hp.field('generator', hp.one_of(*POOLS))
  server_batchnorm: str = hp.field('inference',
                                   hp.one_of(*SERVER_BATCHNORMS))
  first_distill_round: int = hp.field(0, hp.non_negative_int)
  holder_share: float = hp.field(0.05, hp.unit_interval)
  diagnostics_every: int = hp.field(1, hp.positive_int)
  twin_student: bool = hp.field(False, hp.boolean)

  @classmethod
  def default_variant(cls, config: Mapping[str, Any]) -> str:
    """'real_pool' where the config gives the server unlabeled images
    (`server_data.proxy`), else 'features'."""
    server_data = config.get('server_data') or {}
    return 'real_pool' if server_data.get('proxy') else 'features'

  @property
  def hidden_widths(self) -> tuple[int, ...]:
    """`generator_hidden` as integers."""
    return hp.parse_widths(self.generator_hidden)

  @property
  def resolved_pool_generator(self) -> str:
    """`pool_generator`, with '' resolved ('broadcast' if private)."""
    return self.pool_generator or ('broadcast' if self.private
                                   else 'aggregated')

  def _check_combinations(self) -> None:
    if self.private and self.ensemble != 'probs':
      raise errors.ConfigError(
          f'dafkd.ensemble={self.ensemble!r}: private mode (appendix B) '
          "sums soft predictions: it needs ensemble='probs'")
    if self.private and self.resolved_pool_generator != 'broadcast':
      raise errors.ConfigError(
          f'dafkd.pool_generator={self.pool_generator!r}: private mode '
          'draws the pool on the clients, which only have the broadcast '
          "generator: pool_generator must be 'broadcast'")
    if self.discriminator == 'projection' and self.pool == 'real':
      raise errors.ConfigError(
          "dafkd.discriminator='projection' scores (image, label) pairs; "
          "the oracle pool (dafkd.pool='real') is unlabeled")
    if self.discriminator == 'projection' and self.gp_weight:
      raise errors.ConfigError(
          "dafkd.discriminator='projection' has no gradient penalty (it "
          'interpolates images of different labels): set dafkd.gp_weight=0')
    if self.generator == 'feature':
      self._check_feature_generator()
    if self.twin_student and self.private:
      raise errors.ConfigError(
          'dafkd.twin_student=True distils on the uniform ensemble of the '
          'teachers, which private mode (appendix B) never shows the '
          'server: set dafkd.private=False')
    if self.detach_extractor and not self.shared_extractor:
      raise errors.ConfigError(
          'dafkd.detach_extractor=True keeps eq. 2 out of the shared '
          'extractor: it needs dafkd.shared_extractor=True')
    if self.gan_epochs and self.gan_steps:
      raise errors.ConfigError(
          f'dafkd.gan_epochs={self.gan_epochs} and dafkd.gan_steps='
          f'{self.gan_steps} are two GAN windows: set one to 0')
    if self.private and self.discriminator_sharing != 'client':
      raise errors.ConfigError(
          f'dafkd.discriminator_sharing={self.discriminator_sharing!r}: in '
          'private mode (appendix B) the discriminators never leave the '
          "clients; set dafkd.discriminator_sharing='client'")
    if self.private and self.server_batchnorm != 'inference':
      raise errors.ConfigError(
          f'dafkd.server_batchnorm={self.server_batchnorm!r}: in private '
          'mode (appendix B) the clients score the pool; set '
          "dafkd.server_batchnorm='inference'")
    if self.private and self.pool == 'real':
      raise errors.ConfigError(
          "dafkd.pool='real' is an ablation of the plain (non-private) "
          'method: set dafkd.private=False')

  def _check_feature_generator(self) -> None:
    conflicts = [
        (self.pool == 'real', "dafkd.pool='real' holds images"),
        (bool(self.gp_weight), 'dafkd.gp_weight > 0 interpolates images'),
        (not self.shared_extractor,
         'dafkd.shared_extractor=False gives the discriminator an extractor '
         "other than the teachers' heads read")]
    for conflict, why in conflicts:
      if conflict:
        raise errors.ConfigError(
            "dafkd.generator='feature' (appendix A) makes features of the "
            f'classifier\'s extractor, but {why}')

  def check_settings(self, settings: Any) -> None:
    if self.gan_epochs and settings.local.unit != 'epochs':
      raise errors.ConfigError(
          f'dafkd.gan_epochs={self.gan_epochs} counts local epochs, but '
          f'local.unit={settings.local.unit!r}: use dafkd.gan_steps')
    if self.client_plateau and settings.local.unit != 'epochs':
      raise errors.ConfigError(
          'dafkd.client_plateau=True steps its schedule at the end of each '
          f'local epoch, but local.unit={settings.local.unit!r}')
    if self.twin_student and not settings.server_data.val_size:
      raise errors.ConfigError(
          'dafkd.twin_student=True reports a labeled accuracy: it needs '
          'server_data.val_size > 0')
    if self.pool == 'real' and not settings.server_data.proxy:
      raise errors.ConfigError(
          "dafkd.pool='real' (the oracle pool) needs the server's proxy "
          'pool: set server_data.proxy and server_data.proxy_size')


# DaFKD's recipe of the shared `distill` keys, as in the paper (Sec. 5:
# distillation lr 0.01) and its reference code (T = 20; the student keeps
# the averaged model's BatchNorm statistics: its pool is generated).
DISTILL_DEFAULTS: Mapping[str, Any] = types.MappingProxyType({
    'learning_rate': 0.01, 'temperature': 20.0, 'student_training': False})
