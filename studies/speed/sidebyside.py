r"""Side by side: the FedGen PyTorch reference and tff_kd on identical work.

The workload is the FedGen reference's MNIST example (shared
REFERENCE_NOTES, "A speed and accuracy anchor"): 20 users, Dir(0.1), 1,500
training samples per class, 10 users per round doing 20 SGD steps of batch
32 (lr 0.01 * 0.99**round), the 26k-parameter CNN, evaluation every round.
tff_kd runs it as `studies/speed/fedgen_workload.py --pure_tf_rounds=0`
(`configs/fedgen_mnist.py`); the reference runs its own `main.py`.

Runs alternate (reference, ours, reference, ours, ...; `--pairs` of them),
each one a separate process timed as a whole from here. Per-round times:

* ours: what `fedgen_workload.py` records in its JSON (`round_times`:
  `process.next`, evaluation, checkpoint, and the wall time from one round's
  start to the next);
* the reference prints no per-round times, so it runs under a small wrapper
  (written to a temporary folder, run with `--reference_python`) that wraps
  its server's and users' methods with timers before calling its `main.py`:
  round start (`select_users`), evaluation (`evaluate`), local training
  (each user's `train`), the generator (`train_generator`, FedGen),
  aggregation (`aggregate_parameters`) and broadcast (`send_parameters`).
  The reference checkout is never modified: it runs from a work folder
  (`--reference_work_dir`) holding links to its code and the generated data.

Reported per side, per run: seconds per round (train + eval, mean over
rounds 2..N-1: round 1 traces / warms up and ours checkpoints in round N),
the same for the full round wall time, the medians of training and
evaluation, the first round, start-up + teardown (process wall time minus
the sum of the rounds' wall times), final accuracy, and ours/reference
ratios of the means over runs. Output: a JSON file and a Markdown table.

Accuracy semantics differ (see studies/speed/README.md): the reference
evaluates, at the *start* of every round, each user's model (global
parameters, the user's own BatchNorm statistics) on the user's own test
slice; its last recorded accuracy is therefore that of the model after N-1
rounds. The wrapper adds one evaluation after the last round (timed and
subtracted from start-up + teardown). Ours: the global model after each
round, on the whole test set and on the union of the users' slices.

The reference needs its data in its own format (`data/Mnist/
u20c10-alpha0.1-ratio0.5/{train,test}/*.pt`, made by its
`data/Mnist/generate_niid_dirichlet.py`, which downloads MNIST through
torchvision). `--prepare_reference_data` runs that very script with the
reference python, but with a stand-in for `torchvision.datasets.MNIST` that
reads the raw IDX files of `--manual_dir`, writing into the work folder.

Nothing is installed: `--reference_python` must have torch (and numpy,
h5py, tqdm, matplotlib, scipy, which the reference imports). If
`torchvision` cannot be imported there (e.g. a CUDA build of it next to a
CPU torch), a stub stands in for it: on this workload the reference uses
torchvision only for the data download and for image dumps it never makes
(its generator is in feature space).

Usage:
  .venv/bin/python -m studies.speed.sidebyside \
      --reference_dir=/tmp/fedgen_ref --reference_python=/tmp/refvenv/bin/python \
      --manual_dir=../shared/data/mnist --prepare_reference_data \
      --method=fedavg --rounds=20 --pairs=2 --out=/tmp/sidebyside_fedavg
"""

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

from absl import app
from absl import flags

from studies import common

_REFERENCE_DIR = flags.DEFINE_string(
    'reference_dir', None, 'A checkout of github.com/zhuangdizhu/FedGen.')
_REFERENCE_PYTHON = flags.DEFINE_string(
    'reference_python', None, 'A python interpreter that has torch.')
_REFERENCE_WORK_DIR = flags.DEFINE_string(
    'reference_work_dir', os.path.join(tempfile.gettempdir(),
                                       'tff_kd_sidebyside_reference'),
    'Folder the reference runs in: links to its code, its generated data, '
    'its results/ and models/ outputs. Never the checkout itself.')
_PREPARE = flags.DEFINE_bool(
    'prepare_reference_data', False,
    "(Re)generate the reference's MNIST split in --reference_work_dir from "
    'the IDX files in --manual_dir. Without it the data must be there.')
_METHOD = flags.DEFINE_enum('method', 'fedavg', ['fedavg', 'fedgen'],
                            'Method run on both sides.')
_ROUNDS = flags.DEFINE_integer('rounds', 20, 'Rounds per run.')
_PAIRS = flags.DEFINE_integer(
    'pairs', 2, 'Number of (reference, ours) alternations.')
_MANUAL_DIR = flags.DEFINE_string(
    'manual_dir', '../shared/data/mnist',
    'Raw MNIST IDX files (train-images-idx3-ubyte.gz, ...).')
_OUT = flags.DEFINE_string(
    'out', 'studies/speed/results/sidebyside',
    'Output prefix: writes <out>.json and <out>.md.')
_RUNS_DIR = flags.DEFINE_string(
    'runs_dir', '', "Folder for each run's log and JSON (default: a new "
    'folder under the system temp dir, printed).')
_OURS_PYTHON = flags.DEFINE_string(
    'ours_python', sys.executable, 'Python that runs tff_kd.')
_SEED = flags.DEFINE_integer('seed', 0, 'tff_kd seed (the same every run).')
_TIMEOUT = flags.DEFINE_integer('timeout_s', 1800, 'Per-run time limit.')
_REFERENCE_THREADS = flags.DEFINE_integer(
    'reference_threads', 0,
    'torch.set_num_threads for the reference (0: torch\'s default, the '
    'number of cores).')
_RESUMMARISE = flags.DEFINE_string(
    'resummarise', '', 'Recompute the summaries and ratios of an existing '
    '<out>.json from its stored per-round times, rewrite <out>.json and '
    '<out>.md (--out), and run nothing.')
_NOTE = flags.DEFINE_string(
    'note', '', 'Text added to the Markdown (e.g. what ran beside it); '
    'works with --resummarise too.')
_OURS_FLAGS = flags.DEFINE_list(
    'ours_flags', [], 'Further flags of our side\'s fedgen_workload.py, '
    'e.g. --ours_flags=--clients_per_call=5,--fuse_clients.')
_SKIP = flags.DEFINE_list(
    'skip', [], "Sides not to run: 'reference' or 'ours' (for checking the "
    'harness).')

_DATASET = 'Mnist-alpha0.1-ratio0.5'
_DATA_SUBDIR = os.path.join('data', 'Mnist', 'u20c10-alpha0.1-ratio0.5')
# The repository root (studies/speed/ is two levels below it).
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# ---------------------------------------------------------------------------
# Scripts run with the reference python (written to a temporary folder).

# A stand-in for torchvision, installed only when the real one cannot be
# imported. `datasets.MNIST` reads the raw IDX files of SBS_MNIST_DIR and
# behaves as torchvision's does for the reference's generate script (uint8
# `data`, int64 `targets`, `classes`; items through `transform`);
# `transforms.ToTensor` / `Normalize` / `Compose` do what torchvision's do
# to a 28x28 uint8 image.
_TORCHVISION_STUB = r'''
import gzip, os, sys, types
import numpy as np


def install_torchvision(force=False):
  """Returns 'real' or 'stub'."""
  if not force:
    try:
      import torchvision  # noqa: F401
      import torchvision.transforms  # noqa: F401
      import torchvision.utils  # noqa: F401
      return 'real'
    except Exception:  # pylint: disable=broad-except
      for name in list(sys.modules):
        if name == 'torchvision' or name.startswith('torchvision.'):
          del sys.modules[name]
  import torch

  def _idx(path):
    with gzip.open(path, 'rb') as f:
      raw = f.read()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], 'big')
                  for i in range(ndim))
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)

  class MNIST(torch.utils.data.Dataset):
    classes = ['0 - zero', '1 - one', '2 - two', '3 - three', '4 - four',
               '5 - five', '6 - six', '7 - seven', '8 - eight', '9 - nine']

    def __init__(self, root=None, train=True, download=False,
                 transform=None, target_transform=None):
      d = os.environ['SBS_MNIST_DIR']
      prefix = 'train' if train else 't10k'
      self.data = torch.from_numpy(
          _idx(os.path.join(d, f'{prefix}-images-idx3-ubyte.gz')).copy())
      self.targets = torch.from_numpy(
          _idx(os.path.join(d, f'{prefix}-labels-idx1-ubyte.gz'))
          .astype(np.int64))
      self.transform = transform
      self.target_transform = target_transform

    def __len__(self):
      return len(self.data)

    def __getitem__(self, i):
      img, target = self.data[i], int(self.targets[i])
      if self.transform is not None:
        img = self.transform(img)
      if self.target_transform is not None:
        target = self.target_transform(target)
      return img, target

  class Compose:
    def __init__(self, fns):
      self.fns = fns

    def __call__(self, x):
      for fn in self.fns:
        x = fn(x)
      return x

  class ToTensor:
    def __call__(self, img):  # uint8 HxW -> float 1xHxW in [0, 1]
      return img.to(torch.float32).div(255.0).unsqueeze(0)

  class Normalize:
    def __init__(self, mean, std):
      self.mean = torch.tensor(mean).view(-1, 1, 1)
      self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, x):
      return (x - self.mean) / self.std

  def save_image(*args, **kwargs):
    raise RuntimeError('torchvision stub: save_image is not available')

  tv = types.ModuleType('torchvision')
  tv.__path__ = []
  tv.__sbs_stub__ = True
  datasets = types.ModuleType('torchvision.datasets')
  datasets.MNIST = MNIST
  transforms = types.ModuleType('torchvision.transforms')
  transforms.Compose, transforms.ToTensor = Compose, ToTensor
  transforms.Normalize = Normalize
  utils = types.ModuleType('torchvision.utils')
  utils.save_image = save_image
  tv.datasets, tv.transforms, tv.utils = datasets, transforms, utils
  sys.modules.update({'torchvision': tv, 'torchvision.datasets': datasets,
                      'torchvision.transforms': transforms,
                      'torchvision.utils': utils})
  return 'stub'
'''

# Runs the reference's own generate script, with MNIST read from IDX files.
_PREPARE_SCRIPT = r'''
import os, runpy, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sbs_torchvision import install_torchvision
install_torchvision(force=True)  # never download: always the IDX reader
script, out_dir = sys.argv[1], sys.argv[2]
os.makedirs(out_dir, exist_ok=True)
os.chdir(out_dir)  # the script writes ./u20c10-alpha0.1-ratio0.5/...
sys.argv = [script, '--format', 'pt', '--n_class', '10',
            '--sampling_ratio', '0.5', '--alpha', '0.1', '--n_user', '20']
runpy.run_path(script, run_name='__main__')
'''

# Runs the reference's main.py with timers around its server's and users'
# methods; writes the records as JSON to SBS_RECORD.
_TIMED_SCRIPT = r'''
import time
T_START = time.perf_counter()
import json, os, runpy, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sbs_torchvision import install_torchvision
work_dir, record_path = os.environ['SBS_WORK_DIR'], os.environ['SBS_RECORD']
os.chdir(work_dir)
sys.path.insert(0, work_dir)
torchvision = install_torchvision()
import torch
if int(os.environ.get('SBS_TORCH_THREADS', '0')) > 0:
  torch.set_num_threads(int(os.environ['SBS_TORCH_THREADS']))
from FLAlgorithms.servers import serverbase, serveravg, serverpFedGen
from FLAlgorithms.users import useravg, userpFedGen
T_IMPORTED = time.perf_counter()

rec = dict(torchvision=torchvision, torch=torch.__version__,
           torch_threads=torch.get_num_threads(), rounds=[], init_s=[],
           imports_s=T_IMPORTED - T_START)
cur = {}


def _new_round():
  cur.clear()
  cur.update(start=time.perf_counter(), train_s=0.0, eval_s=0.0,
             generator_s=0.0, aggregate_s=0.0, broadcast_s=0.0, acc=None)
  rec['rounds'].append(cur.copy())


def _timed(cls, name, key):
  fn = getattr(cls, name)

  def wrapper(self, *args, **kwargs):
    t0 = time.perf_counter()
    try:
      return fn(self, *args, **kwargs)
    finally:
      if rec['rounds']:
        rec['rounds'][-1][key] += time.perf_counter() - t0
  setattr(cls, name, wrapper)


Server = serverbase.Server
_select = Server.select_users


def select_users(self, *args, **kwargs):
  _new_round()
  return _select(self, *args, **kwargs)


Server.select_users = select_users
_evaluate = Server.evaluate


def evaluate(self, *args, **kwargs):
  t0 = time.perf_counter()
  out = _evaluate(self, *args, **kwargs)
  if rec['rounds'] and not rec.get('finishing'):
    r = rec['rounds'][-1]
    r['eval_s'] += time.perf_counter() - t0
    r['acc'] = float(self.metrics['glob_acc'][-1])
  return out


Server.evaluate = evaluate
_timed(Server, 'aggregate_parameters', 'aggregate_s')
_timed(Server, 'send_parameters', 'broadcast_s')
_timed(useravg.UserAVG, 'train', 'train_s')
_timed(userpFedGen.UserpFedGen, 'train', 'train_s')
_timed(serverpFedGen.FedGen, 'train_generator', 'generator_s')
for cls in (serveravg.FedAvg, serverpFedGen.FedGen):
  def _init(self, *args, _fn=cls.__init__, **kwargs):
    t0 = time.perf_counter()
    _fn(self, *args, **kwargs)
    rec['init_s'].append(time.perf_counter() - t0)
  cls.__init__ = _init
_save_results = Server.save_results


def save_results(self, *args, **kwargs):
  # Called once, right after the last round: the end of the round loop.
  rec['rounds_end'] = time.perf_counter()
  # The accuracy after the last round, which the reference never records
  # (it evaluates at the start of each round): timed apart.
  rec['finishing'] = True
  t0 = time.perf_counter()
  self.send_parameters(mode=self.mode)
  ids, samples, correct, losses = self.test()
  rec['final_acc'] = float(sum(correct) / sum(samples))
  rec['final_eval_s'] = time.perf_counter() - t0
  return _save_results(self, *args, **kwargs)


Server.save_results = save_results
sys.argv = ['main.py'] + sys.argv[1:]
try:
  runpy.run_path(os.path.join(work_dir, 'main.py'), run_name='__main__')
finally:
  rec['main_end'] = time.perf_counter()
  rec['t_start'] = T_START
  with open(record_path, 'w') as f:
    json.dump(rec, f)
'''

# ---------------------------------------------------------------------------


def _write_scripts(folder: str) -> dict[str, str]:
  paths = {}
  for name, text in (('sbs_torchvision.py', _TORCHVISION_STUB),
                     ('sbs_prepare.py', _PREPARE_SCRIPT),
                     ('sbs_timed.py', _TIMED_SCRIPT)):
    paths[name] = os.path.join(folder, name)
    with open(paths[name], 'w') as f:
      f.write(text)
  return paths


def _link_reference(reference_dir: str, work_dir: str) -> None:
  """Links the reference's code into work_dir (its data/ stays separate)."""
  os.makedirs(work_dir, exist_ok=True)
  for name in os.listdir(reference_dir):
    if name in ('data', '.git', 'results', 'models', 'images'):
      continue
    link = os.path.join(work_dir, name)
    if os.path.islink(link):
      os.remove(link)
    if not os.path.exists(link):
      os.symlink(os.path.join(reference_dir, name), link)


def prepare_reference_data(reference_dir: str, reference_python: str,
                           manual_dir: str, work_dir: str,
                           scripts: dict[str, str]) -> dict[str, Any]:
  """Writes the reference's MNIST split into work_dir/data/Mnist/...

  Runs the reference's own `data/Mnist/generate_niid_dirichlet.py`
  (seeded: random.seed(42), np.random.seed(42); 20 users, Dir(0.1),
  sampling ratio 0.5, i.e. 1,500 training images per class), reading MNIST
  from the IDX files in manual_dir instead of downloading it.

  Returns:
    The per-user training sizes it printed, and the seconds it took.
  """
  _link_reference(reference_dir, work_dir)
  out_dir = os.path.join(work_dir, 'data', 'Mnist')
  script = os.path.join(reference_dir, 'data', 'Mnist',
                        'generate_niid_dirichlet.py')
  env = dict(os.environ, SBS_MNIST_DIR=os.path.abspath(manual_dir))
  t0 = time.perf_counter()
  proc = subprocess.run(
      [reference_python, scripts['sbs_prepare.py'], script, out_dir],
      env=env, capture_output=True, text=True, check=False,
      cwd=os.path.dirname(scripts['sbs_prepare.py']))
  seconds = time.perf_counter() - t0
  if proc.returncode:
    raise RuntimeError('reference data generation failed:\n' +
                       proc.stdout[-3000:] + proc.stderr[-3000:])
  sizes = None
  for line in proc.stdout.splitlines():
    if line.startswith('TRAIN #sample by user:'):
      sizes = json.loads(line.split(':', 1)[1])
  return dict(train_sizes=sizes, seconds=seconds,
              folder=os.path.join(work_dir, _DATA_SUBDIR))


def _reference_args(method: str, rounds: int) -> list[str]:
  """The reference README's MNIST command, one run (`--times 1`)."""
  return ['--dataset', _DATASET,
          '--algorithm', 'FedAvg' if method == 'fedavg' else 'FedGen',
          '--batch_size', '32', '--num_glob_iters', str(rounds),
          '--local_epochs', '20', '--num_users', '10', '--lamda', '1',
          '--learning_rate', '0.01', '--model', 'cnn',
          '--personal_learning_rate', '0.01', '--times', '1']


def _children_of(pid: int) -> list[int]:
  """Direct children of pid, whichever of its threads started them."""
  out = []
  try:
    tasks = os.listdir(f'/proc/{pid}/task')
  except OSError:
    return out
  for task in tasks:
    try:
      with open(f'/proc/{pid}/task/{task}/children') as f:
        out += [int(p) for p in f.read().split()]
    except OSError:
      pass
  return out


def _cmdline(pid: int) -> str:
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      return f.read().replace(b'\0', b' ').decode(errors='replace')
  except OSError:
    return ''


def _busy_cpu_s() -> Optional[float]:
  """Seconds of CPU time the whole machine has been busy (/proc/stat)."""
  try:
    with open('/proc/stat') as f:
      fields = [int(v) for v in f.readline().split()[1:9]]
  except (OSError, ValueError):
    return None
  user, nice, system, _, _, irq, softirq, steal = fields
  return (user + nice + system + irq + softirq + steal) / os.sysconf(
      'SC_CLK_TCK')


def _own_cpu_s() -> float:
  """CPU seconds of this process and of its waited-for descendants."""
  me = resource.getrusage(resource.RUSAGE_SELF)
  kids = resource.getrusage(resource.RUSAGE_CHILDREN)
  return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _run_process(cmd: list[str], log_path: str, **kwargs) -> dict[str, Any]:
  """Runs cmd to completion, timing it as a whole.

  Its children (TFF's `worker_binary`) are noted while it runs; any of them
  still alive once it has exited is killed (only those: never by name), and
  counted in `leftover_children`.
  """
  children = set()
  busy0, own0 = _busy_cpu_s(), _own_cpu_s()
  with open(log_path, 'w') as log:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            **kwargs)
    while True:
      try:
        rc = proc.wait(timeout=0.5)
        break
      except subprocess.TimeoutExpired:
        children.update((c, _cmdline(c)) for c in _children_of(proc.pid))
        if time.perf_counter() - t0 > _TIMEOUT.value:
          proc.kill()
    wall = time.perf_counter() - t0
  busy1, own1 = _busy_cpu_s(), _own_cpu_s()
  # Cores kept busy by *other* processes while this run ran (the machine's
  # busy CPU time minus this run's own; a worker_binary that outlived its
  # parent would count as "other").
  others = (None if busy0 is None else
            max(0.0, (busy1 - busy0) - (own1 - own0)) / wall)
  leftovers = []
  for pid, cmdline in children:
    if cmdline and _cmdline(pid) == cmdline:  # Same process, still alive.
      try:
        os.kill(pid, 9)
        leftovers.append(cmdline[:200])
      except OSError:
        pass
  return dict(returncode=rc, wall_s=wall, log=log_path,
              cpu_s=own1 - own0, other_processes_cores=others,
              children_seen=len(children), leftover_children=leftovers)


def _mean(values: list) -> Optional[float]:
  values = [v for v in values if v is not None]
  return statistics.fmean(values) if values else None


def _median(values: list) -> Optional[float]:
  values = [v for v in values if v is not None]
  return statistics.median(values) if values else None


def _summarise(rounds: list[dict], process_wall: float, imports_s,
               final_acc, extra_excluded_s: float = 0.0) -> dict[str, Any]:
  """Common per-run numbers from per-round dicts with train_s, eval_s and
  wall_s."""
  steady = rounds[1:-1] if len(rounds) > 2 else []
  rounds_wall = sum(r['wall_s'] for r in rounds)
  walls = sorted(r['wall_s'] for r in steady)
  return dict(
      rounds=len(rounds),
      per_round_train_eval_mean=_mean([r['train_s'] + r['eval_s']
                                       for r in steady]),
      per_round_train_eval_median=_median([r['train_s'] + r['eval_s']
                                           for r in steady]),
      per_round_wall_mean=_mean([r['wall_s'] for r in steady]),
      per_round_wall_median=_median(walls),
      per_round_wall_p90=(walls[min(len(walls) - 1, int(0.9 * len(walls)))]
                          if walls else None),
      train_median=_median([r['train_s'] for r in steady]),
      eval_median=_median([r['eval_s'] for r in steady]),
      first_round_wall=rounds[0]['wall_s'] if rounds else None,
      first_round_train_eval=(rounds[0]['train_s'] + rounds[0]['eval_s']
                              if rounds else None),
      last_round_wall=rounds[-1]['wall_s'] if rounds else None,
      process_wall=process_wall,
      startup_teardown=process_wall - rounds_wall - extra_excluded_s,
      imports_s=imports_s,
      final_accuracy=final_acc,
  )


def run_reference(method: str, rounds: int, work_dir: str, python: str,
                  scripts: dict[str, str], run_dir: str,
                  index: int) -> dict[str, Any]:
  record = os.path.join(run_dir, f'reference_{index}.json')
  if os.path.exists(record):
    os.remove(record)
  env = dict(os.environ, SBS_WORK_DIR=work_dir, SBS_RECORD=record,
             SBS_TORCH_THREADS=str(_REFERENCE_THREADS.value),
             PYTHONUNBUFFERED='1')
  proc = _run_process(
      [python, scripts['sbs_timed.py']] + _reference_args(method, rounds),
      os.path.join(run_dir, f'reference_{index}.log'), env=env,
      cwd=os.path.dirname(scripts['sbs_timed.py']))
  if proc['returncode'] or not os.path.exists(record):
    raise RuntimeError(f"reference run failed (rc {proc['returncode']}); "
                       f"see {proc['log']}")
  with open(record) as f:
    rec = json.load(f)
  starts = [r['start'] for r in rec['rounds']]
  ends = starts[1:] + [rec['rounds_end']]
  per_round = []
  for r, end in zip(rec['rounds'], ends):
    # "train": the work TFF's process.next does (broadcast, local
    # training, generator, aggregation); "eval": the per-user evaluation.
    per_round.append(dict(
        train_s=(r['train_s'] + r['generator_s'] + r['aggregate_s'] +
                 r['broadcast_s']),
        local_training_s=r['train_s'], generator_s=r['generator_s'],
        aggregate_s=r['aggregate_s'], broadcast_s=r['broadcast_s'],
        eval_s=r['eval_s'], wall_s=end - r['start'], acc=r['acc']))
  summary = _summarise(per_round, proc['wall_s'], rec['imports_s'],
                       rec.get('final_acc'),
                       extra_excluded_s=rec.get('final_eval_s', 0.0))
  summary.update(
      side='reference', process=proc, torchvision=rec['torchvision'],
      torch=rec['torch'], torch_threads=rec['torch_threads'],
      server_init_s=rec['init_s'][0] if rec['init_s'] else None,
      final_eval_s=rec.get('final_eval_s'),
      local_training_median=_median([r['local_training_s']
                                     for r in per_round[1:-1]]),
      generator_median=_median([r['generator_s'] for r in per_round[1:-1]]),
      accuracy_recorded_last=per_round[-1]['acc'] if per_round else None,
      accuracy_at_20=(per_round[20]['acc'] if len(per_round) > 20 else
                      (rec.get('final_acc') if len(per_round) == 20 else
                       None)),
      per_round=per_round)
  return summary


def run_ours(method: str, rounds: int, seed: int, manual_dir: str,
             python: str, run_dir: str, index: int) -> dict[str, Any]:
  out = os.path.join(run_dir, f'ours_{index}.json')
  if os.path.exists(out):
    os.remove(out)
  cmd = [python, '-m', 'studies.speed.fedgen_workload',
         f'--manual_dir={os.path.abspath(manual_dir)}', f'--rounds={rounds}',
         f'--seeds={seed}', '--pure_tf_rounds=0', f'--method={method}',
         f'--out={out}', *_OURS_FLAGS.value]
  proc = _run_process(cmd, os.path.join(run_dir, f'ours_{index}.log'),
                      cwd=_REPO, env=dict(os.environ, PYTHONUNBUFFERED='1'))
  if proc['returncode'] or not os.path.exists(out):
    raise RuntimeError(f"tff_kd run failed (rc {proc['returncode']}); see "
                       f"{proc['log']}")
  with open(out) as f:
    run = json.load(f)['runs'][0]
  per_round = [dict(train_s=r['train_s'], eval_s=r['eval_s'] or 0.0,
                    checkpoint_s=r['checkpoint_s'], wall_s=r['wall_s'])
               for r in run['round_times']]
  curve = run['curve']  # (round, whole test set, slices)
  summary = _summarise(per_round, proc['wall_s'], run.get('imports_s'),
                       curve[-1][2] if curve else None)
  summary.update(
      side='ours', process=proc, command=' '.join(cmd),
      final_accuracy_whole_test=curve[-1][1] if curve else None,
      accuracy_at_20=curve[19][2] if len(curve) >= 20 else None,
      context_s=run.get('context_s'), prepare_s=run.get('prepare_s'),
      run_outside_rounds_s=run.get('run_outside_rounds_s'),
      per_round=per_round)
  return summary


_ROWS = (
    ('per round, train + eval (mean, rounds 2..N-1)',
     'per_round_train_eval_mean'),
    ('per round, train + eval (median, rounds 2..N-1)',
     'per_round_train_eval_median'),
    ('per round, full wall (mean, rounds 2..N-1)', 'per_round_wall_mean'),
    ('per round, full wall (median, rounds 2..N-1)',
     'per_round_wall_median'),
    ('per round, full wall (p90, rounds 2..N-1)', 'per_round_wall_p90'),
    ('of which training (median)', 'train_median'),
    ('of which evaluation (median)', 'eval_median'),
    ('first round, full wall', 'first_round_wall'),
    ('first round, train + eval', 'first_round_train_eval'),
    ('start-up + teardown (process wall minus rounds)', 'startup_teardown'),
    ('of which imports', 'imports_s'),
    ('process wall', 'process_wall'),
    ('final accuracy (users\' slices)', 'final_accuracy'),
)


def _fmt(v, key):
  if v is None:
    return '-'
  return f'{100 * v:.2f}%' if 'accuracy' in key else f'{v:.3f} s'


def markdown(result: dict[str, Any]) -> str:
  ref = [r for r in result['runs'] if r['side'] == 'reference']
  ours = [r for r in result['runs'] if r['side'] == 'ours']
  lines = [
      f"# Side by side: FedGen PyTorch reference vs tff_kd, "
      f"{result['method']}, {result['rounds']} rounds",
      '',
      'Command:',
      '',
      f"    {result['command']}",
      '',
      f"Machine: {result['machine']}. {result['note']}",
      '',
  ] + ([result['extra_note'], ''] if result.get('extra_note') else []) + [
      '| | reference (per run) | tff_kd (per run) | ratio ours/reference: '
      'of the means over runs / of the medians over runs |',
      '|---|---|---|---|',
  ]
  for label, key in _ROWS:
    a = ' / '.join(_fmt(r[key], key) for r in ref)
    b = ' / '.join(_fmt(r[key], key) for r in ours)
    ratio = result['ratios'].get(key)
    ratio_m = result.get('ratios_median_of_runs', {}).get(key)
    lines.append(f"| {label} | {a} | {b} | "
                 f"{'-' if ratio is None else f'{ratio:.2f}'} / "
                 f"{'-' if ratio_m is None else f'{ratio_m:.2f}'} |")
  lines += ['', 'Full wall time of every round (s), per run, in run order '
            "(and the cores other processes kept busy during the run, where "
            'measured):', '']
  for r in result['runs']:
    others = r['process'].get('other_processes_cores')
    lines.append(f"* {r['side']}" + (
        '' if others is None else f' (others: {others:.2f} cores)') + ': ' +
        ' '.join(f"{x['wall_s']:.2f}" for x in r['per_round']))
  lines += [
      '',
      'Run order: ' + ', '.join(r['side'] for r in result['runs']) + '.',
      '',
      'Definitions. Reference "training" = broadcast + the users\' local '
      'training + generator (FedGen) + aggregation, i.e. the work of '
      "tff_kd's `process.next`; its evaluation runs at the start of each "
      'round (per-user BatchNorm statistics, the users\' 5,307 slice '
      "images); its final accuracy is from one extra evaluation after the "
      'last round, made by the timing wrapper and left out of its '
      'start-up + teardown. tff_kd "training" = `process.next`; evaluation = '
      'the global model on the whole test set (10,000) and on the users\' '
      'slices (5,307); its last round also checkpoints (one reason rounds '
      '2..N-1 are averaged). "Full wall" = from one round\'s start to the '
      'next one\'s (sampling, metric release and logging included). '
      'Start-up + teardown = process wall time (measured by the harness) '
      'minus the sum of the rounds\' full wall times.',
  ]
  return '\n'.join(lines) + '\n'


def _resummarise(path: str) -> dict[str, Any]:
  with open(path) as f:
    result = json.load(f)
  for run in result['runs']:
    excluded = (run.get('final_eval_s') or 0.0) if run['side'] == (
        'reference') else 0.0
    run.update(_summarise(run['per_round'], run['process']['wall_s'],
                          run.get('imports_s'), run.get('final_accuracy'),
                          extra_excluded_s=excluded))
  result['ratios'] = _ratios(result['runs'])
  result['ratios_median_of_runs'] = _ratios(result['runs'], _median)
  return result


def _ratios(runs: list[dict[str, Any]], average=_mean) -> dict[str, float]:
  """ours / reference of each row's `average` over each side's runs."""
  ratios = {}
  for _, key in _ROWS:
    a = average([r[key] for r in runs if r['side'] == 'reference'])
    b = average([r[key] for r in runs if r['side'] == 'ours'])
    if a and b is not None and 'accuracy' not in key:
      ratios[key] = b / a
  return ratios


def _write(result: dict[str, Any], out: str) -> None:
  print(common.write_result(out, result, markdown, indent=1))


def main(argv):
  del argv
  if _RESUMMARISE.value:
    result = _resummarise(_RESUMMARISE.value)
    if _NOTE.value:
      result['extra_note'] = _NOTE.value
    _write(result, _OUT.value)
    return
  sides = {'reference', 'ours'} - set(_SKIP.value)
  if 'reference' in sides and not (_REFERENCE_DIR.value and
                                   _REFERENCE_PYTHON.value):
    raise app.UsageError('--reference_dir and --reference_python are needed '
                         "(or --skip=reference)")
  out = _OUT.value
  run_dir = _RUNS_DIR.value or tempfile.mkdtemp(prefix='sidebyside_runs_')
  os.makedirs(run_dir, exist_ok=True)
  print('run logs in', run_dir, flush=True)
  result = dict(
      command=common.command('speed.sidebyside'),
      machine=f'{common.machine()}, {platform.platform()}',
      note=('Timed on a shared 2-core machine (other jobs, e.g. tests, '
            'may have run at the same time): compare the ratios taken '
            'within this alternated run, not absolute numbers across runs.'),
      method=_METHOD.value, rounds=_ROUNDS.value, pairs=_PAIRS.value,
      runs=[])
  if _NOTE.value:
    result['extra_note'] = _NOTE.value
  with tempfile.TemporaryDirectory(prefix='sbs_scripts_') as tmp:
    scripts = _write_scripts(tmp)
    work_dir = _REFERENCE_WORK_DIR.value
    if 'reference' in sides:
      ref_dir = os.path.abspath(_REFERENCE_DIR.value)
      if os.path.realpath(work_dir).startswith(os.path.realpath(ref_dir)):
        raise app.UsageError('--reference_work_dir must be outside the '
                             'reference checkout')
      if _PREPARE.value:
        prep = prepare_reference_data(ref_dir, _REFERENCE_PYTHON.value,
                                      _MANUAL_DIR.value, work_dir, scripts)
        result['reference_data'] = prep
        print('reference data:', json.dumps(prep), flush=True)
      _link_reference(ref_dir, work_dir)
      if not os.path.isdir(os.path.join(work_dir, _DATA_SUBDIR, 'train')):
        raise app.UsageError(
            f'no reference data in {work_dir}: pass --prepare_reference_data')
      result['reference_git'] = _git_head(ref_dir)
    for i in range(_PAIRS.value):
      if 'reference' in sides:
        r = run_reference(_METHOD.value, _ROUNDS.value, work_dir,
                          _REFERENCE_PYTHON.value, scripts, run_dir, i)
        result['runs'].append(r)
        _print_run(r)
      if 'ours' in sides:
        r = run_ours(_METHOD.value, _ROUNDS.value, _SEED.value,
                     _MANUAL_DIR.value, _OURS_PYTHON.value, run_dir, i)
        result['runs'].append(r)
        _print_run(r)
  result['ratios'] = _ratios(result['runs'])
  result['ratios_median_of_runs'] = _ratios(result['runs'], _median)
  _write(result, out)


def _git_head(path: str) -> Optional[str]:
  try:
    return subprocess.run(['git', '-C', path, 'rev-parse', 'HEAD'],
                          capture_output=True, text=True,
                          check=True).stdout.strip() or None
  except (OSError, subprocess.CalledProcessError):
    return None


def _print_run(r: dict[str, Any]) -> None:
  print(r['side'], json.dumps({k: (round(v, 4) if isinstance(v, float)
                                   else v)
                               for k, v in r.items()
                               if k not in ('per_round', 'process')}),
        flush=True)


if __name__ == '__main__':
  app.run(main)
