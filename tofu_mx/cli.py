"""Command line: ``python -m tofu_mx summary|plan ...`` (also installed as ``tofu-mx``).

Errors of the package print as one line on stderr and exit with code 2. The ``plan`` flags
for the search are generated from :class:`tofu_mx.search.plan.SearchOptions`' fields.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import mxnet as mx

from tofu_mx import models
from tofu_mx.errors import InvalidArgumentError, TofuError
from tofu_mx.summary import summarize
from tofu_mx.tdl.annotate import import_graph


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, _, dims = text.partition("=")
    try:
        return name, tuple(int(d) for d in dims.split(",") if d)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected NAME=D1,D2,..., got {text!r}") from e


def _model(args: argparse.Namespace) -> tuple[mx.sym.Symbol, dict]:
    if args.symbol:
        try:
            symbol = mx.sym.load(args.symbol)
        except mx.base.MXNetError as e:
            raise InvalidArgumentError(f"cannot load symbol file {args.symbol!r}: "
                                       f"{str(e).splitlines()[0]}") from e
        if not args.shape:
            raise InvalidArgumentError("--symbol needs --shape NAME=D1,D2,... for each input")
        return symbol, dict(args.shape)
    if args.model == "wresnet":
        symbol = models.wresnet(args.depth, args.widen, args.classes)
        shapes = models.input_shapes("wresnet", args.batch_size, image_size=args.image_size)
    elif args.model == "rnn":
        symbol = models.rnn(args.layers, args.hidden, args.seq_len, args.vocab)
        shapes = models.input_shapes("rnn", args.batch_size, seq_len=args.seq_len)
    else:
        symbol = models.transformer(args.layers, args.hidden, args.heads, args.seq_len,
                                    args.vocab)
        shapes = models.input_shapes("transformer", args.batch_size, seq_len=args.seq_len)
    return symbol, {**shapes, **dict(args.shape or [])}


def _model_arguments(summary: argparse.ArgumentParser) -> None:
    summary.add_argument("model", nargs="?", choices=["wresnet", "rnn", "transformer"],
                         default="wresnet", help="one of the paper's models (default wresnet)")
    summary.add_argument("--symbol", help="a symbol JSON file instead of a built-in model")
    summary.add_argument("--shape", type=_shape, action="append",
                         help="input shape NAME=D1,D2,...; repeat for each input")
    summary.add_argument("--batch-size", type=int, default=32)
    summary.add_argument("--depth", type=int, default=50, help="wresnet depth")
    summary.add_argument("--widen", type=int, default=1, help="wresnet widening factor")
    summary.add_argument("--classes", type=int, default=1000, help="wresnet classes")
    summary.add_argument("--image-size", type=int, default=224)
    summary.add_argument("--layers", type=int, default=4, help="rnn/transformer layers")
    summary.add_argument("--hidden", type=int, default=1024, help="rnn hidden / transformer units")
    summary.add_argument("--heads", type=int, default=16, help="transformer heads")
    summary.add_argument("--seq-len", type=int, default=20)
    summary.add_argument("--vocab", type=int, default=10000)


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tofu-mx", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _model_arguments(sub.add_parser("summary", help="import a model and print its graph summary"))
    planner = sub.add_parser("plan", help="search a partition plan and print its report")
    _model_arguments(planner)
    planner.add_argument("--devices", type=int, default=8, help="number of devices (any k >= 1)")
    planner.add_argument("--memory-budget", type=float, default=None,
                         help="bytes each device may hold")
    planner.add_argument("--json", help="also write the plan as JSON to this file")
    _option_arguments(planner)
    return parser


def _plan(args: argparse.Namespace, symbol, shapes) -> None:
    from tofu_mx.search.plan import SearchOptions, plan
    options = SearchOptions(**{f.name: getattr(args, f.name)
                               for f in dataclasses.fields(SearchOptions)})
    budget = int(args.memory_budget) if args.memory_budget else None
    result = plan(symbol, args.devices, memory_budget=budget, options=options, **shapes)
    print(result.report())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(result.to_json())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        symbol, shapes = _model(args)
        if args.command == "plan":
            _plan(args, symbol, shapes)
        else:
            print(summarize(import_graph(symbol, **shapes)))
    except TofuError as e:
        print(f"tofu-mx: error: {e}", file=sys.stderr)
        return 2
    return 0
