"""The composer checks its stages as TFF's composer does, data type aside.

`tff_kd.federated.composer.compose_learning_process` accepts any
CLIENTS-placed client data (keys on the fast path) but otherwise refuses
stages that do not fit together, naming the stage, before any round runs.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.federated import client_works
from tff_kd.federated import composer
from tff_kd.federated import finalizers
from tff_kd.federated import learning
from tff_kd.federated import tff_types

_SPEC = collections.OrderedDict(x=tf.TensorSpec([None, 2], tf.float32),
                                y=tf.TensorSpec([None], tf.int32))


def _model_fn(units: int = 2) -> tf.keras.Model:
  inputs = tf.keras.Input((2,))
  return tf.keras.Model(inputs, tf.keras.layers.Dense(units)(inputs))


def _stages(units: int = 2):
  weights_type = tff_types.weights_type_of(_model_fn)  # pylint: disable=protected-access
  other_type = tff_types.weights_type_of(  # pylint: disable=protected-access
      lambda: _model_fn(units))
  client_work = client_works.build_client_work(
      _model_fn, _SPEC, tff.learning.optimizers.build_sgdm(0.1),
      learning_rate=0.1)
  return dict(
      initial_weights_fn=learning.build_initial_weights_fn(_model_fn),
      distributor=tff.learning.templates.build_broadcast_process(weights_type),
      client_work=client_work,
      aggregator=tff.aggregators.MeanFactory().create(
          weights_type, tff.TensorType(np.float32)),
      finalizer=finalizers.build_weights_finalizer(
          other_type, tff.learning.optimizers.build_sgdm(1.0)))


def test_fitting_stages_compose_and_keep_their_finalizer():
  stages = _stages()
  process = composer.compose_learning_process(**stages)
  assert composer.finalizer_of(process) is stages['finalizer']


def test_a_finalizer_for_other_weights_is_refused_by_name():
  with pytest.raises(TypeError, match='finalizer input'):
    composer.compose_learning_process(**_stages(units=3))


def test_an_unweighted_aggregator_is_refused():
  stages = _stages()
  stages['aggregator'] = tff.aggregators.UnweightedMeanFactory().create(
      stages['initial_weights_fn'].type_signature.result)
  with pytest.raises(TypeError, match='must be weighted'):
    composer.compose_learning_process(**stages)
