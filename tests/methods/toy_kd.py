"""Toy federation shared by the FedGen and FedFTG process tests.

Two clients on a 2-d, 3-class problem with a tiny classifier (features:
Dense(4, relu); head: Dense(3)). Local work is one epoch in one full batch,
so a client's update does not depend on the shuffle and eager code
reproduces it exactly.
"""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import models
from tff_kd.core import local_training
from tff_kd.federated import client_data
from tff_kd.models import classifiers

X = np.array([[1.0, 0.5], [0.8, -0.2], [-0.3, 1.2], [-1.0, 0.7],
              [-0.6, -1.1], [0.2, -0.9], [-0.4, -0.5]], np.float32)
Y = np.array([0, 0, 1, 1, 2, 2, 2], np.int32)
PARTS = [np.array([0, 1, 2]), np.array([3, 4, 5, 6])]
# n_{k,y}: client 0 holds two 0s and one 1; client 1 one 1 and three 2s.
COUNTS = np.array([[2, 1, 0], [0, 1, 3]], np.float32)
LOCAL = client_data.LocalWork('epochs', 1, 8)
LR = 0.5
NUM_CLASSES = 3


def classifier_fn() -> models.Classifier:
  seeds = classifiers.InitSeeds(3)
  inputs = tf.keras.Input((2,))
  feature = tf.keras.layers.Dense(
      4, activation='relu', kernel_initializer=seeds('glorot'),
      bias_initializer=tf.keras.initializers.Constant(0.1))(inputs)
  features = tf.keras.Model(inputs, feature)
  feature_in = tf.keras.Input((4,))
  head = tf.keras.Model(feature_in, tf.keras.layers.Dense(
      NUM_CLASSES, kernel_initializer=seeds('glorot'))(feature_in))
  model = tf.keras.Model(inputs, head(features(inputs)))
  return models.Classifier(model, features, head, 4)


def make_data(directory: str) -> client_data.FileClientData:
  return client_data.FileClientData.create(directory, X, Y, PARTS)


def assign(model: tf.keras.Model, weights) -> None:
  tf.nest.map_structure(lambda v, t: v.assign(t),
                        local_training.model_weights(model),
                        tff.learning.models.ModelWeights(
                            list(weights.trainable),
                            list(weights.non_trainable)))


def values_of(model: tf.keras.Model) -> tff.learning.models.ModelWeights:
  """A model's `ModelWeights` as numpy values."""
  weights = local_training.model_weights(model)
  return tff.learning.models.ModelWeights(
      [v.numpy() for v in weights.trainable],
      [v.numpy() for v in weights.non_trainable])


def values(model: tf.keras.Model) -> list[np.ndarray]:
  return [v.numpy() for v in model.trainable_weights + model.non_trainable_weights]


def flat(weights) -> list[np.ndarray]:
  return [np.asarray(v) for v in list(weights.trainable) +
          list(weights.non_trainable)]


def client_deltas(data, weights, keys, train_fn=None):
  """Each client's eager update (trainable deltas) from `weights`."""
  deltas = []
  for key in keys:
    clf = classifier_fn()
    dataset = data.dataset_fn(LOCAL)(tf.constant(key))
    if train_fn is None:
      result = local_training.train_locally(
          clf.model, tff.learning.optimizers.build_sgdm(LR), weights,
          dataset, tf.constant(LR))
    else:
      result = train_fn(clf, dataset, key)
    deltas.append([d.numpy() for d in result.weights_delta.trainable])
  return deltas
