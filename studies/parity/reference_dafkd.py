"""Runs the authors' DaFKD code (haozhaowang/DaFKD2023) on an exported split.

Run by the parity study (`studies/parity/parity.py`) with the reference's
own Python (torch, numpy; no TensorFlow, no tff_kd), from a work folder
that holds the reference's files with `dafkd.patch` applied. Nothing here
changes what the reference computes; it hands the reference, through its
own constructors, what its data loader and `main_fed.py` would:

* the data: the split `tff_kd.program.experiment.split_arrays` made
  (`--split`, an .npz written by `parity.py`), as the reference's lists of
  (x, y) batches: each client's examples shuffled once and cut into
  batches of 32 in a fixed order, as its `data_loader.batch_data` does
  (without that loader's pixel binarisation `x > 0`: the images are the
  library's, normalised to [-1, 1]); the test set as per-client slices
  (the union is the whole test set, which `_local_test_on_all_clients`
  scores) and, cut to full batches, as `test_global`;
* the model: the library's small CNN ported to torch (conv 3x3/2 1->6,
  BN, ReLU, conv 3x3/2 6->16, BN, ReLU, dense 784->32, ReLU) as the
  reference's `sharedlayer`, its linear head as `classify`, and the
  reference's discriminator head (linear + sigmoid on the shared
  features) as `discriminator`: ResNet-11 on 3x32x32 does not run a round
  on 2 cores in the time;
* the generator: the library's DCGAN layout for 28x28x1 (dense to
  7x7x128, BN, ReLU, transposed conv to 14x14x64, BN, ReLU, transposed
  conv to 28x28x1, tanh), initialised by the reference's `weights_init`:
  the reference's `GeneratorCifar` only makes 3x32x32 images;
* the clients of each round: the library's sample for (seed, round)
  (`--schedule` in the split), instead of `np.random.seed(round)`;
* the seed: `random`, numpy and torch seeded with `--seed` (the reference
  seeds 0 always); the device: the CPU.

What it adds is read-only instrumentation, every round, written to
`--out` (JSON) as the round ends:

* `test_accuracy`: the reference's own number (its
  `_local_test_on_all_clients` test accuracy: the global model in
  eval mode on the whole test set);
* `val_accuracy`: the same model on the server's 500 labeled images;
* the server step's links (DaFKD, rounds >= 1): the averaged model before
  the step and the student after it (test and labeled accuracy, eval
  mode); on the labeled images, the teachers' mean accuracy, eq. 7's
  weighted ensemble (probabilities, as the library's diagnostics; and the
  reference's weighted logits), the uniform one and the holders' one, the
  holder ratio (the library's definition, `weight_diagnostics`); on the
  generated pool, the class histogram of the reference's target, its
  entropy and top share; the discriminators' mean score on real labeled
  images and on the pool;
* `bn_recalibrated_test_accuracy` (and `avg_bn_recalibrated_test_accuracy`
  for the averaged model before the server step): the model with its
  BatchNorm statistics re-estimated on the labeled images (train-mode
  passes, cumulative average), as a probe of what its eval-mode statistics
  cost;
* `client_lr_reductions`, `server_lr_reductions`: how often the clients'
  and the server's ReduceLROnPlateau fired so far;
* `pool_zero_weight_fraction`: the share of the pool whose scores all
  underflow to 0 (the reference's division fails, its `except` zeroes
  every weight, and the target is uniform);
* `seconds`: the round's wall time (instrumentation excluded).

One decomposition switch changes what the reference computes, and is off
by default: `--no-client_plateau` keeps the clients' learning rate
constant (their ReduceLROnPlateau never reduces it), as the library's
FedAvg does.

The discriminator scores and teacher logits of the links are computed on
copies of the models, in the BatchNorm mode the reference itself uses for
them (training mode: each batch of 32 normalised by its own statistics),
so the reference's state and random streams are untouched. Every
exception the reference swallows (`logging.error`, its fallback to
FedAvg) ends this run with the error instead.

Usage (from the work folder, with the reference's python):
  python reference_dafkd.py --split=split.npz --out=rounds.json \
      --method=dafkd --seed=0 --rounds=20 --epochs=20 --lr=0.001
"""

import argparse
import copy
import json
import logging
import math
import os
import random
import sys
import time
import types

import numpy as np
import torch
from torch import nn


def _stub_torchvision() -> None:
  """The trainer imports `torchvision.utils.save_image` and never calls it
  here; the study's venv has no torchvision (PyPI's does not load beside
  the CPU torch of this machine)."""
  try:
    import torchvision.utils  # pylint: disable=g-import-not-at-top,unused-import
  except Exception:  # pylint: disable=broad-except
    utils = types.ModuleType('torchvision.utils')
    utils.save_image = lambda *a, **k: None
    tv = types.ModuleType('torchvision')
    tv.utils = utils
    sys.modules['torchvision'] = tv
    sys.modules['torchvision.utils'] = utils


class _Flatten(nn.Module):

  def forward(self, x):
    return x.reshape(x.size(0), -1)


class _SamePad(nn.Module):
  """TensorFlow's 'same' padding of a 3x3 convolution of stride 2 on an
  even size: one row and column after, none before."""

  def forward(self, x):
    return nn.functional.pad(x, (0, 1, 0, 1))


class SmallCNN(nn.Module):
  """The library's small CNN (`tff_kd.models.classifiers`, 'cnn' with
  BatchNorm) in the reference's MTL shape: `forward` returns (logits,
  discriminator score)."""

  def __init__(self, num_classes: int = 10, channels: int = 1):
    super().__init__()
    self.sharedlayer = nn.Sequential(
        _SamePad(), nn.Conv2d(channels, 6, 3, stride=2, bias=False),
        nn.BatchNorm2d(6), nn.ReLU(),
        _SamePad(), nn.Conv2d(6, 16, 3, stride=2, bias=False),
        nn.BatchNorm2d(16), nn.ReLU(),
        _Flatten(), nn.Linear(16 * 7 * 7, 32), nn.ReLU())
    self.classify = nn.Sequential(nn.Linear(32, num_classes))
    self.discriminator = nn.Sequential(nn.Linear(32, 1), nn.Sigmoid())
    # The reference's MTLResNet initialisation.
    for m in self.modules():
      if isinstance(m, nn.Conv2d):
        nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')
      elif isinstance(m, nn.BatchNorm2d):
        nn.init.constant_(m.weight, 1)
        nn.init.constant_(m.bias, 0)

  def forward(self, x):
    h = self.sharedlayer(x)
    return self.classify(h), self.discriminator(h)


class _BatchNorm1d(nn.BatchNorm1d):
  """`nn.BatchNorm1d` that takes a training batch of one example as Keras'
  `BatchNormalization` (the library's layer) does: the example normalises
  to 0, so the output is the bias, and the moving mean moves toward it
  (torch raises instead; a client's last batch can hold one image)."""

  def forward(self, x):
    if not (self.training and x.size(0) == 1):
      return super().forward(x)
    with torch.no_grad():
      self.running_mean.mul_(1 - self.momentum).add_(self.momentum * x[0])
      self.running_var.mul_(1 - self.momentum)
      self.num_batches_tracked += 1
    return self.bias.expand_as(x) + 0 * x


class DCGAN28(nn.Module):
  """The library's DCGAN generator (`generators.build_dcgan_generator`)
  for 28x28x1, unconditional as the reference's; takes noise [B, nz] or
  [B, nz, 1, 1] (the reference's two shapes)."""

  def __init__(self, noise_dim: int = 100, width: int = 64):
    super().__init__()
    self.fc = nn.Sequential(nn.Linear(noise_dim, 7 * 7 * 2 * width,
                                      bias=False),
                            _BatchNorm1d(7 * 7 * 2 * width), nn.ReLU())
    self.width = width
    self.module = nn.Sequential(
        nn.ConvTranspose2d(2 * width, width, 4, stride=2, padding=1,
                           bias=False),
        nn.BatchNorm2d(width), nn.ReLU(),
        nn.ConvTranspose2d(width, 1, 4, stride=2, padding=1), nn.Tanh())

  def forward(self, z):
    h = self.fc(z.reshape(z.size(0), -1))
    return self.module(h.reshape(h.size(0), 2 * self.width, 7, 7))


def _batches(x: np.ndarray, y: np.ndarray, batch_size: int,
             shuffle: bool) -> list:
  """The reference's `batch_data`: one shuffle with numpy seed 100 (x and
  y in the same order), then batches in that fixed order; NCHW tensors."""
  x = np.ascontiguousarray(np.transpose(x, (0, 3, 1, 2)), np.float32)
  y = np.asarray(y, np.int64)
  if shuffle:
    np.random.seed(100)
    state = np.random.get_state()
    np.random.shuffle(x)
    np.random.set_state(state)
    np.random.shuffle(y)
  return [(torch.from_numpy(x[i:i + batch_size].copy()),
           torch.from_numpy(y[i:i + batch_size].copy()))
          for i in range(0, len(x), batch_size)]


def load_split(path: str, batch_size: int) -> tuple[list, dict]:
  """The reference's `dataset` list (`main_fed.load_data`'s eight items)
  from the exported split, and the arrays the instrumentation reads."""
  z = np.load(path)
  x, y = z['x_train'], z['y_train']
  offsets = z['part_offsets']
  parts = [z['part_index'][offsets[i]:offsets[i + 1]]
           for i in range(len(offsets) - 1)]
  num_clients = len(parts)
  train_local, train_num, test_local = {}, {}, {}
  train_global = []
  # numpy's global state is reseeded by `_batches`, as `batch_data` does;
  # the caller seeds the run afterwards.
  test_cuts = np.array_split(np.arange(len(z['y_test'])), num_clients)
  for k, idx in enumerate(parts):
    train_local[k] = _batches(x[idx], y[idx], batch_size, shuffle=True)
    train_num[k] = len(idx)
    train_global += train_local[k]
    cut = test_cuts[k]
    test_local[k] = _batches(z['x_test'][cut], z['y_test'][cut], batch_size,
                             shuffle=False)
  test_all = _batches(z['x_test'], z['y_test'], batch_size, shuffle=False)
  # main_fed.load_data: DaFKD keeps the full batches of the test set.
  test_global = [b for b in test_all if b[0].shape[0] == batch_size]
  dataset = [len(y), len(z['y_test']), train_global, test_global, train_num,
             train_local, test_local, 10]
  arrays = dict(
      val=_batches(z['val_x'], z['val_y'], batch_size, shuffle=False),
      val_y=np.asarray(z['val_y'], np.int64),
      test=test_all,
      label_counts=np.stack([np.bincount(y[p], minlength=10) for p in parts]),
      schedule=np.asarray(z['schedule'], np.int64))
  return dataset, arrays


def _accuracy(model: nn.Module, batches: list) -> float:
  """Eval-mode accuracy of `model` (its classifier output) on batches."""
  model.eval()
  correct = total = 0
  with torch.no_grad():
    for x, y in batches:
      correct += int((model(x)[0].argmax(-1) == y).sum())
      total += len(y)
  return correct / max(total, 1)


def _train_mode_outputs(model: nn.Module, batches: list):
  """(logits [N, C], scores [N]) with each batch in training mode, as the
  reference scores its pool (`get_probability_density`, `get_pd_log`), on
  a copy (the running statistics of `model` stay)."""
  m = copy.deepcopy(model)
  m.train()
  logits, scores = [], []
  with torch.no_grad():
    for x, _ in batches:
      out_c, out_d = m(x)
      logits.append(out_c)
      scores.append(out_d.flatten())
  return torch.cat(logits).numpy(), torch.cat(scores).numpy()


def _recalibrated(model: nn.Module, batches: list) -> nn.Module:
  """A copy of `model` whose BatchNorm statistics are the cumulative mean
  over training-mode passes of `batches`."""
  m = copy.deepcopy(model)
  for layer in m.modules():
    if isinstance(layer, nn.modules.batchnorm._BatchNorm):  # pylint: disable=protected-access
      layer.reset_running_stats()
      layer.momentum = None
  m.train()
  with torch.no_grad():
    for x, _ in batches:
      m(x)
  return m


def _softmax(z: np.ndarray) -> np.ndarray:
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def _entropy(p: np.ndarray) -> float:
  p = p[p > 0]
  return float(-(p * np.log(p)).sum())


def weight_links(logits: np.ndarray, scores: np.ndarray, labels: np.ndarray,
                 counts: np.ndarray, share: float = 0.05) -> dict:
  """The library's `weight_diagnostics` in numpy: eq. 7's weights from
  discriminator scores [K, N] against the holders of each label.

  Args:
    logits: [K, N, C] teacher logits.
    scores: [K, N] discriminator scores.
    labels: [N].
    counts: [K, C] each teacher's label counts.
    share: A teacher holds label c when at least this share of its
      examples have it.
  """
  k = logits.shape[0]
  total = scores.sum(0, keepdims=True)
  alpha = np.where(total > 0, scores / np.where(total > 0, total, 1), 1 / k)
  probs = _softmax(logits)
  shares = counts / np.maximum(counts.sum(1, keepdims=True), 1)
  holder = shares[:, labels] >= share  # [K, N]
  n_hold = holder.sum(0)
  informative = (n_hold > 0) & (n_hold < k)
  mass = (alpha * holder).sum(0)
  uniform_mass = n_hold / k
  oracle = np.where(n_hold[:, None] > 0,
                    (probs * holder[..., None]).sum(0) /
                    np.maximum(n_hold, 1)[:, None], probs.mean(0))
  weighted = (alpha[..., None] * probs).sum(0)
  weighted_logits = (alpha[..., None] * logits).sum(0)
  out = dict(
      holder_ratio=float(mass[informative].mean() /
                         uniform_mass[informative].mean())
      if informative.any() else float('nan'),
      informative_fraction=float(informative.mean()),
      teacher_accuracy=float((probs.argmax(-1) == labels).mean()),
      ensemble_accuracy_weighted=float((weighted.argmax(-1) == labels).mean()),
      ensemble_accuracy_weighted_logits=float(
          (weighted_logits.argmax(-1) == labels).mean()),
      ensemble_accuracy_uniform=float(
          (probs.mean(0).argmax(-1) == labels).mean()),
      ensemble_accuracy_oracle=float((oracle.argmax(-1) == labels).mean()))
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--split', required=True)
  parser.add_argument('--out', required=True)
  parser.add_argument('--method', choices=('dafkd', 'fedavg'),
                      default='dafkd')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--rounds', type=int, default=20)
  parser.add_argument('--epochs', type=int, default=20)
  parser.add_argument('--batch_size', type=int, default=32)
  parser.add_argument('--lr', type=float, default=1e-3)
  parser.add_argument('--es_lr', type=float, default=1e-4)
  parser.add_argument('--ed_epoch', type=int, default=40)
  parser.add_argument('--temperature', type=float, default=20.0)
  parser.add_argument('--wd', type=float, default=1e-4)
  parser.add_argument('--threads', type=int, default=1)
  parser.add_argument(
      '--client_plateau', action=argparse.BooleanOptionalAction,
      default=True, help="The clients' ReduceLROnPlateau (a decomposition "
      'switch: --no-client_plateau keeps their lr constant, as the '
      "library's FedAvg does)")
  flags = parser.parse_args()

  torch.set_num_threads(flags.threads)
  _stub_torchvision()
  sys.path.insert(0, os.getcwd())
  from DaFKD import DaFKD  # pylint: disable=g-import-not-at-top
  from model.gan import weights_init  # pylint: disable=g-import-not-at-top
  from trainer.my_model_trainer_MTL import MyModelTrainer  # pylint: disable=g-import-not-at-top

  errors = []

  class _Errors(logging.Handler):

    def emit(self, record):
      if record.levelno >= logging.ERROR:
        errors.append(record.getMessage())

  logging.basicConfig(level=logging.WARNING)
  logging.getLogger().addHandler(_Errors())

  # ReduceLROnPlateau's reductions: [clients', the server's].
  reductions = [0, 0]
  plateau = torch.optim.lr_scheduler.ReduceLROnPlateau

  class _CountingPlateau(plateau):

    def _reduce_lr(self, epoch):  # pylint: disable=arguments-renamed
      if not (flags.client_plateau or state['in_distill']):
        return None  # The switch: the clients' lr stays constant.
      reductions[int(state['in_distill'])] += 1
      return super()._reduce_lr(epoch)

  torch.optim.lr_scheduler.ReduceLROnPlateau = _CountingPlateau

  dataset, arrays = load_split(flags.split, flags.batch_size)
  random.seed(flags.seed)
  np.random.seed(flags.seed)
  torch.manual_seed(flags.seed)

  args = argparse.Namespace(
      dataset='mnist', model='DaFKD', batch_size=flags.batch_size,
      client_optimizer='adam', lr=flags.lr, wd=flags.wd, epochs=flags.epochs,
      es_lr=flags.es_lr, d_epoch=1, ed_epoch=flags.ed_epoch, gan_epoch=5,
      noise_dimension=100, temperature=flags.temperature,
      client_num_in_total=len(dataset[4]),
      client_num_per_round=arrays['schedule'].shape[1],
      baseline='DaFKD' if flags.method == 'dafkd' else 'FedAvg',
      comm_round=flags.rounds, alpha=None, aggregation_method='FedDF',
      frequency_of_the_test=1, gpu=0, ci=0)
  trainer = MyModelTrainer(model=SmallCNN(), args=args)
  trainer.model_g = DCGAN28(args.noise_dimension)
  trainer.model_g.apply(weights_init)

  records = []
  state = dict(round=0, start=time.perf_counter(), excluded=0.0, links={},
               clients={}, in_distill=False)

  def excluded(fn):
    """Runs instrumentation `fn`, its time left out of the round's."""
    t = time.perf_counter()
    try:
      return fn()
    finally:
      state['excluded'] += time.perf_counter() - t

  def check_errors():
    if errors:
      raise RuntimeError('the reference logged an error (it would have '
                         'carried on without the step): ' + errors[0])

  class Run(DaFKD):
    """The reference's DaFKD driver with the library's client sample and
    read-only probes."""

    def _client_sampling(self, round_idx, client_num_in_total,
                         client_num_per_round):
      self.client_indexes = [int(i) for i in arrays['schedule'][round_idx]]

    def _aggregate(self, w_locals, round_idx):
      check_errors()
      return super()._aggregate(w_locals, round_idx)

    def _local_test_on_all_clients(self, round_idx):
      super()._local_test_on_all_clients(round_idx)
      check_errors()
      seconds = time.perf_counter() - state['start'] - state['excluded']
      model = copy.deepcopy(self.model_trainer.model_d)
      record = dict(
          round=round_idx + 1, test_accuracy=self.test_acc[-1],
          train_accuracy=self.train_acc[-1], seconds=seconds,
          val_accuracy=excluded(lambda: _accuracy(model, arrays['val'])),
          bn_recalibrated_test_accuracy=excluded(lambda: _accuracy(
              _recalibrated(model, arrays['val']), arrays['test'])),
          client_lr_reductions=reductions[0],
          server_lr_reductions=reductions[1],
          clients=list(self.client_indexes))
      record.update(state['links'])
      records.append(record)
      with open(flags.out + '.tmp', 'w') as f:
        json.dump(dict(method=flags.method, seed=flags.seed,
                       client_plateau=flags.client_plateau,
                       args=vars(args), rounds=records), f)
      os.replace(flags.out + '.tmp', flags.out)
      print(f'round {round_idx + 1}: test {self.test_acc[-1]:.4f} '
            f'({seconds:.1f} s)', flush=True)
      state.update(start=time.perf_counter(), excluded=0.0, links={},
                   clients={})

  original_train = MyModelTrainer.train

  def train_and_probe(self, train_data, device, args_, round_idx):
    original_train(self, train_data, device, args_, round_idx)
    if flags.method != 'dafkd':
      return

    def probe():
      logits, scores = _train_mode_outputs(self.model_d, arrays['val'])
      state['clients'][self.id] = (logits, scores)
    excluded(probe)

  MyModelTrainer.train = train_and_probe

  original_distill = MyModelTrainer.weighted_ensemble_distillation

  def distill_and_probe(self, args_, device, pool, client_indexes, model_dict,
                        pd_dict, round_idx, test_global, pd_dict_t,
                        avg_params):
    def before():
      m = copy.deepcopy(self.model_d)
      m.sharedlayer.load_state_dict(avg_params[0])
      m.classify.load_state_dict(avg_params[1])
      return dict(avg_test_accuracy=_accuracy(m, arrays['test']),
                  avg_val_accuracy=_accuracy(m, arrays['val']),
                  avg_bn_recalibrated_test_accuracy=_accuracy(
                      _recalibrated(m, arrays['val']), arrays['test']))
    links = excluded(before)
    state['in_distill'] = True
    out = original_distill(self, args_, device, pool, client_indexes,
                           model_dict, pd_dict, round_idx, test_global,
                           pd_dict_t, avg_params)
    state['in_distill'] = False

    def after():
      m = copy.deepcopy(self.model_d)
      m.sharedlayer.load_state_dict(out[0])
      m.classify.load_state_dict(out[1])
      links.update(student_test_accuracy=_accuracy(m, arrays['test']),
                   student_val_accuracy=_accuracy(m, arrays['val']))
      ids = [int(i) for i in client_indexes]
      logits = np.stack([state['clients'][i][0] for i in ids])
      scores = np.stack([state['clients'][i][1] for i in ids])
      links.update(weight_links(logits, scores, arrays['val_y'],
                                arrays['label_counts'][ids]))
      links['disc_score_real'] = float(scores.mean())
      # The reference's own target on its pool: weighted logits, softmax.
      target = np.concatenate([
          self.get_pd_log(client_indexes, device, x, model_dict, pd_dict,
                          i).numpy() for i, (x, _) in enumerate(pool)])
      hist = np.bincount(target.argmax(-1), minlength=10) / len(target)
      # Samples whose scores all underflow to 0: the reference's division
      # fails, its `except` sets every weight to 0 and the target is uniform.
      alpha = np.array([[w for batch in pd_dict[i] for w in batch]
                        for i in ids])
      links['pool_zero_weight_fraction'] = float(
          np.mean(alpha.sum(0) == 0))
      links.update(pool_class_hist=hist.tolist(),
                   pool_class_entropy=_entropy(hist),
                   pool_top_class_share=float(hist.max()),
                   disc_score_pool=float(np.mean(
                       [np.mean(pd_dict_raw[i]) for i in ids])))
    pd_dict_raw = state.get('pd_raw', {})
    excluded(after)
    state['links'] = links
    return out

  MyModelTrainer.weighted_ensemble_distillation = distill_and_probe

  original_density = MyModelTrainer.get_probability_density

  def density(self, data, device):
    out = original_density(self, data, device)
    if data is state.get('pool'):
      state.setdefault('pd_raw', {})[self.id] = [
          float(t.mean()) for t in out]
    return out

  MyModelTrainer.get_probability_density = density
  original_share = MyModelTrainer.get_distillation_share_data

  def share(self, noise, device):
    pool = original_share(self, noise, device)
    state['pool'] = pool
    state['pd_raw'] = {}
    return pool

  MyModelTrainer.get_distillation_share_data = share

  run = Run(dataset, torch.device('cpu'), args, trainer)
  run.train()
  check_errors()
  if len(records) != flags.rounds:
    raise RuntimeError(f'{len(records)} rounds recorded of {flags.rounds}')


if __name__ == '__main__':
  main()
