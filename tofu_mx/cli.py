"""Command line: ``python -m tofu_mx summary|plan|verify|draw ...`` (also installed as ``tofu-mx``).

MODEL is a built-in model (``wresnet``, ``rnn``, ``transformer``), a Gluon model-zoo name
(``resnet50_v1``, ``mobilenetv2_1.0``, ...: :data:`tofu_mx.models.ZOO_MODELS`), or, with
``--symbol FILE``, a symbol JSON file. Errors of the package print as one line on stderr and
exit with code 2; ``verify`` exits with 1 when the partitioned graph computes something else.
The search flags of ``plan``, ``verify`` and ``draw`` are generated from
:class:`tofu_mx.search.plan.SearchOptions`' fields.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import warnings
from typing import Iterator

import mxnet as mx
import numpy as np

from nnvm_passes.transforms import cast_floats
from tofu_mx import models
from tofu_mx.devices import parse_devices
from tofu_mx.errors import InvalidArgumentError, TofuError, VerificationError
from tofu_mx.files import atomic_write_bytes
from tofu_mx.summary import format_bytes, parse_bytes, summarize
from tofu_mx.tdl.annotate import import_graph

BUILTIN_MODELS = ("wresnet", "rnn", "transformer")
_MAX_LISTED = 20     # differing tensors verify lists


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, _, dims = text.partition("=")
    try:
        shape = tuple(int(d) for d in dims.split(",") if d.strip())
    except ValueError:
        shape = ()
    if not name or not shape:
        raise argparse.ArgumentTypeError(f"expected NAME=D1,D2,..., got {text!r}")
    return name, shape


def _model(args: argparse.Namespace) -> tuple[mx.sym.Symbol, dict]:
    """The symbol and its input shapes: ``--shape`` replaces a model's default shapes (MXNet
    infers the others from them: ``softmax_label`` from ``data``)."""
    given = dict(args.shape or [])
    if args.symbol:
        if args.model:
            raise InvalidArgumentError(f"give a MODEL or --symbol, not both (got {args.model!r} "
                                       f"and --symbol {args.symbol!r})")
        try:
            symbol = mx.sym.load(args.symbol)
        except mx.base.MXNetError as e:
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            raise InvalidArgumentError(f"cannot load symbol file {args.symbol!r}: "
                                       f"{lines[-1] if lines else type(e).__name__}") from e
        if not given:
            raise InvalidArgumentError("--symbol needs --shape NAME=D1,D2,... for each input")
        return symbol, given
    name = args.model or "wresnet"
    if name == "wresnet":
        symbol = models.wresnet(args.depth, args.widen, args.classes)
        shapes = models.input_shapes("wresnet", args.batch_size,
                                     image_size=args.image_size or 224)
    elif name == "rnn":
        symbol = models.rnn(args.layers, args.hidden, args.seq_len, args.vocab)
        shapes = models.input_shapes("rnn", args.batch_size, seq_len=args.seq_len)
    elif name == "transformer":
        symbol = models.transformer(args.layers, args.hidden, args.heads, args.seq_len,
                                    args.vocab)
        shapes = models.input_shapes("transformer", args.batch_size, seq_len=args.seq_len)
    else:
        name = models.zoo_name(name, BUILTIN_MODELS)
        symbol = models.zoo_symbol(name, classes=args.classes)
        shapes = models.zoo_input_shapes(name, args.batch_size, args.image_size)
    return symbol, given or shapes


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", metavar="MODEL",
                        help="wresnet, rnn, transformer (the paper's models; default wresnet) "
                             "or a Gluon model-zoo name (resnet50_v1, mobilenetv2_1.0, ...)")
    parser.add_argument("--symbol", help="a symbol JSON file instead of a MODEL")
    parser.add_argument("--shape", type=_shape, action="append",
                        help="input shape NAME=D1,D2,... (labels too: softmax_label=4); repeat "
                             "for each input. Replaces the model's default shapes; MXNet infers "
                             "the shapes not given where it can")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--depth", type=int, default=50, help="wresnet depth")
    parser.add_argument("--widen", type=int, default=1, help="wresnet widening factor")
    parser.add_argument("--classes", type=int, default=1000,
                        help="classes of wresnet and of model-zoo nets")
    parser.add_argument("--image-size", type=int, default=None,
                        help="image side (default 224; 299 for inceptionv3)")
    parser.add_argument("--layers", type=int, default=4, help="rnn/transformer layers")
    parser.add_argument("--hidden", type=int, default=1024, help="rnn hidden / transformer units")
    parser.add_argument("--heads", type=int, default=16, help="transformer heads")
    parser.add_argument("--seq-len", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=10000)


def _option_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per SearchOptions field, with the field's comment as its help."""
    from tofu_mx.search.plan import SearchOptions
    source = _field_comments(SearchOptions)
    for f in dataclasses.fields(SearchOptions):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool) and f.default is not None:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default,
                                help=source.get(f.name, ""))
        elif f.name == "progress":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                                help=source.get(f.name, ""))
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default,
                                help=source.get(f.name, ""))


def _field_comments(cls) -> dict[str, str]:
    import inspect
    comments = {}
    for line in inspect.getsource(cls).splitlines():
        name, _, rest = line.strip().partition(":")
        if "#" in rest and name.isidentifier():
            comments[name] = rest.split("#", 1)[1].strip()
    return comments


def _partition_arguments(parser: argparse.ArgumentParser, devices: str, what: str) -> None:
    """The model, the devices, the memory budget and the search flags."""
    _model_arguments(parser)
    parser.add_argument("--devices", default=devices,
                        help=f"{what}: a count (4, meaning cpu:4), cpu:4, gpu:8 or gpu:0,2,5 "
                             f"(default {devices})")
    parser.add_argument("--memory-budget", default=None,
                        help="bytes each device may hold: 16GiB, 512MiB, 1.5GB, 1e9, ...")
    _option_arguments(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tofu-mx", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _model_arguments(sub.add_parser("summary", help="import a model and print its graph summary"))
    planner = sub.add_parser("plan", help="search a partition plan and print its report")
    _partition_arguments(planner, "8", "devices to plan for (only their number matters)")
    planner.add_argument("--json", help="also write the plan as JSON to this file")
    verifier = sub.add_parser(
        "verify", help="partition a model, run it on the devices and compare every output, "
                       "gradient and aux state with the unpartitioned model")
    _partition_arguments(verifier, "cpu:2", "devices to run on")
    verifier.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                          help="compute in this dtype (default float64: float32 cannot tell a "
                               "wrong partition from an ill-conditioned model)")
    verifier.add_argument("--rtol", type=float, default=1e-4)
    verifier.add_argument("--atol", type=float, default=1e-5)
    verifier.add_argument("--seed", type=int, default=0, help="seed of the inputs and parameters")
    drawer = sub.add_parser("draw", help="partition a model and draw the plan (Graphviz)")
    _partition_arguments(drawer, "4", "devices to plan for (only their number matters)")
    drawer.add_argument("--output", "-o", required=True,
                        help="file to write: .png, .svg, .pdf (need Graphviz's dot) or .dot")
    from tofu_mx.runtime.draw import MAX_OPERATORS
    drawer.add_argument("--coarsen-above", type=int, default=MAX_OPERATORS,
                        help=f"draw the search's groups of operators instead of operators when "
                             f"the graph has more than this many (default {MAX_OPERATORS}; "
                             f"0: always)")
    return parser


def _search_options(args: argparse.Namespace):
    from tofu_mx.search.plan import SearchOptions
    return SearchOptions(**{f.name: getattr(args, f.name)
                            for f in dataclasses.fields(SearchOptions)})


def _devices(k: int) -> str:
    return f"{k} device{'' if k == 1 else 's'}"


def _budget(args: argparse.Namespace) -> int | None:
    return None if args.memory_budget is None else parse_bytes(args.memory_budget)


def _plan(args: argparse.Namespace, symbol, shapes) -> None:
    from tofu_mx.search.plan import plan
    result = plan(symbol, len(parse_devices(args.devices)), memory_budget=_budget(args),
                  options=_search_options(args), **shapes)
    print(result.report())
    if args.json:
        atomic_write_bytes(args.json, result.to_json().encode("utf-8"))


def _verify(args: argparse.Namespace, symbol, shapes) -> int:
    from tofu_mx.runtime.partitioned import partition
    from tofu_mx.verification import verify
    ctx = parse_devices(args.devices)
    symbol, dtypes = cast_floats(symbol, args.dtype)
    ptd = partition(symbol, ctx, memory_budget=_budget(args), options=_search_options(args),
                    dtypes=dtypes, **shapes)
    devices = ", ".join(map(str, ctx))
    print(f"partitioned over {_devices(len(ctx))} ({devices}): the plan moves "
          f"{format_bytes(ptd.plan.total_bytes)} per training step; "
          f"{len(ptd.fallbacks)} operator(s) run whole")
    other = [f"{n.name}:{k}" for n in ptd.graph.nodes for k, t in enumerate(n.outputs)
             if np.dtype(t.dtype).kind == "f" and t.dtype != args.dtype]
    if other:
        print(f"note: {len(other)} tensors are not {args.dtype} whatever their inputs (first: "
              f"{', '.join(other[:3])}); they are compared in their own precision")
    try:
        report = verify(symbol, ptd, ctx, args.rtol, args.atol, args.seed, dtypes=dtypes,
                        **shapes)
    except VerificationError as e:
        report = e.report
    worst = report.worst
    print(f"compared {len(report.comparisons)} tensors (outputs, gradients, aux states) in "
          f"{args.dtype}, rtol={report.rtol:g} atol={report.atol:g} seed={report.seed}: "
          f"{'all agree' if report.ok else f'{len(report.failures)} differ'}")
    print(f"worst: {worst.describe()}; {worst.violation:.3g} of its tolerance")
    if report.ok:
        print("ok: the partitioned graph computes what the model computes")
        return 0
    failures = sorted(report.failures, key=lambda c: (-c.violation, c.name))
    print(f"DIFFERS: {len(failures)} tensors are outside the tolerance:")
    for c in failures[:_MAX_LISTED]:
        print(f"  {c.describe()}")
    if len(failures) > _MAX_LISTED:
        print(f"  ... {len(failures) - _MAX_LISTED} more")
    if args.dtype != "float64":
        print(f"note: in {args.dtype}, two right ways of computing an ill-conditioned model "
              f"(BatchNorm over a few values) can differ this much; judge in float64 (the "
              f"default)")
    return 1


def _draw(args: argparse.Namespace, symbol, shapes) -> None:
    from tofu_mx.runtime.draw import FORMATS, INSTALL_HINT, check_output, draw
    from tofu_mx.runtime.partitioned import partition
    ctx = parse_devices(args.devices)
    suffix = check_output(args.output)      # before the search, which may take a while
    ptd = partition(symbol, ctx, memory_budget=_budget(args), options=_search_options(args),
                    **shapes)
    drawing = draw(ptd, args.output, max_operators=args.coarsen_above)
    pic = drawing.picture
    if drawing.missing_dot:
        print(f"Graphviz's dot program is not installed, so wrote {drawing.path} instead of "
              f"{args.output}; install it ({INSTALL_HINT}), then run: dot -T{FORMATS[suffix]} "
              f"{drawing.path} -o {args.output}")
        return
    groups = sum(1 for n in pic.nodes if n.kind == "group")
    print(f"wrote {drawing.path}: {pic.operators} operators"
          f"{f' drawn as {groups} groups' if pic.coarsened else ''} on {_devices(len(ctx))}, "
          f"{len(ptd.fallbacks)} run whole; {format_bytes(pic.forward_bytes)} cross devices in "
          f"the forward pass")


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    """Warnings of the package as ``tofu-mx: warning: ...`` lines on stderr."""
    def show(message, category, filename, lineno, file=None, line=None):
        print(f"tofu-mx: warning: {' '.join(str(message).split())}", file=sys.stderr)
    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with _one_line_warnings():
        try:
            symbol, shapes = _model(args)
            if args.command == "plan":
                _plan(args, symbol, shapes)
            elif args.command == "verify":
                return _verify(args, symbol, shapes)
            elif args.command == "draw":
                _draw(args, symbol, shapes)
            else:
                print(summarize(import_graph(symbol, **shapes)))
        except TofuError as e:
            print(f"tofu-mx: error: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
        except BrokenPipeError:        # the reader went away (``tofu-mx plan ... | head``)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
    return 0
