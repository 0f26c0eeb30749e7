r"""The head's ceiling on the averaged extractor: a linear probe on the
server's labeled images.

DaFKD's appendix-A variant (`configs/dafkd_features_cpu.py`) distils only
the averaged classifier's head, on generated features; the extractor stays
the average of the clients'. This check asks how far a head on that
extractor could get at all: it refits the head (a fresh linear layer,
Adam 0.01, 2,000 full-batch steps) on half of the server's 500 labeled
images with their true labels, scores it on the other half, and swaps
(2-fold). The gap from the round's student to this probe is what better
head distillation could still win; the gap from the probe to eq. 7's
ensemble (the run's `distill/ensemble_accuracy_weighted`) needs the
extractor to move, which a pool of features cannot do.

It reads the final checkpoint of each run folder (`compare_methods
--root_dir`) and writes a Markdown table to stdout:

  python -m studies.table1.probe /tmp/runs/dafkd_feature_detach_s0 ...
"""

import json
import os
import sys

import ml_collections
import numpy as np
import tensorflow as tf

from tff_kd.program import experiment


def _accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
  return float(np.mean(np.argmax(logits, -1) == labels))


def _probe(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
           test_y: np.ndarray, num_classes: int, seed: int) -> float:
  """Test accuracy of a linear layer fit on (train_x, train_y)."""
  tf.keras.utils.set_random_seed(seed)
  layer = tf.keras.layers.Dense(num_classes)
  layer.build((None, train_x.shape[1]))
  optimizer = tf.keras.optimizers.Adam(0.01)
  for _ in range(2_000):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
          train_y, layer(train_x), from_logits=True))
    grads = tape.gradient(loss, layer.trainable_variables)
    optimizer.apply_gradients(zip(grads, layer.trainable_variables))
  return _accuracy(layer(test_x).numpy(), test_y)


def probe_run(root_dir: str) -> dict:
  """The final round's student, linear probe and eq. 7 ensemble."""
  with open(os.path.join(root_dir, 'config.json')) as f:
    config = ml_collections.ConfigDict(json.load(f))
  exp = experiment.prepare(experiment.from_config(config), root_dir)
  state, rounds = experiment.load_state(exp.settings, root_dir)
  model = exp.model_fn()
  exp.process.get_model_weights(state).assign_weights_to(model)
  features = next(layer for layer in model.layers
                  if layer.name.endswith('_features'))
  images, labels = exp.server_data.read_validation()
  images, labels = images.numpy(), labels.numpy()
  feats = features(images, training=False).numpy()
  num_classes = int(model.output_shape[-1])
  order = np.random.default_rng(0).permutation(len(labels))
  a, b = np.sort(order[:len(order) // 2]), np.sort(order[len(order) // 2:])
  probe = np.mean([_probe(feats[a], labels[a], feats[b], labels[b],
                          num_classes, 0),
                   _probe(feats[b], labels[b], feats[a], labels[a],
                          num_classes, 1)])
  ensemble = float('nan')
  metrics_csv = os.path.join(root_dir, 'metrics.csv')
  with open(metrics_csv) as f:
    header, *rows = [line.rstrip('\n').split(',') for line in f]
  key = 'distill/ensemble_accuracy_weighted'
  if key in header and rows:
    ensemble = float(rows[-1][header.index(key)])
  return dict(run=os.path.basename(root_dir.rstrip('/')), round=rounds,
              student=_accuracy(model(images, training=False).numpy(),
                                labels),
              probe=float(probe), ensemble=ensemble)


def main(argv: list[str]) -> None:
  print('| run | round | student | linear probe | eq. 7 ensemble |')
  print('|---|---|---|---|---|')
  for root_dir in argv:
    r = probe_run(root_dir)
    print(f"| {r['run']} | {r['round']} | {r['student']:.3f} | "
          f"{r['probe']:.3f} | {r['ensemble']:.3f} |", flush=True)


if __name__ == '__main__':
  main(sys.argv[1:])
