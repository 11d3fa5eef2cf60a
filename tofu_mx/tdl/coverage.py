"""Which operators of a graph (or of the model zoo and the paper's models, or of everything
MXNet registers) are described and checked against MXNet's kernels, opaque, run whole on one
device (fallback), or deliberately out of scope."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable

import mxnet as mx

from tofu_mx.tdl.annotate import DESCRIBED, OPAQUE, UNKNOWN, import_graph
from tofu_mx.tdl.check import check_description
from tofu_mx.ops.scope import NOT_DESCRIBED, out_of_scope
from tofu_mx.tdl.registry import Description, lookup, mxnet_operators, registry_key

#: gluon model-zoo vision nets and their input size.
ZOO = {"alexnet": 224, "vgg11_bn": 224, "vgg16": 224, "resnet18_v1": 224, "resnet50_v1": 224,
       "resnet50_v2": 224, "densenet121": 224, "squeezenet1.0": 224, "inceptionv3": 299,
       "mobilenet1.0": 224, "mobilenetv2_1.0": 224}


@dataclass(frozen=True)
class OpCoverage:
    op: str
    status: str          # described | opaque | unknown
    checked: str         # "n/n examples" for described ops, else ""
    ok: bool             # every check passed (True for opaque/unknown: nothing to check)
    count: int           # nodes of this op in the graphs
    models: tuple[str, ...]
    reason: str = ""


def builtin_graphs() -> Iterable[tuple[str, object]]:
    """(name, symbol, shapes) for every model-zoo vision net and the three builders."""
    from mxnet.gluon.model_zoo import vision

    from tofu_mx import models
    for name, size in ZOO.items():
        with mx.name.NameManager():
            yield name, vision.get_model(name)(mx.sym.var("data")), {"data": (1, 3, size, size)}
    yield "wresnet", models.wresnet(50, 1, 10), models.input_shapes("wresnet", 2, image_size=32)
    yield "rnn", models.rnn(2, 16, 3, 20), models.input_shapes("rnn", 2, seq_len=3)
    yield "transformer", models.transformer(2, 16, 4, 4, 20, dropout=0.1), \
        models.input_shapes("transformer", 2, seq_len=4)


def coverage(graphs: Iterable[tuple[str, object, dict]]) -> list[OpCoverage]:
    counts: Counter = Counter()
    where: dict[str, list[str]] = {}
    for model, symbol, shapes in graphs:
        for node in import_graph(symbol, **shapes).operators():
            key = registry_key(node.op, node.params)
            counts[key] += 1
            where.setdefault(key, [])
            if model not in where[key]:
                where[key].append(model)
    rows = []
    for key in sorted(counts):
        entry = lookup(key)
        if entry is None:
            rows.append(OpCoverage(key, UNKNOWN, "", False, counts[key], tuple(where[key]),
                                   "no description: runs whole or replicated"))
        elif isinstance(entry, Description):
            results = check_description(entry)
            passed = sum(r.ok for r in results)
            rows.append(OpCoverage(key, DESCRIBED, f"{passed}/{len(results)}",
                                   passed == len(results), counts[key], tuple(where[key]),
                                   entry.note))
        else:
            rows.append(OpCoverage(key, OPAQUE, "", True, counts[key], tuple(where[key]),
                                   entry.reason))
    return rows


def format_coverage(rows: list[OpCoverage]) -> str:
    width = max([len(r.op) for r in rows] + [8])
    lines = [f"{'operator':<{width}}  {'status':<9} {'checked':>8} {'nodes':>6}  models / note"]
    for r in rows:
        status = r.status if r.ok else f"{r.status}!"
        detail = ", ".join(r.models[:4]) + (" ..." if len(r.models) > 4 else "")
        if r.reason:
            detail += f"  ({r.reason})"
        lines.append(f"{r.op:<{width}}  {status:<9} {r.checked:>8} {r.count:>6}  {detail}")
    by = Counter(r.status for r in rows)
    failed = [r.op for r in rows if r.status == DESCRIBED and not r.ok]
    lines.append(f"{len(rows)} operators: {by[DESCRIBED]} described and checked"
                 f"{f' ({len(failed)} FAILED their check: {failed})' if failed else ''}, "
                 f"{by[OPAQUE]} opaque, {by[UNKNOWN]} without description")
    return "\n".join(lines)


FALLBACK, OUT_OF_SCOPE = "fallback", "out of scope"


@dataclass(frozen=True)
class MXNetOpCoverage:
    """One name MXNet registers: what partition() does with a node of it."""

    name: str
    canonical: str       # the operator the name is an alias of (itself if none)
    status: str          # described | opaque | fallback | out of scope
    checked: str         # "n/n examples" for described ops, else ""
    ok: bool             # every check passed (True when there is nothing to check)
    reason: str = ""

    @property
    def public(self) -> bool:
        return not self.name.startswith("_")


def mxnet_coverage() -> list[MXNetOpCoverage]:
    """Every operator MXNet registers (aliases under their own names), each described ones'
    examples checked against MXNet's kernel once per canonical operator."""
    checked: dict[str, tuple[int, int]] = {}
    rows = []
    for name, canonical in sorted(mxnet_operators().items()):
        entry = lookup(canonical)
        alias = f"alias of {canonical}" if canonical != name else ""
        if isinstance(entry, Description):
            if canonical not in checked:
                results = check_description(entry)
                checked[canonical] = (sum(r.ok for r in results), len(results))
            passed, total = checked[canonical]
            rows.append(MXNetOpCoverage(name, canonical, DESCRIBED, f"{passed}/{total}",
                                        passed == total, alias or entry.note))
        elif entry is not None:
            rows.append(MXNetOpCoverage(name, canonical, OPAQUE, "", True, entry.reason))
        elif out_of_scope(canonical) or out_of_scope(name):
            rows.append(MXNetOpCoverage(name, canonical, OUT_OF_SCOPE, "", True,
                                        out_of_scope(canonical) or out_of_scope(name)))
        else:
            why = NOT_DESCRIBED.get(canonical, "no description")
            rows.append(MXNetOpCoverage(name, canonical, FALLBACK, "", True,
                                        f"{why}: runs whole on one device"))
    return rows


def _counts(rows: list[MXNetOpCoverage]) -> str:
    by = Counter(r.status for r in rows)
    failed = [r.name for r in rows if not r.ok]
    return (f"{by[DESCRIBED]} described and checked"
            f"{f' ({len(failed)} FAILED: {failed[:8]})' if failed else ''}, {by[OPAQUE]} opaque, "
            f"{by[FALLBACK]} fallback (run whole on one device), {by[OUT_OF_SCOPE]} out of scope")


def format_mxnet_coverage(rows: list[MXNetOpCoverage], public_only: bool = False) -> str:
    shown = [r for r in rows if r.public or not public_only]
    width = max([len(r.name) for r in shown] + [8])
    lines = [f"{'operator':<{width}}  {'status':<12} {'checked':>7}  note"]
    for r in shown:
        status = r.status if r.ok else f"{r.status}!"
        lines.append(f"{r.name:<{width}}  {status:<12} {r.checked:>7}  {r.reason}")
    public = [r for r in rows if r.public]
    lines.append(f"public operators ({len(public)}): {_counts(public)}")
    lines.append(f"all registered operators ({len(rows)}): {_counts(rows)}")
    return "\n".join(lines)
