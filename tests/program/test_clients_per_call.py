"""`runtime.clients_per_call`: several clients per TFF client call.

A grouped round must be the ungrouped round up to float round-off (the same
clients, batches and weighted mean), with the same reported client counts,
for both methods that allow it; every other method refuses it in one line.
Runs on scikit-learn's bundled digits.
"""

import numpy as np
import pytest

from tests import helpers
from tests.helpers import digits_config
from tff_kd import errors
from tff_kd.federated import tff_types
from tff_kd.program import experiment


def test_group_keys_pads_the_last_group():
  keys = ['a|0|1', 'b|0|1', 'c|0|1']
  assert tff_types.group_keys(keys, 1) == keys
  groups = tff_types.group_keys(keys, 2)
  assert [list(g) for g in groups] == [['a|0|1', 'b|0|1'], ['c|0|1', '']]


def test_the_program_groups_its_rounds(tmp_path):
  # 5 clients per round in groups of 2: two full groups and a padded one.
  base = {'method': 'fedprox', 'partition.num_clients': 8,
          'clients_per_round': 5, 'export': False}
  runs = {g: experiment.run(
      digits_config(**base, **{'runtime.clients_per_call': g}),
      str(tmp_path / f'g{g}'), progress=False).history for g in (1, 2)}
  for one, grouped in zip(runs[1], runs[2], strict=True):
    for key in ('client/num_clients', 'train/num_examples', 'train/num_steps',
                'comm/bytes_down', 'comm/bytes_up'):
      assert grouped[key] == one[key], key
    assert one['client/num_clients'] == 5.0
    assert grouped['train/loss'] == pytest.approx(one['train/loss'], rel=1e-5)
    assert grouped['test/loss'] == pytest.approx(one['test/loss'], rel=1e-4)


@pytest.mark.parametrize('method', ['fedavg', 'fedprox'])
def test_a_grouped_round_is_the_same_weighted_mean(tmp_path, method):
  exps, states = {}, {}
  for g in (1, 3):
    exps[g] = experiment.prepare(
        digits_config(method=method, **{'partition.num_clients': 8,
                                         'clients_per_round': 5,
                                         'runtime.clients_per_call': g}),
        str(tmp_path / f'{g}'))
    states[g] = exps[g].process.initialize()
  keys = exps[1].client_data.keys([0, 2, 3, 5, 7], seed=0, round_num=0)
  out = {g: exps[g].process.next(states[g], tff_types.group_keys(keys, g))
         for g in (1, 3)}
  a, b = (exps[g].process.get_model_weights(out[g].state) for g in (1, 3))
  for x, y in zip(a.trainable + a.non_trainable, b.trainable + b.non_trainable):
    np.testing.assert_allclose(x, y, atol=1e-5)
  moved = max(float(np.max(np.abs(x - y))) for x, y in zip(
      a.trainable, exps[1].process.get_model_weights(states[1]).trainable))
  assert moved > 1e-3  # The round did train.
  train = {g: out[g].metrics['client_work']['train'] for g in (1, 3)}
  assert train[3]['num_clients'] == train[1]['num_clients'] == 5.0
  assert train[3]['num_examples'] == train[1]['num_examples']
  assert train[3]['bytes_down'] == train[1]['bytes_down']


def test_a_method_with_per_client_state_refuses_it():
  """DaFKD's server keeps a discriminator per client (the methods that
  stack their clients take a call's clients as rows:
  tests/program/test_fuse_clients.py)."""
  with pytest.raises(errors.ConfigError,
                     match=r'runtime.clients_per_call=2: dafkd keeps '
                     'per-client state'):
    experiment.from_config(helpers.smoke_config(
        'dafkd', **{'runtime.clients_per_call': 2}))
