"""The client learning-rate schedule kept in a client work's state.

`build_round_schedule`: the round's rate `lr * decay**round`, from the round
number the client work keeps at the server (so a resumed run continues it).
"""


import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd import errors


def check_schedule(learning_rate: float, learning_rate_decay: float) -> None:
  """The one check of a client learning-rate schedule `lr * decay**round`.

  Every builder calls it before building anything; configs are checked by
  `client_optimizer`'s settings with the same bounds.

  Raises:
    ConfigError: unless lr is finite and > 0 and the decay is in (0, 1].
  """
  if not (_is_finite_number(learning_rate) and learning_rate > 0):
    raise errors.ConfigError(
        f'client learning rate must be > 0 and finite, got {learning_rate!r}')
  if not (_is_finite_number(learning_rate_decay) and
          0 < learning_rate_decay <= 1):
    raise errors.ConfigError('client learning-rate decay must be in (0, 1], '
                             f'got {learning_rate_decay!r}')


def _is_finite_number(value) -> bool:
  return (isinstance(value, (int, float, np.integer, np.floating)) and
          not isinstance(value, bool) and np.isfinite(value))


def build_round_schedule(learning_rate: float, learning_rate_decay: float
                         ) -> tuple[tff.Computation, tff.Computation]:
  """TF computations (round -> `lr * decay**round`, round -> round + 1)."""

  @tff.tensorflow.computation(np.int32)
  def round_learning_rate(round_num):
    return tf.constant(learning_rate, tf.float32) * tf.pow(
        tf.constant(learning_rate_decay, tf.float32),
        tf.cast(round_num, tf.float32))

  @tff.tensorflow.computation(np.int32)
  def increment(round_num):
    return round_num + 1

  return round_learning_rate, increment
