"""Runs the authors' FedGen code (zhuangdizhu/FedGen @ dd5807c) on an
exported split.

Run with the reference's own Python (torch, numpy, h5py, tqdm; no
TensorFlow, no tff_kd) from a work folder that holds a copy of the
reference's files (no patch is needed: see FEDGEN_NOTES.md). It builds
the reference's own server (`serverpFedGen.FedGen` or `serveravg.FedAvg`),
whose constructor builds its own users (`userpFedGen.UserpFedGen` /
`useravg.UserAVG`), its own model (`utils.model_utils.create_model`: the
'cnn' for MNIST) and, for FedGen, its own generator, and calls its own
`train`. What it hands the reference, through the reference's own loader,
constructors and attributes:

* the data: the split `studies/parity/split.py` exported (`--split`), as
  the reference's own data files (`data/Mnist/u20c10-alpha<tag>-ratio<tag>/
  {train,test}/*.pt`, the format of its `generate_niid_dirichlet.py`: one
  user `f_0000k` per library client k, images NCHW in [-1, 1], i.e. its
  ToTensor + Normalize(0.5, 0.5)), read by its own `read_data`; the files
  are removed once the server is built. Users' test data: the FedGen
  recipe's per-user test slices (regime `fedgen`; what the reference's own
  generator script makes) or, in the drift regime, which has none, the test
  set cut into 20 consecutive parts (the union is the whole test set);
* the clients of each round: the library's sample (`schedule` in the
  split) instead of the reference's unseeded `np.random.choice`;
* the seed: `random`, numpy and torch seeded with `--seed` (the reference
  seeds torch with its repetition index and never seeds numpy);
  `torch.set_num_threads(--threads)`; the device: the CPU;
* regime `drift` only (the library's `configs/dafkd_paper_cpu.py`, whose
  local work the reference cannot express): each user's round is
  `--epochs` epochs of its examples in batches of 32, the last partial
  batch kept and reshuffled every epoch (`user.trainloader` with
  drop_last=False and `user.local_epochs` = epochs x batches, so a round
  ends exactly at an epoch boundary: the reference's persistent iterator
  restarts, reshuffled, at every round); the optimiser is Adam (lr
  `--lr`, no weight decay; the reference's own Adam branch has weight
  decay 1e-2) with a fresh state every round, as the library's stateless
  clients, and lr `--lr` x `--lr_decay`^round (the library's schedule,
  constant in that config) instead of the reference's ExponentialLR(0.99);
* regime `fedgen` (the reference's own MNIST setting) keeps the
  reference's own local work: 20 steps of batch 32 from its DataLoader
  (shuffle, drop_last=True, one iterator across rounds), its SGD
  (`pFedIBOptimizer`) at 0.01 with its ExponentialLR(0.99) stepped with
  the round index (so round r >= 1 trains at 0.01 x 0.99^(r - 1)); except
  for a user with fewer than 32 examples (seed 1's split has one of 21),
  to which the reference's drop_last loader gives no batch at all (its
  `get_next_train_batch` raises StopIteration): that user gets the
  library's steps, batches of 32 from endless reshuffled passes
  (`small_users` in the JSON).

Everything else is the reference's: its 'cnn' (no ReLU on the 32-d
feature), its initialisation, its generator (uniform noise, BatchNorm,
linear output), 50 server Adam steps per round (lr 3e-4, weight decay
1e-2, ExponentialLR 0.98), its label counts (+1 per label), its client
regulariser (alpha_t = beta_t = max(1e-4, 10 x 0.98^t), on only the first
`early_stop` = 20 local steps of a round and from round 1), ŷ drawn over
every label of the federation, BatchNorm statistics kept per user (only
parameters are averaged, weighted by each user's number of examples).

Read-only instrumentation, every round, written to `--out` (JSON) as the
round ends (models are deep copies, and the torch, numpy and `random`
generator states are restored after each probe, so the reference's
computation and random streams are untouched):

* `test_accuracy`: the global model on the whole test set, eval mode. The
  reference's server model never gets BatchNorm statistics (it averages
  parameters only), so the global model here is its averaged parameters
  with the round's users' BatchNorm statistics averaged with the same
  weights, as the library does; `slices_accuracy` (regime `fedgen`): the
  same model on the union of the users' test slices;
* `ref_accuracy`: the reference's own metric (`Server.evaluate`) for the
  model after the round: each of the 20 users' models with the global
  parameters and its own BatchNorm statistics on its own test data (the
  reference evaluates at the start of the next round; `glob_acc_start` is
  what it recorded at the start of this one); `server_bn_test_accuracy`:
  the server's own model (initial BatchNorm statistics) on the test set;
* links on a probe set (the server's 500 labeled images in the drift
  regime, the library's labeled set; the first 1,000 test images in the
  fedgen regime): `teacher_probe_accuracy` (mean of the round's user
  models, own BatchNorm statistics), `ensemble_probe_accuracy` (FedGen's
  ensemble: their logits weighted by each user's share of the image's
  true label, the reference's label weights), `avg_probe_accuracy` (the
  global model);
* FedGen: the generator round's losses as the reference prints them
  (`gen_teacher_loss`, `gen_diversity_loss`), and on 512 fresh generated
  features (eval mode, labels uniform over the qualified labels)
  `gen_teacher_accuracy` (the label-weighted ensemble of the round's heads)
  and `gen_global_head_accuracy` (the global model's head); the clients'
  regulariser: `client_gen_ce` (mean CE of the heads on generated
  features) and `client_latent_kl` (mean KL of the latent term) over the
  regularised steps, `alpha_t`, `beta_t`, `regularised_steps` and
  `local_steps` (summed over the round's users);
* `seconds`: the round's wall time (the reference's own start-of-round
  evaluation included, instrumentation excluded).

The reference swallows no exception on this path (its only `except`s end
its batch iterators); any exception ends the run with an error.

Usage (from the work folder, with the reference's python):
  python reference_fedgen.py --split=split.npz --out=rounds.json \
      --method=fedgen --seed=0 --regime=drift
"""

import argparse
import contextlib
import copy
import io
import json
import math
import os
import random
import re
import shutil
import sys
import time
import types

import numpy as np
import torch
from torch import nn

# Per regime: the library config's local work and optimiser.
REGIMES = {
    # configs/dafkd_paper_cpu.py with client_optimizer.weight_decay=0.
    'drift': dict(optimizer='adam', lr=1e-3, lr_decay=1.0, epochs=20,
                  local_steps=None, probe='val'),
    # configs/fedgen_mnist.py: the reference's own MNIST setting.
    'fedgen': dict(optimizer='reference', lr=0.01, lr_decay=0.99, epochs=None,
                   local_steps=20, probe='test1000'),
}


def _stub_torchvision() -> None:
  """The reference imports torchvision (its data script and image dumps,
  neither used here); the study's venv has none."""
  try:
    import torchvision  # pylint: disable=g-import-not-at-top,unused-import
    import torchvision.transforms  # pylint: disable=g-import-not-at-top,unused-import
    import torchvision.utils  # pylint: disable=g-import-not-at-top,unused-import
  except Exception:  # pylint: disable=broad-except
    for name in list(sys.modules):
      if name == 'torchvision' or name.startswith('torchvision.'):
        del sys.modules[name]

    def save_image(*args, **kwargs):
      raise RuntimeError('torchvision stub: save_image is not available')

    tv = types.ModuleType('torchvision')
    tv.__path__ = []
    utils = types.ModuleType('torchvision.utils')
    utils.save_image = save_image
    transforms = types.ModuleType('torchvision.transforms')
    datasets = types.ModuleType('torchvision.datasets')
    tv.utils, tv.transforms, tv.datasets = utils, transforms, datasets
    sys.modules.update({'torchvision': tv, 'torchvision.utils': utils,
                        'torchvision.transforms': transforms,
                        'torchvision.datasets': datasets})


@contextlib.contextmanager
def _rng_preserved():
  """Restores the torch, numpy and `random` states on exit."""
  t, n, r = torch.get_rng_state(), np.random.get_state(), random.getstate()
  try:
    yield
  finally:
    torch.set_rng_state(t)
    np.random.set_state(n)
    random.setstate(r)


def _nchw(x: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(np.transpose(x, (0, 3, 1, 2)), np.float32)


def write_reference_data(split: dict, regime: str, folder: str) -> list:
  """The split as the reference's data files; returns the users' test
  index arrays (into x_test)."""
  offsets = split['part_offsets']
  parts = [split['part_index'][offsets[i]:offsets[i + 1]]
           for i in range(len(offsets) - 1)]
  n = len(parts)
  if regime == 'fedgen':
    so = split['test_slice_offsets']
    if len(so) != n + 1:
      raise ValueError('the split has no per-user test slices (not the '
                       'fedgen partition?)')
    tests = [split['test_slice_index'][so[i]:so[i + 1]] for i in range(n)]
  else:
    tests = np.array_split(np.arange(len(split['y_test'])), n)
  for mode, xs, ys, index in (('train', split['x_train'], split['y_train'],
                               parts),
                              ('test', split['x_test'], split['y_test'],
                               tests)):
    data = {'users': [], 'user_data': {}, 'num_samples': []}
    for k, idx in enumerate(index):
      name = f'f_{k:05d}'
      data['users'].append(name)
      data['user_data'][name] = {
          'x': torch.from_numpy(_nchw(xs[idx])),
          'y': torch.from_numpy(np.asarray(ys[idx], np.int64))}
      data['num_samples'].append(len(idx))
    os.makedirs(os.path.join(folder, mode), exist_ok=True)
    torch.save(data, os.path.join(folder, mode, f'{mode}.pt'))
  return tests


def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
              batch: int = 2000) -> float:
  model.eval()
  correct = 0
  with torch.no_grad():
    for i in range(0, len(y), batch):
      correct += int((model(x[i:i + batch])['output'].argmax(1) ==
                      y[i:i + batch]).sum())
  return correct / max(len(y), 1)


def _logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
  model.eval()
  with torch.no_grad():
    return model(x, logit=True)['logit']


def _bn_modules(model: nn.Module) -> list:
  return [m for m in model.modules()
          if isinstance(m, nn.modules.batchnorm._BatchNorm)]  # pylint: disable=protected-access


def global_model(server, users, weights) -> nn.Module:
  """The server's averaged parameters with the users' BatchNorm statistics
  averaged with `weights` (the reference keeps them per user)."""
  m = copy.deepcopy(server.model)
  for target, *sources in zip(_bn_modules(m),
                              *[_bn_modules(u.model) for u in users]):
    target.running_mean.copy_(sum(w * s.running_mean
                                  for w, s in zip(weights, sources)))
    target.running_var.copy_(sum(w * s.running_var
                                 for w, s in zip(weights, sources)))
  return m


def with_global_parameters(user_model: nn.Module,
                           server_model: nn.Module) -> nn.Module:
  """A copy of a user's model with the global parameters, as the
  reference's `set_parameters` makes it (its BatchNorm statistics stay)."""
  m = copy.deepcopy(user_model)
  with torch.no_grad():
    for p, g in zip(m.parameters(), server_model.parameters()):
      p.copy_(g)
  return m


class _Cycling(torch.utils.data.Sampler):
  """Endless reshuffled passes over n examples (the library's
  `repeat().batch()` order for a steps-unit client)."""

  def __init__(self, n: int):
    super().__init__()
    self.n = n

  def __iter__(self):
    while True:
      yield from torch.randperm(self.n).tolist()


class _Recorder(nn.Module):
  """Wraps one of the reference's loss modules and records the mean of
  its output (read-only: returns the wrapped module's output unchanged)."""

  def __init__(self, inner: nn.Module, sink):
    super().__init__()
    self.inner = inner
    self._sink = sink

  def forward(self, *args, **kwargs):
    out = self.inner(*args, **kwargs)
    self._sink(float(out.detach().mean()))
    return out


_GEN_LINE = re.compile(r'Generator: Teacher Loss= ([-\d.eE+naif]+), Student '
                       r'Loss= ([-\d.eE+naif]+), Diversity Loss = '
                       r'([-\d.eE+naif]+)')


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--split', required=True)
  parser.add_argument('--out', required=True)
  parser.add_argument('--method', choices=('fedgen', 'fedavg'),
                      default='fedgen')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--regime', choices=tuple(REGIMES), default='drift')
  parser.add_argument('--rounds', type=int, default=0,
                      help='0: the split schedule\'s rounds.')
  parser.add_argument('--batch_size', type=int, default=32)
  parser.add_argument('--threads', type=int, default=1)
  # Decomposition switches (defaults: the reference / the regime).
  parser.add_argument('--early_stop', type=int, default=-1,
                      help="The reference's `early_stop` (local steps with "
                      'the regulariser per round); -1: its own 20.')
  parser.add_argument('--features_relu', action='store_true',
                      help="Adds a ReLU on the reference CNN's 32-d "
                      "feature (the library's 'cnn' has one).")
  parser.add_argument('--own_labels', action='store_true',
                      help='Each user draws the generated labels over the '
                      'labels it holds (the library\'s choice) instead of '
                      "the reference's every label of the federation.")
  flags = parser.parse_args()

  torch.set_num_threads(flags.threads)
  _stub_torchvision()
  work = os.getcwd()
  sys.path.insert(0, work)
  from FLAlgorithms.servers.serveravg import FedAvg  # pylint: disable=g-import-not-at-top
  from FLAlgorithms.servers.serverpFedGen import FedGen  # pylint: disable=g-import-not-at-top
  from utils import model_utils  # pylint: disable=g-import-not-at-top

  regime = REGIMES[flags.regime]
  z = np.load(flags.split)
  split = {k: z[k] for k in z.files}
  meta = json.loads(str(split['meta']))
  schedule = np.asarray(split['schedule'], np.int64)
  rounds = flags.rounds or schedule.shape[0]
  tag = f'{flags.regime}{flags.seed}'
  dataset_name = f'Mnist-alpha{tag}-ratio{flags.method}'
  data_dir = os.path.join(work, 'data', 'Mnist',
                          f'u20c10-alpha{tag}-ratio{flags.method}')
  if os.path.exists(data_dir):
    shutil.rmtree(data_dir)
  tests = write_reference_data(split, flags.regime, data_dir)

  random.seed(flags.seed)
  np.random.seed(flags.seed)
  torch.manual_seed(flags.seed)
  algorithm = 'FedGen' if flags.method == 'fedgen' else 'FedAvg'
  args = argparse.Namespace(
      dataset=dataset_name, model='cnn', train=1, algorithm=algorithm,
      batch_size=flags.batch_size, gen_batch_size=32,
      learning_rate=regime['lr'], personal_learning_rate=0.01,
      ensemble_lr=1e-4, beta=1.0, lamda=1, mix_lambda=0.1, embedding=0,
      num_glob_iters=rounds, local_epochs=regime['local_steps'] or 1,
      num_users=schedule.shape[1], K=1, times=1, device='cpu',
      result_path='results')

  model = model_utils.create_model(args.model, args.dataset, args.algorithm)
  if flags.features_relu:
    net = model[0]
    at = len(net.layers) - 1  # Between encode_fc1 and decode_fc2.
    net.layers.insert(at, nn.ReLU())
    net.layer_names.insert(at, 'relu_features')

  records = []
  state = dict(round=-1, start=None, excluded=0.0, gen={}, client_ce=[],
               client_kl=[], in_generator=False, glob_acc_start=None)
  x_test = torch.from_numpy(_nchw(split['x_test']))
  y_test = torch.from_numpy(np.asarray(split['y_test'], np.int64))
  if regime['probe'] == 'val':
    probe_x = torch.from_numpy(_nchw(split['val_x']))
    probe_y = torch.from_numpy(np.asarray(split['val_y'], np.int64))
  else:
    probe_x, probe_y = x_test[:1000], y_test[:1000]
  slices = (np.concatenate(tests) if flags.regime == 'fedgen' else None)

  def excluded(fn):
    t = time.perf_counter()
    try:
      with _rng_preserved():
        return fn()
    finally:
      state['excluded'] += time.perf_counter() - t

  base = FedGen if flags.method == 'fedgen' else FedAvg

  class Run(base):
    """The reference's server with the library's client sample and
    read-only probes at the end of every round."""

    def select_users(self, round, num_users, return_idx=False):  # pylint: disable=redefined-builtin
      state.update(round=round, start=time.perf_counter(), excluded=0.0,
                   gen={}, client_ce=[], client_kl=[], glob_acc_start=None)
      idxs = [int(i) for i in schedule[round]]
      users = [self.users[i] for i in idxs]
      if return_idx:
        return users, np.asarray(idxs)
      return users

    def evaluate(self, save=True, selected=False):
      super().evaluate(save=save, selected=selected)
      if save:
        state['glob_acc_start'] = float(self.metrics['glob_acc'][-1])

    def train_generator(self, *a, **k):
      buf = io.StringIO()
      state['in_generator'] = True
      try:
        with contextlib.redirect_stdout(buf):
          out = super().train_generator(*a, **k)
      finally:
        state['in_generator'] = False
        sys.stdout.write(buf.getvalue())
      found = _GEN_LINE.search(buf.getvalue())
      if not found:
        raise RuntimeError('no generator losses printed: '
                           + buf.getvalue()[-300:])
      state['gen'] = dict(gen_teacher_loss=float(found.group(1)),
                          gen_diversity_loss=float(found.group(3)))
      return out

    def aggregate_parameters(self, partial=False):
      super().aggregate_parameters(partial=partial)
      seconds = time.perf_counter() - state['start'] - state['excluded']
      record = dict(round=state['round'] + 1, seconds=seconds,
                    clients=[int(i) for i in schedule[state['round']]])
      record.update(excluded(lambda: probes(self)))
      record['glob_acc_start'] = state['glob_acc_start']
      record.update(state['gen'])
      record['regularised_steps'] = len(state['client_ce'])
      record['local_steps'] = state.get('steps', 0)
      state['steps'] = 0
      if state['client_ce']:
        record['client_gen_ce'] = float(np.mean(state['client_ce']))
        record['client_latent_kl'] = float(np.mean(state['client_kl']))
      records.append(record)
      dump()
      print(f"round {record['round']}: test {record['test_accuracy']:.4f} "
            f"ref {record['ref_accuracy']:.4f} ({seconds:.1f} s)",
            flush=True)

  def probes(server) -> dict:
    users = list(server.selected_users)
    total = sum(u.train_samples for u in users)
    weights = [u.train_samples / total for u in users]
    g = global_model(server, users, weights)
    out = dict(test_accuracy=_accuracy(g, x_test, y_test),
               server_bn_test_accuracy=_accuracy(
                   copy.deepcopy(server.model), x_test, y_test),
               avg_probe_accuracy=_accuracy(g, probe_x, probe_y))
    if slices is not None:
      idx = torch.from_numpy(slices)
      out['slices_accuracy'] = _accuracy(g, x_test[idx], y_test[idx])
    correct = samples = 0
    for u in server.users:
      m = with_global_parameters(u.model, server.model)
      for x, y in u.testloaderfull:
        correct += int((_logits(m, x).argmax(1) == y).sum())
        samples += len(y)
    out['ref_accuracy'] = correct / samples
    # The round's user models (own parameters and statistics).
    logits = torch.stack([_logits(copy.deepcopy(u.model), probe_x)
                          for u in users])
    out['teacher_probe_accuracy'] = float(
        (logits.argmax(-1) == probe_y).float().mean())
    # FedGen's ensemble with the reference's label weights (its counts
    # over the trained batches, +1 per label).
    counts = np.array([[u.label_counts[c] for c in range(10)]
                       for u in users], np.float64)
    w = torch.from_numpy(counts / counts.sum(0, keepdims=True)).float()
    mixed = (w[:, probe_y, None] * logits).sum(0)
    out['ensemble_probe_accuracy'] = float(
        (mixed.argmax(-1) == probe_y).float().mean())
    if flags.method == 'fedgen':
      label_weights, qualified = server.get_label_weights()
      gen = copy.deepcopy(server.generative_model)
      gen.eval()
      y = torch.from_numpy(np.random.choice(qualified, 512))
      with torch.no_grad():
        z = gen(y, latent_layer_idx=-1)['output']
        heads = torch.stack([copy.deepcopy(u.model)(
            z, start_layer_idx=-1, logit=True)['logit'] for u in users])
        lw = torch.from_numpy(np.asarray(label_weights)[y.numpy()]).float()
        mixed = (lw.T[:, :, None] * heads).sum(0)
        out['gen_teacher_accuracy'] = float(
            (mixed.argmax(-1) == y).float().mean())
        head = g(z, start_layer_idx=-1, logit=True)['logit']
        out['gen_global_head_accuracy'] = float(
            (head.argmax(-1) == y).float().mean())
      r = state['round']
      out['alpha_t'] = max(1e-4, 10 * 0.98 ** r) if r > 0 else 0.0
      out['beta_t'] = out['alpha_t']
    return out

  def dump():
    with open(flags.out + '.tmp', 'w') as f:
      json.dump(dict(method=flags.method, seed=flags.seed,
                     regime=flags.regime, split=os.path.abspath(flags.split),
                     reference_args=vars(args), flags=vars(flags),
                     regime_settings=regime, probe=regime['probe'],
                     small_users=small_users,
                     rounds=records), f)
    os.replace(flags.out + '.tmp', flags.out)

  server = Run(args, model, flags.seed)
  # The data files are read; the reference keeps everything in memory.
  shutil.rmtree(data_dir)
  if len(server.users) != len(tests):
    raise RuntimeError(f'{len(server.users)} users, {len(tests)} clients')
  for k, u in enumerate(server.users):
    if u.id != f'f_{k:05d}':
      raise RuntimeError(f'user {k} is {u.id}')
  small_users = []

  if flags.method == 'fedgen':
    if flags.early_stop >= 0:
      server.early_stop = flags.early_stop

    def record_ce(v):
      if not state['in_generator']:
        state['client_ce'].append(v)
    server.generative_model.crossentropy_loss = _Recorder(
        server.generative_model.crossentropy_loss, record_ce)
    for u in server.users:
      u.ensemble_loss = _Recorder(
          u.ensemble_loss, lambda v: state['client_kl'].append(v))
      if flags.own_labels:
        u.available_labels = np.unique(
            [int(t[1]) for t in u.trainloader.dataset])

  for u in server.users:
    if not regime['epochs'] and u.train_samples < flags.batch_size:
      # The reference's drop_last loader gives such a user no batch at all
      # (its `get_next_train_batch` then raises StopIteration): the
      # library's steps instead, batches of 32 from reshuffled passes.
      u.trainloader = torch.utils.data.DataLoader(
          u.trainloader.dataset, flags.batch_size,
          sampler=_Cycling(u.train_samples))
      u.iter_trainloader = iter(u.trainloader)
      small_users.append(int(u.id[2:]))
    if regime['epochs']:
      # The library's epochs: every example once per epoch, reshuffled,
      # the last partial batch kept.
      u.trainloader = torch.utils.data.DataLoader(
          u.trainloader.dataset, flags.batch_size, shuffle=True,
          drop_last=False)
      u.iter_trainloader = iter(u.trainloader)
      u.local_epochs = regime['epochs'] * math.ceil(
          u.train_samples / flags.batch_size)
    original_train = type(u).train

    def train(self, glob_iter, *a, _train=original_train, **k):
      if regime['optimizer'] == 'adam':
        # The library's client: Adam, no weight decay, fresh state each
        # round, lr * decay^round.
        self.optimizer = torch.optim.Adam(
            self.model.parameters(),
            lr=regime['lr'] * regime['lr_decay'] ** glob_iter,
            betas=(0.9, 0.999), eps=1e-08, weight_decay=0, amsgrad=False)
        self.lr_scheduler = types.SimpleNamespace(step=lambda *_: None)
      state['steps'] = state.get('steps', 0) + self.local_epochs * self.K
      return _train(self, glob_iter, *a, **k)
    u.train = types.MethodType(train, u)

  server.train(args)
  if len(records) != rounds:
    raise RuntimeError(f'{len(records)} rounds recorded of {rounds}')
  print('done', flush=True)


if __name__ == '__main__':
  main()
