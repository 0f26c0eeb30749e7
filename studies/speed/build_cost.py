r"""What a method's process build costs in a fresh process, and AutoGraph's part.

A `train` process builds its method's TFF process in `experiment.prepare`
(data, the process, the evaluators), before TFF compiles anything. Inside
it, AutoGraph converts every Python function that a traced function calls,
recursively, unless it is marked unconverted; a conversion is paid once per
process, so every run pays it. This script runs `experiment.prepare` for
each method in fresh processes (`--config`, `--overrides`) and records:

* `prepare_s`: the wall time of `prepare`;
* `autograph_s` and `conversions`: the time AutoGraph spent converting
  functions, and how many it converted (TensorFlow's own conversion entry
  point, timed around each call; a conversion's own time, without what the
  converted function later calls); `hook_sees_conversions` checks, after
  the build, that the timing hook records a conversion at all;
* the functions that cost most to convert.

Each value is the median over `--repeats` processes; the slowest
conversions are the first process's. Writes `<out>.json` and `<out>.md`.

Usage (digits, no data to prepare; 10-20 s per process on 2 CPU cores):
  TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -m studies.speed.build_cost \
      --methods=feddf,fedftg,dafkd --repeats=3 \
      --out=studies/speed/results/build_cost
"""

import json
import statistics
import tempfile
import time

from tff_kd.runtime import context  # pylint: disable=g-bad-import-order
context.install()  # As `train` does, first thing: its process set-up.

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags

from studies import common

_METHODS = flags.DEFINE_list('methods', ['feddf', 'fedftg', 'dafkd'],
                             'Methods, one fresh process each per repeat.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Processes per method.')
_CONFIG = flags.DEFINE_string('config', 'configs/digits.py',
                              'Config file of the runs.')
_TOP = flags.DEFINE_integer('top', 8, 'Slowest conversions listed.')
_CHILD = flags.DEFINE_string('child', '', 'Internal: build this method '
                             'here and print one JSON line.')
_OUT = flags.DEFINE_string('out', 'studies/speed/results/build_cost',
                           'Result path without its extension.')
_OVERRIDES = common.define_overrides_flag()


def _measure(method: str) -> dict:
  """`experiment.prepare` of `method` in this process, AutoGraph timed."""
  # TensorFlow's internal conversion entry point: the one place that
  # converts a function (studies may read TF's internals, not tff_kd's).
  from tensorflow.python.autograph.impl import api  # pylint: disable=g-import-not-at-top
  from tff_kd.program import experiment  # pylint: disable=g-import-not-at-top
  costs = {}
  convert = api._convert_actual  # pylint: disable=protected-access

  def timed(entity, program_ctx):
    t0 = time.perf_counter()
    converted = convert(entity, program_ctx)
    seconds = time.perf_counter() - t0
    name = (f"{getattr(entity, '__module__', '?')}."
            f"{getattr(entity, '__qualname__', '?')}")
    costs[name] = costs.get(name, 0.0) + seconds
    return converted

  api._convert_actual = timed  # pylint: disable=protected-access
  config = common.config_module(_CONFIG.value).get_config()
  config.method = method
  common.apply_overrides(config, _OVERRIDES.value)
  with tempfile.TemporaryDirectory() as root:
    t0 = time.perf_counter()
    experiment.prepare(config, root)
    prepare_s = time.perf_counter() - t0
  build_costs = dict(costs)
  slowest = sorted(build_costs.items(), key=lambda kv: -kv[1])[:_TOP.value]
  return dict(method=method, prepare_s=prepare_s,
              autograph_s=sum(build_costs.values()),
              conversions=len(build_costs),
              slowest=[[name, seconds] for name, seconds in slowest],
              hook_sees_conversions=_probe_converted(costs))


def _probe_converted(costs: dict) -> bool:
  """Whether the hook records a conversion: a count of 0 means something
  only if it does. Converts one function with a conditional on a tensor
  (after the build, so the build's counts leave it out)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  @tf.function
  def probe(x):
    if x > 0:
      x = -x
    return x

  probe(tf.constant(1.0))
  return any(name.endswith('probe') for name in costs)


def _child_run(method: str) -> dict:
  """One fresh process's `_measure`."""
  args = [f'--child={method}', f'--config={_CONFIG.value}',
          f'--top={_TOP.value}']
  if _OVERRIDES.value:
    args.append('--overrides=' + ','.join(_OVERRIDES.value))
  return common.run_child('speed.build_cost', *args)


def _markdown(result: dict) -> str:
  lines = [
      '# What a method\'s process build costs, and AutoGraph\'s part', '',
      f"Command: `{result['command']}`", '',
      f"Machine: {result['machine']}. Medians over {result['repeats']} "
      'fresh processes each.', '',
      '| method | `prepare` s | AutoGraph s | conversions | the hook sees '
      'a probe conversion |',
      '|---|---|---|---|---|']
  for row in result['rows']:
    seen = 'yes' if row['hook_sees_conversions'] else '**no**'
    lines.append(f"| {row['method']} | {row['prepare_s']:.2f} | "
                 f"{row['autograph_s']:.2f} | {row['conversions']} | "
                 f'{seen} |')
  lines += ['', 'Slowest conversions (first process, seconds):', '']
  for row in result['rows']:
    slowest = ', '.join(f'`{name}` {seconds:.3f}'
                        for name, seconds in row['slowest'])
    lines.append(f"* {row['method']}: {slowest}")
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  if _CHILD.value:
    print(json.dumps(_measure(_CHILD.value)))
    return
  rows = []
  for method in _METHODS.value:
    runs = [_child_run(method) for _ in range(_REPEATS.value)]
    rows.append(dict(
        method=method, runs=runs, slowest=runs[0]['slowest'],
        hook_sees_conversions=all(r['hook_sees_conversions'] for r in runs),
        **{key: statistics.median(r[key] for r in runs)
           for key in ('prepare_s', 'autograph_s', 'conversions')}))
  result = dict(command=common.command('speed.build_cost'),
                machine=common.machine(), repeats=_REPEATS.value, rows=rows)
  print(common.write_result(_OUT.value, result, _markdown))


if __name__ == '__main__':
  app.run(main)
