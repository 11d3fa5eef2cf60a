import dataclasses
import pickle

import pytest

from nnvm_passes.ir import (Entry, FrozenDict, Graph, Node, TensorInfo, format_attr_value,
                            parse_attr_value)
from tofu_mx.search.layouts import StoredLayout
from tofu_mx.search.plan import OpPlan, TensorPlan


@pytest.mark.parametrize("text, value", [
    ("(3, 3)", (3, 3)), ("True", True), ("64", 64), ("0.5", 0.5), ("None", None),
    ("relu", "relu"), ("NCHW", "NCHW"), ("(1,)", (1,)), ("(-1, 0, -3)", (-1, 0, -3)),
])
def test_attr_values_parse_and_format_like_mxnet(text, value):
    assert parse_attr_value(text) == value
    assert format_attr_value(value) == text


def test_a_parsed_mutable_value_is_the_callers_own():
    """Parsing is cached per spelling; a list parsed is a fresh copy every time."""
    first = parse_attr_value("[1, [2, 3]]")
    first[1].append(4)
    assert parse_attr_value("[1, [2, 3]]") == [1, [2, 3]]
    assert parse_attr_value(["not", "text"]) == ["not", "text"]


def test_frozendict_is_hashable_and_updated_returns_self_when_unchanged():
    d = FrozenDict({"a": "1", "b": "2"})
    assert hash(d) == hash(FrozenDict({"a": "1", "b": "2"}))
    assert d == {"a": "1", "b": "2"}
    assert d.updated(a="1") is d
    changed = d.updated(a="3")
    assert changed["a"] == "3" and d["a"] == "1"
    with pytest.raises(TypeError):
        d["a"] = "x"  # read-only


def test_frozendict_reads_as_a_read_only_mapping():
    """get, in, keys, items and values come from the dict itself (fast), as Mapping's."""
    d = FrozenDict({"a": "1", "b": "2"})
    assert d.get("a") == "1" and d.get("z") is None and d.get("z", "0") == "0"
    assert "a" in d and "z" not in d and 1 not in d
    assert list(d.keys()) == ["a", "b"] and list(d.values()) == ["1", "2"]
    assert list(d.items()) == [("a", "1"), ("b", "2")] and dict(d.items()) == {"a": "1", "b": "2"}
    assert d.items() == {("a", "1"), ("b", "2")} and d.keys() == {"a", "b"}
    for view in (d.keys(), d.items(), d.values()):      # no view writes through
        if hasattr(view, "mapping"):
            with pytest.raises(TypeError):
                view.mapping["a"] = "x"
    assert d == {"a": "1", "b": "2"}


def test_node_replace_returns_self_when_nothing_changes():
    node = Node("fc", "FullyConnected", FrozenDict({"num_hidden": "4", "__ctx_group__": "dev1"}),
                (Entry(0),), (TensorInfo((2, 4), "float32"),))
    assert node.replace(op="FullyConnected") is node
    assert node.replace(op="Dropout").op == "Dropout" and node.op == "FullyConnected"
    assert node.params == {"num_hidden": 4}
    assert node.ctx_group == "dev1"
    assert node.outputs[0].nbytes == 32


def test_node_replace_sets_every_field_and_is_variable_follows_op():
    node = Node("fc", "FullyConnected", FrozenDict({"num_hidden": "4"}), (Entry(0),),
                (TensorInfo((2, 4), "float32"),), extra=FrozenDict({"subgraphs": "[]"}))
    changes = dict(name="v", op="null", attrs=FrozenDict(), inputs=(), kind="param",
                   outputs=(TensorInfo((3,), "float16"),), extra=FrozenDict())
    got = node.replace(**changes)
    assert got == Node(**changes) and got.is_variable and not node.is_variable
    assert [getattr(got, k) for k in changes] == list(changes.values())
    assert node.replace(inputs=(Entry(1, 2, 3),)).inputs == (Entry(1, 2, 3),)
    assert node.replace(inputs=(Entry(1),)).extra == node.extra   # the rest kept
    with pytest.raises(TypeError, match="no fields .'shape'"):
        node.replace(shape=(2,))
    with pytest.raises(TypeError):
        node.replace(is_variable=True)     # derived from op, not set


def test_graph_lookups():
    var = Node("x", "null", FrozenDict(), (), (TensorInfo((2, 3), "float16"),), kind="data")
    op = Node("r", "relu", FrozenDict(), (Entry(0),), (TensorInfo((2, 3), "float16"),))
    g = Graph((var, op), (Entry(1),))
    assert g.node("r") is op and g.index("x") == 0
    assert g.consumers() == {0: [(1, 0)], 1: []}
    assert g.output_infos == [TensorInfo((2, 3), "float16")]
    assert g.replace(heads=(Entry(1),)) is g
    with pytest.raises(KeyError, match="no node named 'y'"):
        g.node("y")


@pytest.mark.parametrize("cls, values", [
    (Entry, (3, 1, 2)),
    (TensorInfo, ((2, 3), "float16")),
    (Node, ("fc", "FullyConnected", FrozenDict(num_hidden="4"), (Entry(0),),
            (TensorInfo((2, 4), "float32"),), None, FrozenDict(control_deps="[]"))),
    (TensorPlan, ("fc:0", "activation", (2, 4), "float32", (StoredLayout(0),), (1, 4))),
    (OpPlan, ("fc", "FullyConnected", ())),
])
def test_written_out_constructors_behave_as_a_frozen_dataclass_s(cls, values):
    """The classes made by the hundred thousand write their own __init__ (for speed): every
    field is set, by position or keyword, defaults apply, and the object stays frozen,
    comparable, hashable and copyable with dataclasses.replace."""
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    made = cls(*values)
    assert [getattr(made, n) for n in names] == list(values)
    assert cls(**dict(zip(names, values))) == made
    assert hash(cls(*values)) == hash(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, names[0], values[0])
    other = dataclasses.replace(made, **{names[0]: values[0] * 2})
    assert getattr(other, names[0]) == values[0] * 2 and other != made
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(cls) if f.init and (
                    f.default is not dataclasses.MISSING or
                    f.default_factory is not dataclasses.MISSING)}
    required = [v for n, v in zip(names, values) if n not in defaults]
    assert {n: getattr(cls(*required), n) for n in defaults} == defaults


def test_a_node_made_by_replace_or_pickle_knows_whether_it_is_a_variable():
    node = Node("x", "null", FrozenDict(), (), (TensorInfo((2,), "float32"),), "data")
    assert node.is_variable and not node.replace(op="relu", kind=None).is_variable
    assert pickle.loads(pickle.dumps(node)) == node and pickle.loads(pickle.dumps(node)).is_variable
