"""Export of the global model for serving without TFF.

The export folder follows TF Serving's model base path layout:

    <export_root>/<model_name>/<version>/saved_model.pb, variables/, ...
                                        metadata.json

one numbered version folder per export (1, 2, ...: each export of the same
run folder, e.g. after a resumed run, adds the next version), so
`tensorflow/serving` with `--model_base_path=<export_root>/<model_name>`
serves the newest and picks up new ones as they appear. A version is
written under a hidden temporary name and renamed into place when complete,
so a server never sees half of one.

Every version's `serving_default` signature is the same: it takes `images`,
a float32 batch [N, H, W, C] already normalised like the training data
(pixels scaled to [0, 1], then `(p - 0.5) / 0.5`), and returns `logits` and
`probabilities` [N, num_classes]. Plain TensorFlow loads a version with
`tf.saved_model.load(path)`; Keras with `tf.keras.models.load_model(path)`.
Its `metadata.json` records the model's architecture digest
(`tff_kd.models.architecture_digest`), as the run folder's
`architecture.json` does.
"""

import json
import os
import shutil

import tensorflow as tf

from tff_kd.models import classifiers

# The model name of the export layout (TF Serving's MODEL_NAME).
MODEL_NAME = 'tff_kd'
METADATA = 'metadata.json'


def versions(model_dir: str) -> list[int]:
  """The version numbers exported under `<export_root>/<model_name>`."""
  if not os.path.isdir(model_dir):
    return []
  return sorted(int(name) for name in os.listdir(model_dir)
                if name.isdigit() and os.path.isdir(
                    os.path.join(model_dir, name)))


def export_saved_model(model: tf.keras.Model, export_root: str, *,
                       model_name: str = MODEL_NAME) -> str:
  """Saves `model` (images -> logits) as the next serving version.

  Args:
    model: The trained Keras classifier.
    export_root: The export folder (TF Serving's model base paths are its
      sub-folders).
    model_name: The model's folder under `export_root`.

  Returns:
    The new version's SavedModel directory,
    `<export_root>/<model_name>/<version>`.
  """
  inputs = tf.keras.Input(model.input_shape[1:], name='images')
  logits = model(inputs, training=False)
  outputs = {
      'logits': tf.keras.layers.Identity(name='logits')(logits),
      'probabilities': tf.keras.layers.Softmax(name='probabilities')(logits),
  }
  serving = tf.keras.Model(inputs, outputs, name='tff_kd_classifier')
  model_dir = os.path.join(export_root, model_name)
  version = (versions(model_dir) or [0])[-1] + 1
  path = os.path.join(model_dir, str(version))
  partial = os.path.join(model_dir, f'.writing-{version}')
  shutil.rmtree(partial, ignore_errors=True)
  serving.save(partial, save_format='tf', include_optimizer=False)
  with open(os.path.join(partial, METADATA), 'w') as f:
    json.dump(dict(model_name=model_name, version=version,
                   input_shape=list(model.input_shape[1:]),
                   architecture=classifiers.architecture_digest(model),
                   normalisation='pixels in [0,1], then (p - 0.5) / 0.5',
                   signature='serving_default', inputs=['images'],
                   outputs=sorted(outputs)), f, indent=2)
  os.rename(partial, path)
  return path
