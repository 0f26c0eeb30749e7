"""Numpy reference values and shared checks for the link table of
tff_kd/core/links.py.

`expected_links` recomputes a round's link table in numpy from the
teachers', the method's own ensemble's and the students' scores on the
labeled images; `assert_links_match` compares a reported table with it.
`assert_round_unchanged` and `assert_links_in_range` are the checks every
method with a link table shares. `TOY_VAL_X` / `TOY_VAL_Y` and
`np_toy_logits` are the labeled server images and the numpy classifier of
the toy federation of `tests.methods.toy_kd` (FedGen, FedFTG);
`assert_labeled_images_of_another_shape_are_refused` checks that a toy
process refuses labeled images its classifier cannot score.

`assert_fills_the_link_table` checks a real run of a KD method the way
`compare` summarises it: its row of the summary's link table has every
column filled, but those `NOT_IN_THE_SUMMARY` names. It is called on runs
other tests make anyway (two rounds each, with labeled server images), and
tests/program/test_compare.py checks that every KD method of the registry
has such a call.
"""

import math
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import pytest
import tensorflow as tf

from tests.methods import toy_kd
from tff_kd import errors
from tff_kd.core import links
from tff_kd.federated import server_data as server_data_lib
from tff_kd.program import compare
from tff_kd.program import plots

# The toy's labeled server images: 2-d points labeled by the toy's own rule
# of thumb (class 0 right, 1 up-left, 2 down), so the models score neither 0
# nor 1 on them.
TOY_VAL_X = np.random.default_rng(3).normal(size=(24, 2)).astype(np.float32)
TOY_VAL_Y = np.where(TOY_VAL_X[:, 1] < -0.3, 2,
                     np.where(TOY_VAL_X[:, 0] > 0, 0, 1)).astype(np.int32)


def np_toy_logits(weights, x):
  """The toy classifier: Dense(4, relu) features, Dense(3) head."""
  w1, b1, w2, b2 = [np.asarray(w, np.float64) for w in weights]
  return np.maximum(x @ w1 + b1, 0.0) @ w2 + b2


def assert_labeled_images_of_another_shape_are_refused(build, tmp_path
                                                      ) -> None:
  """`build(data, server_data=...)` on the toy's clients raises a clear
  `DataError` for labeled server images of 3 features (the model's: 2)."""
  data = toy_kd.make_data(str(tmp_path / 'clients'))
  server_data = server_data_lib.ServerData.create(
      str(tmp_path / 'server'), np.zeros([2, 3], np.float32),
      np.zeros([2, 3], np.float32), np.zeros([2], np.int32))
  with pytest.raises(errors.DataError, match='server validation images'):
    build(data, server_data=server_data)


def np_softmax(z):
  """Softmax over the last axis."""
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def np_accuracy(scores, labels):
  """Accuracy of [N, C] scores (logits or probabilities) on [N] labels."""
  return np.mean(np.argmax(scores, -1) == labels)


def np_class_share_ensemble(scores, counts, labels):
  """Each teacher's [K, V, C] scores weighted by its share n_{k,y} / n_y of
  the image's true label y (counts: [K, C] label counts) -> [V, C]."""
  shares = counts / counts.sum(0)  # [K, C]
  return np.einsum('kv,kvc->vc', shares[:, labels], scores)


def expected_links(teacher_logits, labels, own_scores, before_logits,
                   after_logits=None, target_entropy: Optional[float] = -1.0
                   ) -> dict:
  """The link table (`links.NAMES`) in numpy.

  Args:
    teacher_logits: [K, V, C] the round's (valid) teachers on the labeled
      images.
    labels: [V] int labels.
    own_scores: [V, C] the method's own ensemble (logits or probabilities).
    before_logits: [V, C] the averaged model (the student's start).
    after_logits: [V, C] the student the round returns; None: the server
      changed nothing (it is the averaged model).
    target_entropy: The expected `target_entropy` (-1: no target); None:
      not known here, left out of the table.

  Returns:
    A dict over `links.NAMES` (less `target_entropy` where it is None).
  """
  teacher_logits = np.asarray(teacher_logits)
  if after_logits is None:
    after_logits = before_logits
  want = {
      'teacher_labeled_accuracy': np.mean(
          [np_accuracy(t, labels) for t in teacher_logits]),
      'ensemble_labeled_accuracy': np_accuracy(own_scores, labels),
      'ensemble_labeled_accuracy_logits': np_accuracy(
          teacher_logits.mean(0), labels),
      'ensemble_labeled_accuracy_probs': np_accuracy(
          np_softmax(teacher_logits).mean(0), labels),
      'labeled_accuracy_before': np_accuracy(before_logits, labels),
      'labeled_accuracy_after': np_accuracy(after_logits, labels),
      'target_entropy': target_entropy,
  }
  assert tuple(want) == links.NAMES
  if target_entropy is None:
    del want['target_entropy']
  return want


def assert_links_match(metrics, want: dict, rtol: float = 1e-6) -> None:
  """Each link of `want` (`expected_links`) equals the reported one."""
  for name, value in want.items():
    np.testing.assert_allclose(metrics[name], value, rtol=rtol, err_msg=name)


def assert_round_unchanged(plain_outputs, measured_outputs,
                           key: str = 'finalizer') -> None:
  """Rounds with the link table measured equal those without, bit for bit.

  The states' leaves are equal, `metrics[key]` has the same names in both,
  every name of `links.NAMES` among them; the other metrics are equal and
  every link of the plain rounds reads -1 (not measured).
  """
  plain_outputs, measured_outputs = list(plain_outputs), list(
      measured_outputs)
  assert len(plain_outputs) == len(measured_outputs)
  for plain, measured in zip(plain_outputs, measured_outputs):
    for a, b in zip(tf.nest.flatten(plain.state),
                    tf.nest.flatten(measured.state)):
      np.testing.assert_array_equal(a, b)
    m, m_links = plain.metrics[key], measured.metrics[key]
    assert list(m) == list(m_links)  # The same measurement keys.
    assert set(links.NAMES) <= set(m)
    for name in m:
      if name not in links.NAMES:
        np.testing.assert_array_equal(m[name], m_links[name], err_msg=name)
      else:
        assert m[name] == -1.0, name


def assert_links_in_range(metrics, target_classes: Optional[int] = None
                          ) -> None:
  """Every accuracy link lies in [0, 1]; `target_entropy` reads -1 where
  the method distils on no target (`target_classes` None), else lies in
  (0, log target_classes]."""
  for name in links.NAMES:
    if name != 'target_entropy':
      assert 0.0 <= metrics[name] <= 1.0, (name, metrics[name])
  entropy = metrics['target_entropy']
  if target_classes is None:
    assert entropy == -1.0, entropy
  else:
    assert 0 < entropy < np.log(target_classes) + 1e-6, entropy


# The link-table columns a KD method leaves blank in `compare`'s summary.
NOT_IN_THE_SUMMARY = {
    # FedGen's server step trains its generator and distils no target into
    # the model: `target_entropy` reads -1 (not measured).
    'fedgen': {'target_entropy'},
    # FedFTG's student distils on freshly generated batches, no fixed pool
    # whose target entropy could be measured: -1.
    'fedftg': {'target_entropy'},
}


def link_table_row(history: Union[str, Sequence[Mapping[str, Any]]],
                   method: str) -> dict[str, str]:
  """A run's row of the link table of `compare`'s `summary.md`.

  Args:
    history: The run's folder (its `metrics.csv`), or its rounds' metrics
      (`RunResult.history`).
    method: The method it ran (the row's label).

  Returns:
    Every link name of `links.NAMES` and 'after > before' -> the row's cell
    ('' where the summary's table has none).
  """
  if isinstance(history, str):
    columns = plots.read_metrics(history)
  else:
    keys = sorted({k for h in history for k in h})
    columns = {k: [h.get(k, math.nan) for h in history] for k in keys}
  row = compare.summarize_entry(compare.StudyEntry(method, method),
                                [compare.run_stats(0, columns)])
  # The link table is the summary's last table (after '## Mechanism
  # diagnostics'): its header, a rule, the row.
  markdown = compare.study_markdown([row], title=method)
  table = markdown.split('## Mechanism diagnostics')[1].strip().splitlines()
  names = (*links.NAMES, 'after > before')
  if len(table) < 3 or not table[-1].startswith(f'| {method} | '):
    return dict.fromkeys(names, '')

  def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip('|').split('|')][1:]

  found = dict(zip(cells(table[-3]), cells(table[-1])))
  return {name: found.get(name, '') for name in names}


def assert_fills_the_link_table(
    history: Union[str, Sequence[Mapping[str, Any]]], method: str) -> None:
  """In `compare`'s summary of this run, the method's row of the link table
  fills every column, but exactly those of `NOT_IN_THE_SUMMARY[method]`.

  Args:
    history: As `link_table_row`'s.
    method: The KD method it ran.
  """
  row = link_table_row(history, method)
  blank = {name for name, cell in row.items() if not cell}
  assert blank == NOT_IN_THE_SUMMARY.get(method, set()), (method, row)
