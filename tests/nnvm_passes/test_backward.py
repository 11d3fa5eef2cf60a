"""Which tensors the backward pass keeps, as read from MXNet's own gradient graphs."""
import mxnet as mx
import numpy as np
import pytest

import tofu_mx  # noqa: F401  (MXNet settings)
from nnvm_passes.backward import (backward_reads, kept_for_backward, kept_tensors,
                                  passes_gradient_through)
from nnvm_passes.importer import import_symbol
from tofu_mx.search.cut import needs_grad_of


def _symbol():
    data = mx.sym.var("data")
    conv = mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), pad=(1, 1), name="conv")
    relu = mx.sym.Activation(conv, act_type="relu", name="relu")
    tanh = mx.sym.Activation(relu, act_type="tanh", name="tanh")
    add = mx.sym.elemwise_add(tanh, relu, name="add")
    flat = mx.sym.Flatten(add, name="flat")
    fc = mx.sym.FullyConnected(flat, num_hidden=3, name="fc")
    return mx.sym.SoftmaxOutput(fc, name="softmax")


def _graph():
    return import_symbol(_symbol(), data=(2, 3, 5, 5), softmax_label=(2,))


@pytest.mark.parametrize("name, inputs, outputs", [
    ("conv", {0, 1, 2}, set()),        # data, weight and bias
    ("relu", set(), {0}),              # its output only
    ("tanh", {0}, {0}),                # MXNet's Activation gradient takes the input as well
    ("add", set(), set()),
    ("flat", set(), set()),
    ("fc", {0, 1}, set()),              # not the bias
    ("softmax", {1}, {0}),             # label and probabilities
])
def test_backward_reads_match_mxnet(name, inputs, outputs):
    g = _graph()
    assert backward_reads(g.node(name), g) == (frozenset(inputs), frozenset(outputs))


def test_kept_tensors_are_those_a_gradient_reads():
    g = _graph()
    kept = kept_for_backward(g, needs_grad_of(g))
    by_name = {g.nodes[i].name: readers for (i, j), readers in kept.items() if j == 0}
    idx = {n.name: i for i, n in enumerate(g.nodes)}
    assert by_name["conv"] == set()               # relu's gradient reads relu's output,
    assert by_name["relu"] == {idx["relu"], idx["tanh"]}    # and tanh's reads its input
    assert by_name["tanh"] == {idx["tanh"]}
    assert by_name["add"] == set()                # nothing reads add's output or flat's
    assert by_name["flat"] == {idx["fc"]}
    assert by_name["fc"] == set()
    assert by_name["softmax"] == {idx["softmax"]}


def test_no_gradient_no_kept_tensor():
    g = _graph()
    none = {t: False for t in needs_grad_of(g)}
    assert not any(kept_for_backward(g, none).values())


def test_memory_per_device_counts_kept_activations():
    g = _graph()
    ptd = tofu_mx.partition(_symbol(), [mx.cpu(0)],
                            data=(2, 3, 5, 5), softmax_label=(2,))
    kept = kept_for_backward(g, needs_grad_of(g))
    want = sum(g.nodes[i].outputs[j].nbytes for (i, j), r in kept.items() if r)
    assert ptd.memory_per_device()[0].activations == want
    assert want == np.dtype("float32").itemsize * (2 * 4 * 25 * 2 + 2 * 100 + 2 * 3)



def test_a_mirrored_reader_holds_what_its_copy_reads_beneath_the_mirrored_nodes():
    """MXNet builds a node marked __force_mirroring__ again in the backward pass, from its
    inputs (themselves built again where marked), and the gradient reads that copy."""
    data = mx.sym.var("data")
    conv0 = mx.sym.Convolution(data, num_filter=4, kernel=(1, 1), name="conv0")
    cut = mx.sym.split(conv0, num_outputs=2, axis=1, name="cut",
                       attr={"__force_mirroring__": "True"})
    join = mx.sym.concat(cut[1], cut[0], dim=1, name="join",
                         attr={"__force_mirroring__": "True"})
    conv1 = mx.sym.Convolution(join, num_filter=4, kernel=(1, 1), name="conv1",
                               attr={"__force_mirroring__": "True"})
    kept_copy = mx.sym.identity(conv1, name="held")
    tanh = mx.sym.Activation(kept_copy, act_type="tanh", name="tanh")    # reads its input
    out = mx.sym.LinearRegressionOutput(tanh, name="loss")
    g = import_symbol(out, data=(2, 4, 3, 3), loss_label=(2, 4, 3, 3))
    kept = kept_for_backward(g, needs_grad_of(g))
    idx = {n.name: i for i, n in enumerate(g.nodes)}
    readers = {g.nodes[i].name: {g.nodes[r].name for r in rs} for (i, j), rs in kept.items()
               if rs and j == 0}
    # conv1's copy reads join's copy, which reads cut's copy, which reads conv0: held there;
    # neither join nor cut is; tanh (unmarked) reads held's output, kept as always
    assert readers == {"conv0": {"cut"}, "held": {"tanh"}, "tanh": {"tanh"},
                       "loss": {"loss"}}
    assert not kept[(idx["join"], 0)] and not kept[(idx["conv1"], 0)]
    # the kept tensors alone, and every operator output with the rest empty, agree
    assert kept_tensors(g, needs_grad_of(g)) == {t: r for t, r in kept.items() if r}
    assert kept_tensors(_graph(), needs_grad_of(_graph())) == \
        {t: r for t, r in kept_for_backward(_graph(), needs_grad_of(_graph())).items() if r}


@pytest.mark.parametrize("name, passes", [
    ("conv", False), ("relu", False), ("tanh", False),
    ("add", True),                     # elemwise_add hands its output gradient on unchanged
    ("flat", False), ("fc", False), ("softmax", False),
])
def test_passes_gradient_through(name, passes):
    g = _graph()
    assert passes_gradient_through(g.node(name), g) is passes


def test_add_n_passes_gradient_through():
    a, b = mx.sym.var("a"), mx.sym.var("b")
    g = import_symbol(mx.sym.add_n(a, b, name="sum") * a, a=(2, 3), b=(2, 3))
    assert passes_gradient_through(g.node("sum"), g)
    assert not passes_gradient_through(g.nodes[-1], g)     # elemwise_mul: _backward_mul


def test_inputs_too_big_to_bind_are_bound_with_a_batch_of_one():
    """A convolution over 48 x 64 x 224 x 224 floats (590 MB, over the 256 MB bound) is bound
    with batch 1, and reads what the small one reads; one whose batch-1 input alone is over
    2 GB gives the upper bound (everything read)."""
    from nnvm_passes.backward import _small_shapes
    attrs = (("kernel", "(3, 3)"), ("num_filter", "4"), ("pad", "(1, 1)"))
    types = {"in0": "float32", "in1": "float32", "in2": "float32"}
    big = ((48, 64, 224, 224), (4, 64, 3, 3), (4,))
    assert _small_shapes("Convolution", attrs, 1, big, types) == \
        ((1, 64, 224, 224), (4, 64, 3, 3), (4,))
    small = ((2, 64, 8, 8), (4, 64, 3, 3), (4,))
    assert _small_shapes("Convolution", attrs, 1, small, types) == small
    huge = ((2, 9000, 256, 256), (4, 9000, 3, 3), (4,))     # 2.4 GB at batch 1
    assert _small_shapes("Convolution", attrs, 1, huge, types) is None
    bad = ((48, 64, 224, 224), (4, 32, 3, 3), (4,))          # MXNet refuses the shapes
    assert _small_shapes("Convolution", attrs, 1, bad, types) is None


@pytest.mark.parametrize("sparse_grad", [False, True])
def test_an_embedding_reads_its_indices_whatever_its_gradient_storage(sparse_grad):
    """With ``sparse_grad`` MXNet refuses a dense gradient array for the weight: the probe
    falls back to ``simple_bind`` and reads the same as without it, not the upper bound."""
    emb = mx.sym.Embedding(mx.sym.var("data"), input_dim=100, output_dim=8,
                           sparse_grad=sparse_grad, name="emb")
    g = import_symbol(mx.sym.make_loss(mx.sym.sum(emb), name="loss"), data=(4, 5))
    assert backward_reads(g.node("emb"), g) == (frozenset({0}), frozenset())


def test_the_probe_binds_without_touching_its_arrays():
    """Probing a convolution over a 128 MiB input costs address space, not memory: its
    arrays and their gradients (258 MiB, which ``simple_bind`` zero-fills) are never
    touched, so the peak resident size hardly moves."""
    from nnvm_passes.backward import _derive

    def status_mib(field):
        with open("/proc/self/status") as f:
            return next(int(row.split()[1]) / 1024 for row in f if row.startswith(field + ":"))
    try:
        mx.nd.waitall()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                  # resets VmHWM, the peak, to the resident size now
    except OSError:
        pytest.skip("needs Linux's /proc/self/clear_refs")
    before = status_mib("VmHWM")
    shapes = ((1, 512, 256, 256), (512, 512, 1, 1))
    found = _derive("Convolution", (("kernel", "(1, 1)"), ("no_bias", "True"),
                                    ("num_filter", "512")), shapes, ("float32", "float32"), 1)
    mx.nd.waitall()
    assert found.inputs == frozenset({0, 1})
    assert status_mib("VmHWM") - before < 64


@pytest.mark.parametrize("op, follows", [("transpose", True), ("negative", True),
                                         ("sin", False), ("Flatten", False)])
def test_a_gradient_made_by_operators_placed_with_their_inputs_follows_the_sum(op, follows):
    """transpose's gradient is a transpose, which MXNet places with its input (the summed
    output gradient), not with the forward node as it places ``_backward_*`` operators."""
    x = mx.sym.var("x")
    y = getattr(mx.sym, op)(x, name="y")
    g = import_symbol(y * x, x=(3, 3))
    assert passes_gradient_through(g.node("y"), g) is follows


@pytest.mark.parametrize("k", [2, 3, 6])
def test_a_transposed_input_read_across_devices_binds(k):
    """Seen by the Gluon fuzzer (a TNC RNN after a transpose of the data, k = 6): the
    transpose's gradient was made on the reader's device, away from the data's."""
    from tests.tofu_mx.runtime.helpers import partition_and_verify
    t = mx.sym.transpose(mx.sym.var("data"), axes=(1, 0, 2), name="tr")
    y = mx.sym.RNN(t, mx.sym.var("rnn_params"), mx.sym.var("state0"), state_size=5,
                   num_layers=1, mode="gru", name="rnn")
    ptd, report = partition_and_verify(mx.sym.MakeLoss(mx.sym.sum(mx.sym.square(y))), k,
                                       data=(3, 7, 7), state0=(1, 3, 5))
    assert report.ok and not ptd.fallbacks
