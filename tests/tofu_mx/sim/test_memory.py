"""Per-device memory over a training step: the end of the forward pass, and the peak."""
import pytest

from tofu_mx.errors import InvalidArgumentError
from tofu_mx.sim.memory import held_at_forward_end, peak_memory


def test_the_end_of_the_forward_pass_holds_variables_and_kept_outputs(two_devices):
    """dev0: data 96 B, weights 84 B and their gradients 84 B (momentum: 84 B more); dev1:
    relu's output (48 B), which relu's gradient reads; fc's gradient reads only data."""
    graph, device_of = two_devices
    rows = held_at_forward_end(graph, device_of, 2, optimizer_state=1)
    assert rows[0] == dict(weights=84, gradients=84, optimizer=84, aux=0, inputs=96,
                           activations=0)
    assert rows[1] == dict(weights=0, gradients=0, optimizer=0, aux=0, inputs=0,
                           activations=48)


def test_the_peak_follows_each_buffer_from_its_maker_to_its_last_reader(two_devices):
    """dev0 holds 264 B of variables. Forward: fc's output (48), freed at once (it is read
    only on dev1, and not kept). Backward: the gradient of fc's output received from dev1
    (48). Peak 264 + 48 = 312.

    dev1, forward: fc's output copied in (48) and relu's output (48): 96; the copy freed
    (relu's gradient reads only its output): 48; sum's output (4): 52; loss's (4): 56; sum's
    output freed: 52. Backward: loss's gradient for sum's output (4): 56; sum's for relu's
    output (48): 104, then sum's output gradient freed: 100; relu's for fc's output (48):
    148 (the peak), then relu's output gradient and relu's output freed: 52.

    On one device: the same walk with no copies: 96 in the forward pass, 148 in the backward
    pass, on 264 B of variables: 412."""
    graph, device_of = two_devices
    assert peak_memory(graph, device_of, 2) == (312, 148)
    assert peak_memory(graph, device_of, 2, optimizer_state=2) == (312 + 2 * 84, 148)
    assert peak_memory(graph, lambda i: 0, 1) == (412,)


def test_a_negative_optimizer_state_is_refused(two_devices):
    graph, device_of = two_devices
    with pytest.raises(InvalidArgumentError, match="optimizer_state"):
        peak_memory(graph, device_of, 2, optimizer_state=-1)
