"""Export of the global model for serving without TFF.

The SavedModel's `serving_default` signature takes a float32 batch of images
already normalised like the training data (pixels scaled to [0, 1], then
`(p - 0.5) / 0.5`) and returns `logits` and `probabilities`. Plain
TensorFlow loads it with `tf.saved_model.load(path)`; Keras with
`tf.keras.models.load_model(path)`.
"""

import json
import os

import tensorflow as tf

SERVING_DIR = 'saved_model'


def export_saved_model(model: tf.keras.Model, export_root: str) -> str:
  """Saves `model` (images -> logits) with a serving signature.

  Args:
    model: The trained Keras classifier.
    export_root: Folder to write `saved_model/` and `metadata.json` into.

  Returns:
    The SavedModel directory.
  """
  inputs = tf.keras.Input(model.input_shape[1:], name='images')
  logits = model(inputs, training=False)
  outputs = {
      'logits': tf.keras.layers.Identity(name='logits')(logits),
      'probabilities': tf.keras.layers.Softmax(name='probabilities')(logits),
  }
  serving = tf.keras.Model(inputs, outputs, name='tff_kd_classifier')
  path = os.path.join(export_root, SERVING_DIR)
  serving.save(path, save_format='tf', include_optimizer=False)
  with open(os.path.join(export_root, 'metadata.json'), 'w') as f:
    json.dump(dict(input_shape=list(model.input_shape[1:]),
                   normalisation='pixels in [0,1], then (p - 0.5) / 0.5',
                   outputs=sorted(outputs)), f, indent=2)
  return path
