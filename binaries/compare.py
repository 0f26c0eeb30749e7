r"""Runs a study: `compare --config=configs/digits.py --methods=fedavg,fedgen --out=runs/study`.

Every entry (each `--methods` name, each `--variant`) runs with every seed
on one config, in process, each run in `<out>/runs/<label>_s<seed>/` as
`train` runs it (checkpoints, metrics.csv, TensorBoard), under one
progress bar; then `<out>/summary.md`, `<out>/summary.csv` and
`<out>/curves.png` compare the entries (mean +- std over seeds, the KD
methods' link diagnostics). Kept short on purpose: the study lives in
`tff_kd.program.compare`, through `tff_kd.program.experiment`.

Running the same command again skips the finished runs, resumes the run it
stopped in from that run's last checkpoint and runs the rest; adding a
method or a seed runs only the new runs. Bad input (an unknown method, a
malformed or unknown variant, a key its method does not read, a bad config
value, seeds that are not integers, a config file that does not load) ends
the program with one line `compare: error: ...` and exit code 2 before any
run starts or any folder is made. Ctrl-C or SIGTERM, a full disk or a bad
data file end it the same way, naming the run; a run whose training fails
(a non-finite loss) is reported in the summary, and the program then ends
with exit code 2 too.
"""

import os
import shlex
import sys
import time

# As in `train`: TensorFlow's C++ start-up chatter stays off the console.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# tff_kd's process set-up (workers that die with the program,
# tensorflow_probability deferred) before TensorFlow Federated is imported,
# and TFF imported before absl runs `main` (see binaries/train.py).
from tff_kd.runtime import context  # pylint: disable=g-import-not-at-top
context.install()
from tff_kd.program import experiment  # pylint: disable=g-import-not-at-top

from binaries import cli  # pylint: disable=g-bad-import-order

from absl import app  # pylint: disable=g-bad-import-order
from absl import flags
from absl import logging
from ml_collections import config_flags

_PROGRAM = 'compare'
_DEFAULT_CONFIG = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), '..', 'configs', 'base.py')

_CONFIG = config_flags.DEFINE_config_file(
    'config', _DEFAULT_CONFIG, 'Experiment config file (a get_config() '
    'module in configs/), shared by every run; override keys for every run '
    'with --config.<key>=<value>.')
_METHODS = flags.DEFINE_list(
    'methods', [], 'Registered methods to run, each a row labelled by its '
    'name, e.g. fedavg,feddf; <method>.<preset> runs one of its presets '
    '(docs/variants.md), e.g. dafkd.features,dafkd.paper_dcgan.')
_VARIANTS = flags.DEFINE_multi_string(
    'variant', [], 'A named variant, repeatable: '
    f'{experiment.VARIANT_SYNTAX}, e.g. '
    "'dafkd_t3:dafkd:dafkd.variant=features;distill.temperature=3.0' "
    '(dotted config keys its method reads, applied after --config.*).')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'],
                           'Seeds; every entry runs with each.')
_OUT = flags.DEFINE_string(
    'out', None, 'The study folder: runs/<label>_s<seed>/, summary.md, '
    'summary.csv, curves.png, logs/. Reusing it resumes the study.',
    required=True)
_ROUNDS = flags.DEFINE_integer('rounds', None,
                               "Rounds of every run (default: the config's).")
_PROGRESS = flags.DEFINE_bool('progress', True, 'Show a progress bar.')
_CLIENTS = flags.DEFINE_enum(
    'clients', 'fast', list(experiment.CLIENTS),
    "How each run's clients run: 'fast' groups them, up to 10 per TFF "
    'call, and fuses them where the method and model allow (another draw '
    "of the same algorithm; experiment.fast_clients); 'config': as the "
    "config's runtime keys say.")


def _fail(message: str) -> None:
  cli.fail(_PROGRAM, message)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, with every error as a one-line message
  (`cli.parse_flags`)."""
  return cli.parse_flags(_PROGRAM, argv, _DEFAULT_CONFIG)


def _header(plan: list, out: str) -> str:
  """The first line: the runs, the data, the rounds, the study folder."""
  labels = list(dict.fromkeys(r.entry.label for r in plan))
  seeds = list(dict.fromkeys(r.seed for r in plan))
  rounds = sorted({r.settings.run.rounds for r in plan})
  settings = plan[0].settings
  data = settings.dataset.domains or settings.dataset.name
  each = (str(rounds[0]) if len(rounds) == 1 else
          f'{rounds[0]}-{rounds[-1]}')
  runs = f'{len(plan)} run' + ('s' if len(plan) > 1 else '')
  return (f'{_PROGRAM}: {runs} ({", ".join(labels)} x seeds '
          f'{", ".join(map(str, seeds))}) on {data}, {each} rounds each; '
          f'outputs in {out}')


# How a stopped study goes on.
_RESUME = ('finished runs are kept and the stopped run resumes from its '
           'last checkpoint: run the same command to go on')


def _study(plan: list, out: str) -> None:
  """Runs the plan and writes the summary, under the study folder's lock."""
  log_dir = cli.log_to_file(_PROGRAM, out)
  cli.handle_stop_signals()
  print(_header(plan, out), flush=True)
  start = time.perf_counter()
  try:
    records = experiment.run_study(plan, out, progress=_PROGRESS.value)
    command = ' '.join([_PROGRAM, *map(shlex.quote, sys.argv[1:])])
    summary = experiment.write_study_summary(plan, out, command=command)
  except (Exception, KeyboardInterrupt) as e:  # pylint: disable=broad-except
    cli.stopped(_PROGRAM, e, out, lambda: _RESUME)
  print()
  print(summary.markdown)
  print(f'{time.perf_counter() - start:.0f} s')
  for name, path in summary.paths.items():
    print(f'  {name + ":":<9} {path}')
  print(f"  {'runs:':<9} {os.path.join(out, 'runs')}")
  if log_dir:
    print(f"  {'log:':<9} {log_dir}")
  failed = [r for r in records if r.get('error')]
  if failed:
    first = failed[0]
    _fail(f"{len(failed)} of {len(records)} runs failed (first: "
          f"{first['label']} seed {first['seed']}: {first['error']}); run "
          'the same command to try them again')


def main(argv: list[str]) -> None:
  del argv  # `_parse_flags` refuses positional arguments.
  context.freeze_imported_objects()  # TF and TFF are imported by now.
  config = cli.load_config(_PROGRAM, _CONFIG)
  out = _OUT.value
  with cli.one_line_errors(_PROGRAM, out):
    # Every run's config is validated before anything runs or is written.
    entries = experiment.study_entries(_METHODS.value, _VARIANTS.value)
    seeds = experiment.parse_seeds(_SEEDS.value)
    plan = experiment.plan_study(config, entries, seeds,
                                 rounds=_ROUNDS.value, clients=_CLIENTS.value)
    # One study per folder: locked before anything is written in it.
    with experiment.study_lock(out):
      _study(plan, out)


def run() -> None:
  """Console-script entry point (`compare`)."""
  app.run(main, flags_parser=_parse_flags)


if __name__ == '__main__':
  run()
