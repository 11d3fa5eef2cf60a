"""Parameters in and out of the shards, checkpoints in the ordinary format, bad input, and a
few SGD steps that match one device step for step."""
import re
import warnings

import mxnet as mx
import numpy as np
import pytest

import tofu_mx
from tests.tofu_mx.runtime.helpers import partition_quietly
from tofu_mx import models
from tofu_mx.values import random_inputs
from nnvm_passes.importer import import_symbol


def small_wresnet():
    return models.wresnet(14, widen=1, num_classes=10), models.input_shapes("wresnet", 24,
                                                                             image_size=32)


def whole_params(sym, shapes, seed=0):
    graph = import_symbol(sym, **shapes)
    values = random_inputs(graph, seed)
    args = {n.name: mx.nd.array(values[n.name]) for n in graph.variables("param")}
    aux = {n.name: mx.nd.array(values[n.name]) for n in graph.variables("aux")}
    return args, aux


partition = partition_quietly


def test_split_merge_round_trip_and_devices():
    sym, shapes = small_wresnet()
    ptd = partition(sym, 4, **shapes)
    args, aux = whole_params(sym, shapes)
    arg_shards, aux_shards = ptd.split_params(args, aux)
    by_name = {s.name: s for s in ptd.shards}
    for name, array in {**arg_shards, **aux_shards}.items():
        assert array.context == mx.cpu(by_name[name].device)
        assert array.shape == by_name[name].shape
    # no shard of a split weight is the whole weight
    split = [s for s in ptd.shards if s.kind == "param" and s.shape != ptd.graph.node(
        s.source).outputs[0].shape]
    assert split, "the plan should split some weights at k=4"
    back_args, back_aux = ptd.merge_params(arg_shards, aux_shards)
    for name in args:
        np.testing.assert_array_equal(back_args[name].asnumpy(), args[name].asnumpy())
    for name in aux:
        np.testing.assert_array_equal(back_aux[name].asnumpy(), aux[name].asnumpy())


def test_checkpoint_8_to_file_to_3_is_lossless(tmp_path):
    sym, shapes = small_wresnet()
    args, aux = whole_params(sym, shapes, seed=3)
    eight = partition(sym, 8, **shapes)
    eight.simple_bind(grad_req="null")
    eight.set_params(args, aux)
    path = str(tmp_path / "w.params")
    eight.save_params(path)
    saved = mx.nd.load(path)
    assert set(saved) == {f"arg:{n}" for n in args} | {f"aux:{n}" for n in aux}
    three = partition(sym, 3, **shapes)
    three.simple_bind(grad_req="null")
    three.load_params(path)
    got_args, got_aux = three.get_params()
    for name in args:
        np.testing.assert_array_equal(got_args[name].asnumpy(), args[name].asnumpy())
    for name in aux:
        np.testing.assert_array_equal(got_aux[name].asnumpy(), aux[name].asnumpy())
    # the unpartitioned symbol loads the same file as it is
    mod_args = {k[4:]: v for k, v in saved.items() if k.startswith("arg:")}
    exe = sym.simple_bind(mx.cpu(), grad_req="null", **shapes)
    exe.copy_params_from(mod_args, {k[4:]: v for k, v in saved.items() if k.startswith("aux:")})


def test_load_before_bind_and_bad_files(tmp_path):
    sym, shapes = small_wresnet()
    args, aux = whole_params(sym, shapes, seed=5)
    ptd = partition(sym, 2, **shapes)
    path = str(tmp_path / "ok.params")
    mx.nd.save(path, {**{f"arg:{k}": v for k, v in args.items()},
                      **{f"aux:{k}": v for k, v in aux.items()}})
    ptd.load_params(path)              # kept until bind
    ptd.simple_bind(grad_req="null")
    before = {k: v.asnumpy().copy() for k, v in ptd.executor.arg_dict.items()}
    first = next(iter(args))
    bad = dict(args)
    bad.pop(first)
    mx.nd.save(str(tmp_path / "missing.params"), {f"arg:{k}": v for k, v in bad.items()})
    with pytest.raises(tofu_mx.CheckpointError, match=f"missing arg.*{first}"):
        ptd.load_params(str(tmp_path / "missing.params"))
    mx.nd.save(str(tmp_path / "extra.params"),
               {**{f"arg:{k}": v for k, v in args.items()}, "arg:nope": mx.nd.zeros(1),
                **{f"aux:{k}": v for k, v in aux.items()}})
    with pytest.raises(tofu_mx.CheckpointError, match="extra arg.*nope"):
        ptd.load_params(str(tmp_path / "extra.params"))
    misshaped = {**{f"arg:{k}": v for k, v in args.items()},
                 **{f"aux:{k}": v for k, v in aux.items()}}
    misshaped[f"arg:{first}"] = mx.nd.zeros((1, 2))
    mx.nd.save(str(tmp_path / "shape.params"), misshaped)
    with pytest.raises(tofu_mx.CheckpointError, match=f"{first} has shape \\(1, 2\\)"):
        ptd.load_params(str(tmp_path / "shape.params"))
    (tmp_path / "junk.params").write_bytes(b"not a params file")
    with pytest.raises(tofu_mx.CheckpointError, match="cannot read"):
        ptd.load_params(str(tmp_path / "junk.params"))
    for k, v in ptd.executor.arg_dict.items():   # a failed load changed nothing
        np.testing.assert_array_equal(v.asnumpy(), before[k])


def test_bad_input_is_rejected_and_nothing_is_mutated():
    sym, shapes = small_wresnet()
    before = sym.tojson()
    with pytest.raises(tofu_mx.ContextError, match="empty"):
        tofu_mx.partition(sym, [], **shapes)
    with pytest.raises(tofu_mx.ContextError, match="twice"):
        tofu_mx.partition(sym, [mx.cpu(0), mx.cpu(0)], **shapes)
    with pytest.raises(tofu_mx.ShapeInferenceError):
        tofu_mx.partition(sym, [mx.cpu(0), mx.cpu(1)])
    x = mx.sym.var("data")
    tiny = mx.sym.MakeLoss(mx.sym.sum(mx.sym.FullyConnected(x, num_hidden=1) ** 2))
    with pytest.raises(tofu_mx.InvalidArgumentError, match="at least 2 long"):
        tofu_mx.partition(tiny, [mx.cpu(i) for i in range(2)], data=(1, 1))
    from tests.tofu_mx.runtime.custom_ops import cube
    custom = mx.sym.MakeLoss(mx.sym.sum(cube(x * 2.0)))
    with pytest.raises(tofu_mx.UnsupportedOperatorError, match="no TDL description"):
        tofu_mx.partition(custom, [mx.cpu(i) for i in range(2)], strict=True, data=(4, 4))
    assert sym.tojson() == before
    ptd = partition(sym, 2, **shapes)
    args, aux = whole_params(sym, shapes)
    copies = {k: v.asnumpy().copy() for k, v in args.items()}
    ptd.split_params(args, aux)
    for k, v in args.items():
        np.testing.assert_array_equal(v.asnumpy(), copies[k])
    assert sym.tojson() == before


@pytest.mark.parametrize("k", [2, 4])
def test_sgd_steps_match_one_device(k):
    """Five SGD steps: the same loss at every step and the same weights after."""
    x = mx.sym.var("data")
    h = mx.sym.Activation(mx.sym.FullyConnected(x, num_hidden=32, name="fc1"), act_type="tanh")
    h = mx.sym.Activation(mx.sym.FullyConnected(h, num_hidden=16, name="fc2"), act_type="relu")
    sym = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(h, num_hidden=10, name="fc3"),
                               name="softmax")
    shapes = {"data": (24, 12), "softmax_label": (24,)}
    types = {"data": "float64", "softmax_label": "float64"}
    rng = np.random.default_rng(0)
    data = rng.standard_normal((24, 12))
    label = rng.integers(0, 10, 24).astype(np.float64)
    graph = import_symbol(sym, dtypes=types, **shapes)
    init = {n.name: rng.standard_normal(n.outputs[0].shape) * 0.3
            for n in graph.variables("param")}
    lr = 0.5

    def run(exe, set_inputs, step_params, read_out):
        set_inputs(exe)
        losses = []
        for _ in range(5):
            exe.forward(is_train=True)
            p = read_out(exe)
            losses.append(-np.mean(np.log(p[np.arange(24), label.astype(int)])))
            exe.backward()
            step_params(exe)
        return losses

    def sgd(exe):
        for name, g in exe.grad_dict.items():
            if g is not None and name in exe.arg_dict and "data" not in name \
                    and "label" not in name:
                exe.arg_dict[name][:] = exe.arg_dict[name] - lr * g / 24

    ref = sym.simple_bind(mx.cpu(0), grad_req={n: "write" if n in init else "null"
                                               for n in sym.list_arguments()},
                          type_dict=types, **shapes)

    def set_ref(exe):
        exe.arg_dict["data"][:] = data
        exe.arg_dict["softmax_label"][:] = label
        for n, v in init.items():
            exe.arg_dict[n][:] = v
    ref_losses = run(ref, set_ref, sgd, lambda e: e.outputs[0].asnumpy())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ptd = tofu_mx.partition(sym, [mx.cpu(i) for i in range(k)], dtypes=types, **shapes)
    exe = ptd.simple_bind(grad_req={n: "write" for n in init})

    def set_ptd(e):
        for name, value in ptd.split_arrays({"data": data, "softmax_label": label,
                                             **init}).items():
            e.arg_dict[name][:] = value
    losses = run(exe, set_ptd, sgd, lambda e: e.outputs[0].asnumpy())
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
    assert losses[-1] < losses[0]
    got, _ = ptd.get_params()
    for name in init:
        np.testing.assert_allclose(got[name].asnumpy(), ref.arg_dict[name].asnumpy(),
                                   rtol=1e-9, atol=1e-12)


def test_a_graph_without_a_loss_head_backward_needs_out_grads_as_on_one_device():
    """A graph whose outputs are not loss heads (inference, or a loss computed outside) is
    partitioned as it is, with no warning, and its report says that backward() needs the
    outputs' gradients. Without them the partitioned executor refuses as MXNet's one-device
    executor does; with them its outputs and every gradient are that executor's."""
    x = mx.sym.var("data")
    h = mx.sym.Activation(mx.sym.FullyConnected(x, num_hidden=8, name="fc1"), act_type="tanh")
    sym = mx.sym.FullyConnected(h, num_hidden=4, name="fc2")
    shapes, types = {"data": (12, 6)}, {"data": "float64"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ptd = tofu_mx.partition(sym, [mx.cpu(0), mx.cpu(1)], dtypes=types, **shapes)
    assert not [w for w in caught if "loss" in str(w.message)]
    said = re.compile(r"no loss head: no output is made by a loss operator .* starts from "
                      r"the outputs' gradients: give them to exe\.backward\(out_grads=\[\.\.\.\]\)"
                      r".*for inference only, bind with grad_req='null'")
    assert said.search(ptd.report()) and said.search(tofu_mx.plan(sym, 2, **shapes).report())
    labelled = mx.sym.SoftmaxOutput(sym, name="softmax")
    assert "no loss head" not in partition(labelled, 2, softmax_label=(12,), **shapes).report()

    rng = np.random.default_rng(0)
    graph = import_symbol(sym, dtypes=types, **shapes)
    values = {n.name: rng.standard_normal(n.outputs[0].shape) for n in graph.variables()}
    head = rng.standard_normal((12, 4))
    ref = sym.simple_bind(mx.cpu(0), grad_req="write", type_dict=types, **shapes)
    for name, value in values.items():
        ref.arg_dict[name][:] = value
    exe = ptd.simple_bind(grad_req="write")
    for name, value in ptd.split_arrays(values).items():
        exe.arg_dict[name][:] = value
    for e in (ref, exe):
        e.forward(is_train=True)
        with pytest.raises(mx.base.MXNetError, match="head_gradient is required"):
            e.backward()
        e.backward(out_grads=[mx.nd.array(head, ctx=e.outputs[0].context, dtype="float64")])
    np.testing.assert_allclose(exe.outputs[0].asnumpy(), ref.outputs[0].asnumpy(), rtol=1e-12)
    got = ptd.merge_arrays({n: g.asnumpy() for n, g in exe.grad_dict.items() if g is not None})
    assert sorted(got) == sorted(values)
    for name in values:
        np.testing.assert_allclose(got[name], ref.grad_dict[name].asnumpy(), rtol=1e-10,
                                   atol=1e-12, err_msg=name)
