"""The export folder is TF Serving's model base path layout."""

import json
import os

import numpy as np
import tensorflow as tf

from tff_kd.program import export


def test_each_export_is_the_next_version_with_the_same_signature(tmp_path):
  root = str(tmp_path / 'export')
  tf.keras.utils.set_random_seed(0)
  inputs = tf.keras.Input((8, 8, 1))
  model = tf.keras.Model(inputs, tf.keras.layers.Dense(10)(
      tf.keras.layers.Flatten()(inputs)))
  first = export.export_saved_model(model, root)
  model.set_weights([w + 0.1 for w in model.get_weights()])
  second = export.export_saved_model(model, root)
  assert first == os.path.join(root, export.MODEL_NAME, '1')
  assert second == os.path.join(root, export.MODEL_NAME, '2')
  # Only the numbered versions: no temporary folder is left for a server.
  assert sorted(os.listdir(os.path.join(root, export.MODEL_NAME))) == [
      '1', '2']
  images = tf.random.stateless_uniform([4, 8, 8, 1], seed=(1, 2),
                                       minval=-1.0)
  logits = []
  for version, path in ((1, first), (2, second)):
    signature = tf.saved_model.load(path).signatures['serving_default']
    assert list(signature.structured_input_signature[1]) == ['images']
    out = signature(images=images)
    assert set(out) == {'logits', 'probabilities'}
    assert out['logits'].shape == out['probabilities'].shape == (4, 10)
    np.testing.assert_allclose(out['probabilities'].numpy().sum(-1), 1.0,
                               rtol=1e-5)
    logits.append(out['logits'].numpy())
    with open(os.path.join(path, export.METADATA)) as f:
      meta = json.load(f)
    assert meta['version'] == version and meta['input_shape'] == [8, 8, 1]
  np.testing.assert_allclose(logits[1], model(images, training=False),
                             rtol=1e-5, atol=1e-5)
  assert not np.allclose(logits[0], logits[1])
