r"""How far one round's gap between the two codes moves from round to round.

The parity bar compares the codes at the final round, one round of 20 on
three seeds. The clients of a round are the same in both codes, so a
round's sample moves both curves together, but not by the same amount: a
single round's gap between the codes (the seeds' mean) has a spread of its
own. This reads a study's committed `rounds.csv` (`parity.py` writes it)
and reports, per pair of rows (ours, theirs), the per-round gap's mean and
standard deviation over the rounds, its final round, and where that final
round stands (in standard deviations from the other rounds' mean); for a
distilling pair also the gap of the two codes' Δ against their own
FedAvg, round by round. Nothing is run.

Usage:
  python -m studies.parity.spread \
      --rounds=studies/parity/results/dafkd/rounds.csv \
      --pairs=fedavg:fedavg,dafkd.reference:dafkd \
      --out=studies/parity/results/dafkd/spread.md
"""

import collections
import csv
import statistics
from typing import Sequence

from absl import app
from absl import flags

from studies import common

_ROUNDS = flags.DEFINE_string('rounds', None, "A study's rounds.csv.",
                              required=True)
_PAIRS = flags.DEFINE_list(
    'pairs', ['fedavg:fedavg'], 'OURS:THEIRS row names; the first pair is '
    'the FedAvg of each code, which the other pairs\' Δ is taken against.')
_OUT = flags.DEFINE_string('out', None, 'Where to write the Markdown '
                           '(printed either way).')
_BAR = flags.DEFINE_float('bar', 3.0, 'The acceptance bar, in points: the '
                          'share of rounds whose gap is within it.')

# (code, method) -> seed -> per-round test accuracy, in points.
Curves = dict[tuple[str, str], dict[str, list[float]]]


def read_curves(path: str) -> Curves:
  """A rounds.csv as per-round accuracies in points."""
  curves: Curves = collections.defaultdict(dict)
  rows = collections.defaultdict(dict)
  with open(path, newline='') as f:
    for r in csv.DictReader(f):
      rows[(r['code'], r['method'], r['seed'])][int(r['round'])] = (
          100 * float(r['test_accuracy']))
  for (code, method, seed), by_round in rows.items():
    curves[(code, method)][seed] = [by_round[i] for i in sorted(by_round)]
  return curves


def gaps(ours: dict[str, list[float]], theirs: dict[str, list[float]]
         ) -> list[float]:
  """Per round, the mean over shared seeds of ours minus theirs."""
  seeds = sorted(set(ours) & set(theirs))
  if not seeds:
    raise ValueError('the two rows share no seed')
  rounds = min(len(ours[s]) for s in seeds)
  return [statistics.mean(ours[s][i] - theirs[s][i] for s in seeds)
          for i in range(rounds)]


def describe(values: Sequence[float], bar: float) -> list[str]:
  """Mean and std over rounds, the final round, its z against the rounds
  before it, and the share of rounds within `bar`."""
  before = values[:-1]
  sd = statistics.stdev(before)
  z = (values[-1] - statistics.mean(before)) / sd if sd > 0 else float('nan')
  within = sum(abs(v) <= bar for v in values)
  return [f'{statistics.mean(values):+.2f}', f'{statistics.stdev(values):.2f}',
          f'{values[-1]:+.2f}', f'{z:+.1f}', f'{within} of {len(values)}']


def report(curves: Curves, pairs: Sequence[tuple[str, str]],
           bar: float) -> str:
  """The Markdown table."""
  missing = [f'{code} {name}' for ours, theirs in pairs
             for code, name in (('ours', ours), ('theirs', theirs))
             if (code, name) not in curves]
  if missing:
    raise ValueError('no such row in the rounds file: ' + ', '.join(missing))
  lines = [
      '| gap (ours − theirs, mean of seeds) | mean over rounds | sd over '
      'rounds | final round | final round\'s z against rounds 1..R-1 | '
      f'rounds within {bar:g} |', '|---|---|---|---|---|---|']
  (fa_ours, fa_theirs), rest = pairs[0], pairs[1:]
  base_ours, base_theirs = curves[('ours', fa_ours)], curves[
      ('theirs', fa_theirs)]
  for ours, theirs in pairs:
    row = gaps(curves[('ours', ours)], curves[('theirs', theirs)])
    lines.append(f'| accuracy, {ours} / {theirs} | ' +
                 ' | '.join(describe(row, bar)) + ' |')
  for ours, theirs in rest:
    delta_ours = gaps(curves[('ours', ours)], base_ours)
    delta_theirs = gaps(curves[('theirs', theirs)], base_theirs)
    row = [a - b for a, b in zip(delta_ours, delta_theirs)]
    lines.append(f'| Δ against FedAvg, {ours} / {theirs} | ' +
                 ' | '.join(describe(row, bar)) + ' |')
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  pairs = []
  for item in _PAIRS.value:
    ours, sep, theirs = item.partition(':')
    if not sep or not ours or not theirs:
      raise app.UsageError(f'--pairs: {item!r} is not OURS:THEIRS')
    pairs.append((ours, theirs))
  try:
    table = report(read_curves(_ROUNDS.value), pairs, _BAR.value)
  except (OSError, ValueError, KeyError) as e:
    raise SystemExit(f'spread: error: {e}') from None
  text = (f'# Round-to-round spread of the gap between the codes\n\n'
          f'Command: `{common.command("parity.spread")}`\n\n' + table)
  print(text)
  if _OUT.value:
    with open(_OUT.value, 'w') as f:
      f.write(text)


if __name__ == '__main__':
  app.run(main)
