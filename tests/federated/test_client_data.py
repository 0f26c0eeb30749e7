"""Client datasets built inside TFF from file keys."""

import numpy as np
import pytest

from tff_kd.federated import client_data

X = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
Y = np.arange(10, dtype=np.int32)


@pytest.fixture(scope='module')
def data(tmp_path_factory):
  parts = [np.arange(0, 7), np.arange(7, 10)]
  return client_data.FileClientData.create(
      str(tmp_path_factory.mktemp('cd')), X, Y, parts)


def _labels(comp, key):
  return [b['y'].numpy().tolist() for b in comp(key)]


def test_manifest_round_trip(data):
  reopened = client_data.FileClientData(data.directory)
  assert reopened.client_ids == ['0', '1']
  assert reopened.num_examples == [7, 3]
  assert reopened.image_shape == (3,)


def test_epochs_cover_each_example_once_per_epoch(data):
  comp = data.dataset_computation(client_data.LocalWork('epochs', 2, 3))
  batches = _labels(comp, data.keys([0], seed=0, round_num=0)[0])
  assert [len(b) for b in batches] == [3, 3, 1, 3, 3, 1]
  first, second = sum(batches[:3], []), sum(batches[3:], [])
  assert sorted(first) == sorted(second) == list(range(7))
  # Images travel with their labels.
  x = [b['x'].numpy() for b in comp(data.keys([0], seed=0, round_num=0)[0])]
  y = sum(batches, [])
  np.testing.assert_array_equal(np.concatenate(x), X[y])


def test_steps_take_exactly_that_many_full_batches(data):
  comp = data.dataset_computation(client_data.LocalWork('steps', 5, 2))
  batches = _labels(comp, data.keys([1], seed=0, round_num=0)[0])
  assert [len(b) for b in batches] == [2] * 5
  assert set(sum(batches, [])) == {7, 8, 9}


def test_shuffle_is_reproducible_and_changes_every_round(data):
  comp = data.dataset_computation(client_data.LocalWork('epochs', 1, 7))
  key = lambda r, s=0: data.keys([0], seed=s, round_num=r)[0]  # noqa: E731
  assert _labels(comp, key(0)) == _labels(comp, key(0))
  orders = {tuple(_labels(comp, key(r))[0]) for r in range(5)}
  assert len(orders) > 1
  assert _labels(comp, key(0, s=1)) != _labels(comp, key(0, s=0)) or (
      _labels(comp, key(1, s=1)) != _labels(comp, key(1, s=0)))


@pytest.mark.parametrize('local', [
    client_data.LocalWork('minutes', 1, 2),
    client_data.LocalWork('steps', 0, 2),
    client_data.LocalWork('epochs', 1, 0),
])
def test_bad_local_work_is_rejected(local):
  with pytest.raises(ValueError):
    local.validate()
