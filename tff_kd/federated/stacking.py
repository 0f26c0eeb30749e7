"""TFF stacking aggregator: every client's update reaches the server.

The KD methods' aggregator (FedDF, Lin et al., NeurIPS 2020; FedD3A; FedGen,
Zhu et al., ICML 2021; FedFTG; DaFKD, Wang et al., CVPR 2023): a
`tff.federated_aggregate` that reports a fixed-size `Stack` of the round's
client values (`tff_kd.core.stacking`), so the server step sees each
teacher, and their FedAvg mean. Its accumulator holds the stack's rows as
separate slots, so that TFF's C++ runtime needs memory linear in the
clients per round K, not K^2 (`build_stacking_aggregator`;
studies/speed/results/stack_memory.md).
"""

from typing import Any, Callable, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_kd.core import stacking as stacking_tf
from tff_kd.federated import execution
from tff_kd.federated import tff_types


def build_stacking_aggregator(
    value_type: tff.Type, num_slots: int,
    clients_per_value: Optional[int] = None
) -> tff.templates.AggregationProcess:
  """Collects every client's value (and weight) into a [M, ...] stack.

  A `tff.federated_aggregate` whose accumulator is `tff_kd.core.stacking.
  Slots`: M separate slots, each empty ([0, n]) or holding one client's
  value flattened to one vector per dtype ([1, n]). A step passes the
  client's value into slot `count` and every other slot on unchanged
  (`slots_accumulate`), so it allocates one flat copy of the client's value
  (none for a value with one leaf per dtype), whatever M is. The report
  (`slots_to_stack`) is the `tff_kd.core.stacking.Stack` that
  `build_dense_stacking_aggregator` gives, value for value.

  Why not one [M, ...] accumulator: TFF 0.87's C++ runtime keeps every
  step's accumulator until the round's aggregate is done. The federating
  executor's AGGREGATE (`CallFederatedIntrinsic` in
  cc/core/impl/executors/federating_executor.cc) issues all K
  `CreateCall(accumulate, <current, client>)` at once, each on the
  previous one's result; `TensorFlowExecutor::CreateCall`
  (tensorflow_executor.cc) runs a call as a `std::packaged_task`
  (`ThreadRun`, threading.h) whose lambda captures its argument's future,
  and that lambda lives in the task's shared state as long as the call's
  own future does. So the last step's future holds the whole chain. A
  [M, ...] accumulator that each step rewrites then costs K x M x P values
  at once (with M = K, the measured 4 K^2 P bytes:
  studies/speed/results/stack_memory.md); slots that steps pass on share
  their buffers, so the worker's memory grows linearly in K (measured: 7-10
  P-sized copies per client, most of them TFF's own copies of the M-row
  report).

  With `clients_per_value` G (an int), each TFF client's value is a
  `tff_kd.core.stacking.GroupRows` of G clients (a call that runs G
  clients, `tff_kd.federated.execution.train_rows`) and its TFF weight is
  ignored: the rows of weight > 0 go into one slot together
  (`slots_accumulate_rows`), and the report is the `Stack` that G times
  as many TFF clients of one row each would give.

  Args:
    value_type: Unplaced type of one client's value (with G > 1, of a
      `GroupRows`).
    num_slots: M, the most clients one round may have.
    clients_per_value: G, the clients each value holds as rows; None: one
      client's value, not rows.

  Returns:
    A weighted `tff.templates.AggregationProcess` (stateless); its
    measurement is the number of clients stacked.
  """
  if clients_per_value is not None:
    return _federated_stack(value_type, num_slots,
                            _grouped(clients_per_value))
  return _federated_stack(value_type, num_slots, _SLOTS)


def build_dense_stacking_aggregator(
    value_type: tff.Type, num_slots: int) -> tff.templates.AggregationProcess:
  """`build_stacking_aggregator` with one [M, ...] `Stack` as accumulator.

  The same result; kept as the reference that tests and
  studies/speed/stack_memory.py compare with. Its accumulate steps rewrite
  the whole stack, so TFF's C++ runtime holds K x M x P values at once
  (see `build_stacking_aggregator`).

  Args:
    value_type: Unplaced type of one client's value.
    num_slots: M, the most clients one round may have.

  Returns:
    As `build_stacking_aggregator`.
  """
  return _federated_stack(value_type, num_slots, _DENSE)


class _Formulation(NamedTuple):
  """How an accumulator of the stack is made, filled, merged and reported
  (`tff_kd.core.stacking`'s functions of one formulation)."""

  wrap: Callable[..., Any]  # The accumulator's NamedTuple class.
  empty: Callable[[Any, int], Any]
  accumulate: Callable[[Any, Any, Any], Any]
  merge: Callable[[Any, Any], Any]
  report: Callable[[Any, Any], stacking_tf.Stack]
  # The specs of one row of the stack, from those of one client's value.
  row_specs: Callable[[Any], Any] = lambda specs: specs


_SLOTS = _Formulation(stacking_tf.Slots, stacking_tf.empty_slots,
                      stacking_tf.slots_accumulate, stacking_tf.slots_merge,
                      stacking_tf.slots_to_stack)
_DENSE = _Formulation(stacking_tf.Stack, stacking_tf.empty_stack,
                      stacking_tf.stack_accumulate, stacking_tf.stack_merge,
                      lambda stack, specs: stack)


def _grouped(clients_per_value: int) -> _Formulation:
  """The slots formulation for `GroupRows` of G clients each."""

  def row_specs(specs):
    return tf.nest.map_structure(
        lambda s: tf.TensorSpec(s.shape[1:], s.dtype),
        stacking_tf.GroupRows(*specs).values)

  return _SLOTS._replace(
      empty=lambda specs, n: stacking_tf.empty_slots(specs, n,
                                                     clients_per_value),
      accumulate=lambda slots, value, weight: (
          stacking_tf.slots_accumulate_rows(
              slots, stacking_tf.GroupRows(*value))),
      merge=stacking_tf.slots_merge_rows, row_specs=row_specs)


def _federated_stack(value_type: tff.Type, num_slots: int,
                     formulation: _Formulation
                     ) -> tff.templates.AggregationProcess:
  """The stacking process of one `_Formulation` of its accumulator."""
  specs = formulation.row_specs(tff_types.tensor_specs(value_type))
  stacking_tf.empty_stack(specs, num_slots)  # Validates num_slots.
  wrap = formulation.wrap

  @tff.tensorflow.computation
  def zeros():
    return formulation.empty(specs, num_slots)

  accumulator_type = zeros.type_signature.result

  @tff.tensorflow.computation(
      accumulator_type, tff.types.StructWithPythonType(
          [value_type, tff.TensorType(np.float32)], tuple))
  def accumulate(accumulator, value_and_weight):
    value, weight = value_and_weight
    return formulation.accumulate(wrap(*accumulator), value, weight)

  @tff.tensorflow.computation(accumulator_type, accumulator_type)
  def merge(first, second):
    return formulation.merge(wrap(*first), wrap(*second))

  @tff.tensorflow.computation(accumulator_type)
  def report(accumulator):
    return formulation.report(wrap(*accumulator), specs)

  return _aggregation_process(value_type, zeros, accumulate, merge, report)


def _aggregation_process(
    value_type: tff.Type, zeros: tff.Computation,
    accumulate: tff.Computation, merge: tff.Computation,
    report: tff.Computation) -> tff.templates.AggregationProcess:
  """The stateless, weighted process of one `tff.federated_aggregate`
  whose report is a `Stack`; its measurement is the stack's count."""
  stack_type = report.type_signature.result

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
    client_work: tff.templates.MeasuredProcess, num_slots: int,
    client_execution: execution.ClientExecution = execution.ONE_BY_ONE
) -> tuple[tff.templates.AggregationProcess, tff.Type]:
  """`build_stacking_aggregator` for a client work's updates.

  Args:
    client_work: The client work; where `client_execution` is grouped, its
      update is a `GroupRows` of G clients (`execution.train_rows`).
    num_slots: M, the most clients one round may have.
    client_execution: How each TFF client call runs its clients.

  Returns:
    The aggregator and the unplaced type of the `Stack` it reports (what
    the finalizer receives; the same for any G).
  """
  update_type = client_work.next.type_signature.result.result.member.update
  aggregator = build_stacking_aggregator(
      update_type, num_slots,
      client_execution.clients_per_call if client_execution.grouped
      else None)
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
