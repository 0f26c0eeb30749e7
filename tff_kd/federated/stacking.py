"""TFF stacking aggregator: every client's update reaches the server.

The KD methods' aggregator (FedDF, Lin et al., NeurIPS 2020; FedD3A; FedGen,
Zhu et al., ICML 2021; FedFTG; DaFKD, Wang et al., CVPR 2023): a
`tff.federated_aggregate` whose accumulator is a fixed-size `Stack` of the
round's client values (`tff_kd.core.stacking`), so the server step sees each
teacher, and their FedAvg mean.
"""

import numpy as np
import tensorflow_federated as tff

from tff_kd.core import stacking as stacking_tf
from tff_kd.federated import learning


def build_stacking_aggregator(
    value_type: tff.Type, num_slots: int) -> tff.templates.AggregationProcess:
  """Collects every client's value (and weight) into a [M, ...] stack.

  A `tff.federated_aggregate` with `tff_kd.core.stacking.stack_accumulate` /
  `stack_merge`; the result at the server is a `tff_kd.core.stacking.Stack`.

  Args:
    value_type: Unplaced type of one client's value.
    num_slots: M, the most clients one round may have.

  Returns:
    A weighted `tff.templates.AggregationProcess` (stateless); its
    measurement is the number of clients stacked.
  """
  specs = learning.tensor_specs(value_type)
  stacking_tf.empty_stack(specs, num_slots)  # Validates num_slots.

  @tff.tensorflow.computation
  def zeros():
    return stacking_tf.empty_stack(specs, num_slots)

  stack_type = zeros.type_signature.result

  @tff.tensorflow.computation(
      stack_type, tff.types.StructWithPythonType(
          [value_type, tff.TensorType(np.float32)], tuple))
  def accumulate(stack, value_and_weight):
    value, weight = value_and_weight
    return stacking_tf.stack_accumulate(stacking_tf.Stack(*stack), value,
                                        weight)

  @tff.tensorflow.computation(stack_type, stack_type)
  def merge(first, second):
    return stacking_tf.stack_merge(stacking_tf.Stack(*first),
                                stacking_tf.Stack(*second))

  @tff.tensorflow.computation(stack_type)
  def report(stack):
    return stack

  @tff.tensorflow.computation(stack_type)
  def count_of(stack):
    return stack[2]

  @tff.federated_computation
  def init_fn():
    return tff.federated_value((), tff.SERVER)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
      tff.FederatedType(np.float32, tff.CLIENTS))
  def next_fn(state, value, weight):
    stack = tff.federated_aggregate(
        tff.federated_zip((value, weight)), zeros(), accumulate, merge,
        report)
    return tff.templates.MeasuredProcessOutput(
        state=state, result=stack,
        measurements=tff.federated_map(count_of, stack))

  return tff.templates.AggregationProcess(init_fn, next_fn)


def build_client_stack(
    client_work: tff.templates.MeasuredProcess, num_slots: int
) -> tuple[tff.templates.AggregationProcess, tff.Type]:
  """`build_stacking_aggregator` for a client work's updates.

  Returns:
    The aggregator and the unplaced type of the `Stack` it reports (what
    the finalizer receives).
  """
  update_type = client_work.next.type_signature.result.result.member.update
  aggregator = build_stacking_aggregator(update_type, num_slots)
  return aggregator, aggregator.next.type_signature.result.result.member


def build_weighted_sum_aggregator(
    value_type: tff.Type) -> tff.templates.AggregationProcess:
  """(sum_k w_k v_k, sum_k w_k) at the server: a mean without a stack.

  For the parts of a client update that the server only averages (e.g.
  DaFKD's generator, eq. 4): its accumulator holds one value, where a
  stack holds M, so memory does not grow with the clients per round. The
  server divides (`tff_kd.core.stacking.weighted_mean`).

  Args:
    value_type: Unplaced type of one client's value (float tensors).

  Returns:
    A weighted, stateless `tff.templates.AggregationProcess`; its result is
    `(weighted sum, total weight)`, its measurement the total weight.
  """

  @tff.tensorflow.computation(value_type, np.float32)
  def scale(value, weight):
    return stacking_tf.scaled(value, weight)

  @tff.federated_computation
  def init_fn():
    return tff.federated_value((), tff.SERVER)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
      tff.FederatedType(np.float32, tff.CLIENTS))
  def next_fn(state, value, weight):
    total = tff.federated_sum(weight)
    summed = tff.federated_sum(
        tff.federated_map(scale, tff.federated_zip((value, weight))))
    return tff.templates.MeasuredProcessOutput(
        state=state, result=tff.federated_zip((summed, total)),
        measurements=total)

  return tff.templates.AggregationProcess(init_fn, next_fn)
