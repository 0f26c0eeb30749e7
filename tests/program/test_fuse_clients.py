"""`runtime.client_execution='fused'`: each call's clients trained as one computation.

A fused round must equal the same process with one TFF client per client
(`build_dataset_process`) fed, per client, a dataset of exactly the batches
the fused schedule gave that client: the same weighted mean and finalizer,
up to float round-off, and the same counts. The round has 5 clients of
unequal sizes in calls of 3 (a padded last call) and 1 local epoch, so the
clients take different numbers of steps. Refusals come in one line. Runs
on scikit-learn's bundled digits. (Whole fused runs: the fused case of
`tests/faults/test_client_data.py`'s truncated-file test.)

The methods that stack their clients (FedDF, FedD3A, FedFTG, FedGen) get a
call's clients as rows of the same stack (`tff_kd.core.stacking.GroupRows`):
fused, their round must be the per-client round on the same batches (the
teachers, FedD3A's projections P and FedFTG's label counts from them, the
server step and its links), from perturbed weights so that a padding row's
image has non-zero features; grouped in turn, it must be the round of one
TFF client per key.
"""

import collections
import json

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
from tff_kd.methods import registry
from tff_kd.program import checkpoints
from tff_kd.program import experiment
from tff_kd.program import settings as settings_lib

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


def _stacked(method, tmp_path, **overrides):
  return experiment.prepare(
      helpers.smoke_config(method, **{
          'partition.num_clients': 8, 'clients_per_round': 5,
          'local.unit': 'epochs', 'client_optimizer.momentum': 0.9,
          **overrides}), str(tmp_path))


def _perturbed(weights):
  """The weights with every variable moved (biases and BatchNorm's
  statistics too), so that a padding row's zero image has non-zero
  features and a mask left out shows."""
  rng = np.random.default_rng(0)

  def move(v):
    v = np.asarray(v)
    return (v + 0.1 * np.abs(rng.standard_normal(v.shape))).astype(v.dtype)

  return type(weights)(trainable=[move(v) for v in weights.trainable],
                       non_trainable=[move(v) for v in weights.non_trainable])


def _assert_same_round(process, got, reference, want, atol):
  """Two rounds (`process.next`'s and `reference.next`'s outputs) of a
  method that stacks its clients: the same student and the same teachers'
  links."""
  a = process.get_model_weights(got.state)
  b = reference.get_model_weights(want.state)
  for x, y in zip(a.trainable + a.non_trainable,
                  b.trainable + b.non_trainable):
    np.testing.assert_allclose(x, y, atol=atol)
  # Every server measurement but the clocks (and FedD3A's per-client
  # report, which a process of datasets does not make).
  got_f, want_f = got.metrics['finalizer'], want.metrics['finalizer']
  names = [n for n in got_f if n in want_f and not n.endswith(
      ('_seconds', 'samples_per_second')) and not n.startswith('client_')]
  assert 'num_teachers' in names and len(names) > 5
  for name in names:
    assert got_f[name] == pytest.approx(want_f[name], abs=1e-4), name
  g, w = got.metrics['client_work']['train'], want.metrics['client_work']['train']
  for key in ('num_clients', 'num_examples', 'num_steps', 'bytes_down',
              'bytes_up', 'num_excluded'):
    assert g[key] == w[key], key


@pytest.mark.parametrize('method', ['feddf', 'fedd3a', 'fedftg'])
def test_fused_stacks_the_per_client_teachers_of_its_batches(tmp_path,
                                                             method):
  """Fused clients (calls of 3: a padded last call) stack, row for row, the
  teachers (FedD3A: and the projections P) that one TFF client per client
  makes on the same batches, so the server step, the links and the counts
  are the same."""
  exp = _stacked(method, tmp_path, **{'runtime.clients_per_call': 3,
                                      'runtime.client_execution': 'fused'})
  keys = exp.client_data.keys(_CLIENTS, seed=0, round_num=0)
  weights = _perturbed(exp.process.get_model_weights(
      exp.process.initialize()))
  state = exp.process.set_model_weights(exp.process.initialize(), weights)
  out = exp.process.next(state, tff_types.group_keys(keys, 3))

  per_client = experiment.build_dataset_process(exp)
  datasets, steps = zip(*(_client_batches(exp, k) for k in keys))
  assert len(set(steps)) > 1
  ref = per_client.next(per_client.set_model_weights(
      per_client.initialize(), weights), list(datasets))
  assert out.metrics['finalizer']['num_teachers'] == 5.0
  _assert_same_round(exp.process, out, per_client, ref, atol=1e-4)
  if method == 'fedd3a':  # Each row carries its client's id.
    reported = {k for k in range(8)
                if out.metrics['finalizer'][f'client_weight_{k}'] > 0}
    assert reported == set(_CLIENTS)


@pytest.mark.parametrize('local_beta', [10.0, 0.0])
def test_fused_fedgen_is_the_per_client_regularised_round(tmp_path,
                                                          local_beta):
  """FedGen's fused clients add its generator regulariser in lockstep: on
  the same batches, with the regulariser on from round 0 and its
  coefficients scaled per client (reference_steps=2, so clients of
  different steps get different scales), the round is the per-client
  round: the student, the generator, the server's measurements, the
  counts. With and without the latent KL term."""
  exp = _stacked('fedgen', tmp_path, **{
      'runtime.clients_per_call': 3, 'runtime.client_execution': 'fused',
      'fedgen.start_round': 0, 'fedgen.reference_steps': 2,
      'fedgen.local_beta': local_beta})
  keys = exp.client_data.keys(_CLIENTS, seed=0, round_num=0)
  state = exp.process.initialize()
  out = exp.process.next(state, tff_types.group_keys(keys, 3))

  per_client = experiment.build_dataset_process(exp)
  datasets, steps = zip(*(_client_batches(exp, k) for k in keys))
  assert len(set(steps)) > 1 and max(steps) > 2
  ref = per_client.next(per_client.initialize(), [
      collections.OrderedDict(client_id=np.int32(k.split('|')[0]), data=d)
      for k, d in zip(keys, datasets)])
  _assert_same_round(exp.process, out, per_client, ref, atol=1e-4)


@pytest.mark.parametrize('method', ['feddf', 'fedd3a', 'fedftg', 'fedgen'])
def test_clients_in_turn_are_the_one_by_one_round(tmp_path, method):
  """Grouped in turn (calls of 2, a padded last call): the round of one
  TFF client per key."""
  grouped = _stacked(method, tmp_path / 'g',
                     **{'runtime.clients_per_call': 2})
  single = _stacked(method, tmp_path / 's')
  keys = grouped.client_data.keys(_CLIENTS, seed=0, round_num=0)
  out = grouped.process.next(grouped.process.initialize(),
                             tff_types.group_keys(keys, 2))
  ref = single.process.next(single.process.initialize(), keys)
  _assert_same_round(grouped.process, out, single.process, ref, atol=1e-5)


@pytest.mark.parametrize('case,why', [
    ('feddf_hetero', 'feddf trains 2 prototypes'),
    ('fedd3a_hetero', 'fedd3a with client_models keeps each client its own '
     'model')])
def test_heterogeneous_clients_refuse_grouping(case, why):
  with pytest.raises(errors.ConfigError,
                     match=why + ', so it runs one client per call'):
    experiment.from_config(helpers.smoke_config(
        case, **{'runtime.client_execution': 'fused'}))


@pytest.mark.parametrize('key,value', [
    ('runtime.client_execution', 'fused'),
    ('runtime.fuse_clients', True)])  # Its old name.
def test_a_method_with_its_own_local_term_refuses_fusing(monkeypatch, key,
                                                         value):
  """Every registered method that groups its clients fuses them now; one
  registered with a term fused clients do not run (`Method.fuses_clients`
  False, here FedGen marked so) is refused in one line."""
  monkeypatch.setitem(registry.METHODS, 'fedgen', registry.METHODS[
      'fedgen']._replace(fuses_clients=False))
  with pytest.raises(errors.ConfigError,
                     match=r"runtime.client_execution='fused': fedgen's "
                     'clients train with a term of their own'):
    experiment.from_config(helpers.smoke_config('fedgen', **{key: value}))



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


def test_a_fused_run_folder_says_it_is_another_draw(tmp_path):
  """`config.json` notes that a fused run's numbers are another draw; the
  note is no config key, so the folder resumes."""
  fused = settings_lib.from_config(digits_config(**{
      'runtime.clients_per_call': 2, 'runtime.client_execution': 'fused'}))
  for name in ('f', 's'):
    (tmp_path / name).mkdir()
  checkpoints.check_resumable(fused, str(tmp_path / 'f'))
  checkpoints.check_resumable(fused, str(tmp_path / 'f'))  # Resumes.
  with open(tmp_path / 'f' / 'config.json') as f:
    notes = json.load(f)[checkpoints.NOTES_KEY]
  assert len(notes) == 1 and 'another draw of the same algorithm' in notes[0]
  checkpoints.check_resumable(settings_lib.from_config(digits_config()),
                              str(tmp_path / 's'))
  with open(tmp_path / 's' / 'config.json') as f:
    assert checkpoints.NOTES_KEY not in json.load(f)
