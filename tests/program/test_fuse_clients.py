"""`runtime.client_execution='fused'`: each call's clients trained as one computation.

A fused round must equal the same process with one TFF client per client
(`build_dataset_process`) fed, per client, a dataset of exactly the batches
the fused schedule gave that client: the same weighted mean and finalizer,
up to float round-off, and the same counts. The round has 5 clients of
unequal sizes in calls of 3 (a padded last call) and 1 local epoch, so the
clients take different numbers of steps. Refusals come in one line. Runs
on scikit-learn's bundled digits. (Whole fused runs: the fused case of
`tests/faults/test_client_data.py`'s truncated-file test.)
"""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from tests.helpers import digits_config
from tff_kd import errors
from tff_kd.core import fused
from tff_kd.federated import client_works
from tff_kd.federated import execution
from tff_kd.federated import tff_types
from tff_kd.program import experiment

_CLIENTS = [0, 2, 3, 5, 7]


def _client_batches(exp, key):
  """One client's dataset of the batches its fused schedule holds."""
  datasets = exp.inputs.dataset_fn
  x, y, seed = datasets.arrays(tf.constant(key))
  local = datasets.local
  order = fused.client_order(tf.shape(y)[0], seed, unit=local.unit,
                             amount=local.amount,
                             batch_size=local.batch_size).numpy()
  batches = [tf.data.Dataset.from_tensors(
      collections.OrderedDict(x=tf.gather(x, row[row >= 0]),
                              y=tf.gather(y, row[row >= 0])))
               for row in order]
  dataset = batches[0]
  for batch in batches[1:]:
    dataset = dataset.concatenate(batch)
  return dataset, len(batches)


@pytest.mark.parametrize('method', ['fedavg', 'fedprox'])
def test_a_fused_round_is_the_per_client_round_on_its_batches(tmp_path,
                                                              method):
  exp = experiment.prepare(
      digits_config(method=method, **{
          'partition.num_clients': 8, 'clients_per_round': 5,
          'runtime.clients_per_call': 3, 'runtime.client_execution': 'fused',
          'client_optimizer.momentum': 0.9}),
      str(tmp_path))
  keys = exp.client_data.keys(_CLIENTS, seed=0, round_num=0)
  state = exp.process.initialize()
  out = exp.process.next(state, tff_types.group_keys(keys, 3))

  per_client = experiment.build_dataset_process(exp)
  datasets, steps = zip(*(_client_batches(exp, k) for k in keys))
  assert len(set(steps)) > 1  # unequal clients: the masking is exercised
  ref_state = per_client.set_model_weights(
      per_client.initialize(), exp.process.get_model_weights(state))
  ref = per_client.next(ref_state, list(datasets))

  a = exp.process.get_model_weights(out.state)
  b = per_client.get_model_weights(ref.state)
  for x, y in zip(a.trainable + a.non_trainable, b.trainable + b.non_trainable):
    np.testing.assert_allclose(x, y, atol=2e-5)
  start = exp.process.get_model_weights(state)
  assert max(float(np.max(np.abs(x - y)))
             for x, y in zip(a.trainable, start.trainable)) > 1e-3
  got = out.metrics['client_work']['train']
  want = ref.metrics['client_work']['train']
  assert got['num_clients'] == want['num_clients'] == 5.0
  for key in ('num_examples', 'num_steps', 'bytes_down', 'bytes_up'):
    assert got[key] == want[key], key
  assert got['num_excluded'] == want['num_excluded'] == 0.0
  assert got['train_loss_sum'] == pytest.approx(want['train_loss_sum'],
                                                rel=1e-4)


@pytest.mark.parametrize('key,value', [
    ('runtime.client_execution', 'fused'),
    ('runtime.fuse_clients', True)])  # Its old name.
def test_methods_that_keep_clients_apart_refuse_it(key, value):
  with pytest.raises(errors.ConfigError,
                     match=r"runtime.client_execution='fused': feddf keeps"):
    experiment.from_config(helpers.smoke_config('feddf', **{key: value}))


def test_a_model_it_cannot_run_is_named_before_any_round(tmp_path):
  def with_dropout():
    inputs = tf.keras.Input((8, 8, 1))
    h = tf.keras.layers.Flatten()(inputs)
    h = tf.keras.layers.Dropout(0.3, name='drop')(h)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(10)(h))

  with pytest.raises(errors.ConfigError,
                     match=r"runtime.client_execution='fused': Dropout "
                     r"layer 'drop'"):
    client_works.build_client_work(
        with_dropout, None, None, learning_rate=0.1,
        dataset_fn=experiment.prepare(
            digits_config(), str(tmp_path)).inputs.dataset_fn,
        client_execution=execution.ClientExecution(2, 'fused'))
