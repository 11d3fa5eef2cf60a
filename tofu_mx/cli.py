"""Command line: ``python -m tofu_mx summary|plan|verify|draw ...`` (also installed as ``tofu-mx``).

MODEL is a built-in model (``wresnet``, ``rnn``, ``transformer``), a Gluon model-zoo name
(``resnet50_v1``, ``mobilenetv2_1.0``, ...: :data:`tofu_mx.models.ZOO_MODELS`), or, with
``--symbol FILE``, a symbol JSON file. ``verify`` exits with 1 when the partitioned graph
computes something else. The search flags of ``plan``, ``verify`` and ``draw`` are generated
from :class:`tofu_mx.search.plan.SearchOptions`' fields.

Bad input (a flag's value, a file, a model name, a graph MXNet refuses) prints one line
``tofu-mx: error: ...`` on stderr and exits with code 2. Every flag and every path to write is
checked before the model is loaded and searched. An error of MXNet (``MXNetError``) is
reported the same way with MXNet's own line, since it comes from the graph or the shapes
given; set ``TOFU_MX_TRACEBACK=1`` to see where it was raised. Any other exception is a bug of
tofu_mx and shows its traceback.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import sys
import warnings
from typing import Any, Iterator

import mxnet as mx
import numpy as np

from nnvm_passes.transforms import cast_floats
from tofu_mx import arguments, models
from tofu_mx.devices import parse_devices
from tofu_mx.errors import InvalidArgumentError, TofuError, VerificationError, mxnet_message
from tofu_mx.files import atomic_write_bytes, check_writable, load_symbol
from tofu_mx.models.wresnet import UNITS_BY_DEPTH
from tofu_mx.sim.machine import PRESETS
from tofu_mx.summary import format_bytes, parse_bytes, summarize
from tofu_mx.tdl.annotate import import_graph

BUILTIN_MODELS = ("wresnet", "rnn", "transformer")
_MAX_LISTED = 20     # differing tensors verify lists


class _Parser(argparse.ArgumentParser):
    """argparse's errors (an unknown flag, a value of the wrong type) as the package's: one
    line, exit code 2 (printed by :func:`main`), instead of the usage and then the error."""

    def error(self, message: str):
        raise InvalidArgumentError(f"{message} (see {self.prog} --help)")


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, equals, dims = (part.strip() for part in text.partition("="))
    fields = [f.strip() for f in dims.split(",")]
    if not (name and equals and all(f.isdecimal() for f in fields)):
        raise argparse.ArgumentTypeError(
            f"expected NAME=D1,D2,... with positive integers, e.g. data=32,3,224,224; got "
            f"{arguments.show(text, 40)}")
    if any(len(f.lstrip("0")) > 18 for f in fields):        # int() refuses 4300 digits
        raise argparse.ArgumentTypeError(f"{arguments.show(text, 40)} has a dimension of more than 18 "
                                         f"digits; give a shape MXNet can hold")
    shape = tuple(int(f) for f in fields)
    if 0 in shape:
        raise argparse.ArgumentTypeError(
            f"{arguments.show(text, 40)} has a dimension of 0; every dimension must be at least 1")
    return name, shape


def _model(args: argparse.Namespace) -> tuple[mx.sym.Symbol, dict]:
    """The symbol and its input shapes: ``--shape`` replaces a model's default shapes (MXNet
    infers the others from them: ``softmax_label`` from ``data``)."""
    given = dict(args.shape or [])
    if args.symbol:
        symbol = load_symbol(args.symbol)
        if not given:
            inputs = symbol.list_arguments()
            raise InvalidArgumentError(
                f"--symbol needs --shape NAME=D1,D2,... for its data inputs (MXNet infers the "
                f"others' shapes); its inputs are {', '.join(inputs[:8])}"
                f"{f' and {len(inputs) - 8} more' if len(inputs) > 8 else ''}")
        return symbol, given
    name = args.model or "wresnet"
    image_size = args.image_size
    if name == "wresnet":
        symbol = models.wresnet(args.depth, args.widen, args.classes)
        shapes = models.input_shapes("wresnet", args.batch_size,
                                     image_size=224 if image_size is None else image_size)
    elif name == "rnn":
        symbol = models.rnn(args.layers, args.hidden, args.seq_len, args.vocab)
        shapes = models.input_shapes("rnn", args.batch_size, seq_len=args.seq_len)
    elif name == "transformer":
        symbol = models.transformer(args.layers, args.hidden, args.heads, args.seq_len,
                                    args.vocab)
        shapes = models.input_shapes("transformer", args.batch_size, seq_len=args.seq_len)
    else:
        symbol = models.zoo_symbol(name, classes=args.classes)
        shapes = models.zoo_input_shapes(name, args.batch_size, image_size)
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
    # defaults None: a flag given to a model that does not read it is an error, not ignored
    parser.add_argument("--batch-size", type=int,
                        help="batch of the model's default input shapes (default 32)")
    parser.add_argument("--depth", type=int, choices=sorted(UNITS_BY_DEPTH),
                        help="wresnet depth (default 50)")
    parser.add_argument("--widen", type=int, help="wresnet widening factor (default 1)")
    parser.add_argument("--classes", type=int,
                        help="classes of wresnet and of model-zoo nets (default 1000)")
    parser.add_argument("--image-size", type=int,
                        help="image side of the model's default input shapes (default 224; "
                             "299 for inceptionv3)")
    parser.add_argument("--layers", type=int, help="rnn/transformer layers (default 4)")
    parser.add_argument("--hidden", type=int,
                        help="rnn hidden / transformer units (default 1024)")
    parser.add_argument("--heads", type=int, help="transformer heads (default 16)")
    parser.add_argument("--seq-len", type=int, help="rnn/transformer steps (default 20)")
    parser.add_argument("--vocab", type=int, help="rnn/transformer vocabulary (default 10000)")


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


@functools.lru_cache(maxsize=None)      # parsing the module's source takes 20 ms
def _field_comments(cls) -> dict[str, str]:
    import inspect
    comments, last = {}, None
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and last is not None:    # the comment goes on
            comments[last] += " " + stripped[1:].strip()
            continue
        name, _, rest = stripped.partition(":")
        last = None
        if "#" in rest and name.isidentifier():
            comments[name] = rest.split("#", 1)[1].strip()
            last = name
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
    parser = _Parser(prog="tofu-mx", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _model_arguments(sub.add_parser("summary", help="import a model and print its graph summary"))
    planner = sub.add_parser("plan", help="search a partition plan and print its report")
    _partition_arguments(planner, "8", "devices to plan for (only their number matters)")
    planner.add_argument("--json", help="also write the plan as JSON to this file")
    planner.add_argument("--frontier", action="store_true",
                         help="also print bytes moved against memory per device for the plans "
                              "found at a range of memory weights (each partitioned, not run)")
    verifier = sub.add_parser(
        "verify", help="partition a model, run it on the devices and compare every output, "
                       "gradient and aux state with the unpartitioned model")
    _partition_arguments(verifier, "cpu:2", "devices to run on")
    verifier.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                          help="compute in this dtype (default float64: float32 cannot tell a "
                               "wrong partition from an ill-conditioned model)")
    verifier.add_argument("--oracle", choices=("float64",), default=None,
                          help="with --dtype float32: judge each tensor against the model run "
                               "in float64, allowing 4x float32 rounding's own error on it")
    verifier.add_argument("--rtol", type=float, default=1e-4,
                          help="a tensor agrees where |got - want| <= atol + rtol * |want| "
                               "(default 1e-4)")
    verifier.add_argument("--atol", type=float, default=1e-5,
                          help="the absolute part of that tolerance (default 1e-5)")
    verifier.add_argument("--seed", type=int, default=0, help="seed of the inputs and parameters")
    drawer = sub.add_parser("draw", help="partition a model and draw the plan: a table of its "
                                         "layers, or the graph of its operators (Graphviz)")
    for command in (verifier, drawer):
        command.add_argument("--machine", default=None, choices=sorted(PRESETS),
                             help="choose the plan by the simulator's step time on this "
                                  "machine (fetching converted inputs again or keeping them, "
                                  "each routed through the machine's device groups or not: "
                                  "the fastest that fits); default: the fewest bytes moved")
    _partition_arguments(drawer, "4", "devices to plan for (only their number matters)")
    drawer.add_argument("--output", "-o", required=True,
                        help="file to write: .png, .svg or .pdf; .dot: the graph view's source")
    from tofu_mx.runtime.draw import MAX_OPERATORS, VIEWS
    drawer.add_argument("--view", choices=VIEWS, default=None,
                        help="layers (default): a row per layer of the model, how each device "
                             "holds its output and weight and what it moves, with memory per "
                             "device and the bytes of each cut; graph: the operators and the "
                             "bytes between them, drawn by Graphviz's dot (default for .dot)")
    drawer.add_argument("--only", default=None, metavar="TEXT",
                        help="layer view: only the layers whose names contain TEXT (a stage of "
                             "a large network, e.g. stage2_)")
    drawer.add_argument("--coarsen-above", type=int, default=MAX_OPERATORS,
                        help=f"graph view: draw the search's groups of operators instead of "
                             f"operators when the graph has more than this many (default "
                             f"{MAX_OPERATORS}; 0: always)")
    return parser


#: the integer flags: dest -> (smallest value, largest value or None, an example value).
#: MXNet reads a model's sizes as int32.
_INT_FLAGS = {"batch_size": (1, 2 ** 31 - 1, 32), "widen": (1, 2 ** 31 - 1, 2),
              "classes": (1, 2 ** 31 - 1, 1000), "image_size": (1, 2 ** 31 - 1, 224),
              "layers": (1, 2 ** 31 - 1, 4), "hidden": (1, 2 ** 31 - 1, 1024),
              "heads": (1, 2 ** 31 - 1, 16), "seq_len": (1, 2 ** 31 - 1, 20),
              "vocab": (1, 2 ** 31 - 1, 10000), "coarsen_above": (0, None, 60),
              "seed": (0, 2 ** 32 - 1, 0)}

#: the model flags, their defaults (image_size: None, each model's own), and which MODEL reads
#: each ("zoo": every model-zoo name)
_MODEL_FLAGS = {"batch_size": 32, "depth": 50, "widen": 1, "classes": 1000, "image_size": None,
                "layers": 4, "hidden": 1024, "heads": 16, "seq_len": 20, "vocab": 10000}
_READ_BY = {"wresnet": ("batch_size", "depth", "widen", "classes", "image_size"),
            "rnn": ("batch_size", "layers", "hidden", "seq_len", "vocab"),
            "transformer": ("batch_size", "layers", "hidden", "heads", "seq_len", "vocab"),
            "zoo": ("batch_size", "classes", "image_size")}


def _check_model_flags(args: argparse.Namespace) -> None:
    """The MODEL's name, then that every model flag given is one the model reads (a flag that
    changed nothing would leave the user believing it did); the defaults of the others filled
    in. ``--batch-size`` and ``--image-size`` only make the default input shapes, which
    ``--shape`` replaces."""
    if args.symbol and args.model:
        raise InvalidArgumentError(f"give a MODEL or --symbol, not both (got {args.model!r} "
                                   f"and --symbol {args.symbol!r})")
    if args.model and args.model not in BUILTIN_MODELS:
        args.model = models.zoo_name(args.model, BUILTIN_MODELS)
    model = args.model or "wresnet"
    reads = () if args.symbol else _READ_BY.get(model, _READ_BY["zoo"])
    for dest, default in _MODEL_FLAGS.items():
        value = getattr(args, dest)
        if value is None:
            setattr(args, dest, default)
        elif dest not in reads:
            raise InvalidArgumentError(f"{_flag(dest)} {value} would change nothing: "
                                       f"{_why_unread(dest, model, args.symbol)}")
        elif args.shape and dest in ("batch_size", "image_size"):
            raise InvalidArgumentError(f"{_flag(dest)} {value} would change nothing: --shape "
                                       f"gives the input shapes; put it there (--shape "
                                       f"data=...) and drop {_flag(dest)}")


def _why_unread(dest: str, model: str, symbol: str | None) -> str:
    readers = [name for name, flags in _READ_BY.items() if dest in flags]
    named = ", ".join("model-zoo nets" if name == "zoo" else name for name in readers)
    if symbol:
        hint = "give the input shapes with --shape" if dest in ("batch_size", "image_size") \
            else "the symbol file fixes the model"
        return f"--symbol {symbol!r} is read as it is ({hint}); {_flag(dest)} is for {named}"
    return f"{model} does not read it (it is for {named}); drop it"


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class _Parsed:
    """What the partitioning commands read from their flags, parsed."""

    contexts: list = dataclasses.field(default_factory=list)
    budget: int | None = None
    options: Any = None


def _check_arguments(args: argparse.Namespace) -> _Parsed:
    """Every flag's value, before any work, with the flag's name in the error; returns the
    devices, the memory budget and the search options parsed (none for ``summary``); the
    files to write are checked (a search can take minutes)."""
    _check_model_flags(args)
    for dest, (minimum, maximum, example) in _INT_FLAGS.items():
        if getattr(args, dest, None) is not None:
            arguments.count(getattr(args, dest), _flag(dest), minimum=minimum, maximum=maximum,
                            example=f"{_flag(dest)} {example}")
    for dest in ("rtol", "atol"):
        if hasattr(args, dest):
            arguments.real(getattr(args, dest), _flag(dest), minimum=0,
                           example=f"{_flag(dest)} 1e-4")
    seen: dict[str, tuple[int, ...]] = {}
    for name, shape in args.shape or []:
        if name in seen:
            raise InvalidArgumentError(
                f"--shape gives {name!r} twice ({name}={','.join(map(str, seen[name]))} and "
                f"{name}={','.join(map(str, shape))}); give each input once")
        seen[name] = shape
    if args.command == "summary":
        return _Parsed()
    parsed = _Parsed(parse_devices(args.devices), _budget(args.memory_budget),
                     _search_options(args))
    if args.command == "plan" and args.json is not None:
        check_writable(args.json, "--json")
    if args.command == "draw":
        from tofu_mx.runtime.draw import check_output, view_of
        check_output(args.output, "--output", view_of(args.view, args.output, args.only))
    return parsed


def _budget(text: str | None) -> int | None:
    if text is None:
        return None
    budget = parse_bytes(text)
    if budget == 0:
        raise InvalidArgumentError(f"--memory-budget {text!r} is 0 bytes; a device needs a "
                                   f"positive amount of memory, e.g. --memory-budget 16GiB")
    return budget


def _search_options(args: argparse.Namespace):
    """:class:`SearchOptions` of the flags. Each field is first checked alone, so that an
    error names the flag that gave the value."""
    from tofu_mx.search.plan import SearchOptions
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(SearchOptions)}
    for name, value in values.items():
        try:
            SearchOptions(**{name: value})
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"{_flag(name)} {value}: {e}") from e
    return SearchOptions(**values)


def _devices(k: int) -> str:
    return f"{k} device{'' if k == 1 else 's'}"


def _write(path: str, data: bytes, flag: str) -> None:
    """Write ``data`` where :func:`check_writable` said one could; what can still fail (a full
    disk, a folder removed meanwhile) is an error of the command, not a bug."""
    try:
        atomic_write_bytes(path, data)
    except OSError as e:
        raise TofuError(f"cannot write {flag} {path!r}: {e.strerror or e}; free some space or "
                        f"give another path") from e


def _summary(args: argparse.Namespace, parsed: _Parsed, symbol, shapes) -> int:
    print(summarize(import_graph(symbol, **shapes)))
    return 0


def _plan(args: argparse.Namespace, parsed: _Parsed, symbol, shapes) -> int:
    from tofu_mx.search.plan import plan
    result = plan(symbol, len(parsed.contexts), memory_budget=parsed.budget, options=parsed.options,
                  **shapes)
    print(result.report())
    if args.json is not None:
        _write(args.json, result.to_json().encode("utf-8"), "--json")
    if args.frontier:
        from tofu_mx.runtime.partitioned import frontier
        print(frontier(symbol, parsed.contexts, options=parsed.options, **shapes).report())
    return 0


def _verify(args: argparse.Namespace, parsed: _Parsed, symbol, shapes) -> int:
    from tofu_mx.runtime.partitioned import partition
    from tofu_mx.verification import verify
    ctx = parsed.contexts
    symbol, dtypes = cast_floats(symbol, args.dtype)
    ptd = partition(symbol, ctx, memory_budget=parsed.budget, options=parsed.options,
                    dtypes=dtypes, machine=args.machine, **shapes)
    devices = ", ".join(map(str, ctx))
    print(f"partitioned over {_devices(len(ctx))} ({devices}): the plan moves "
          f"{format_bytes(ptd.plan.total_bytes)} per training step; "
          f"{len(ptd.fallbacks)} operator(s) run whole")
    if ptd.machine_choice is not None:
        print("\n".join(ptd.machine_choice.lines()))
    other = [f"{n.name}:{k}" for n in ptd.graph.nodes for k, t in enumerate(n.outputs)
             if np.dtype(t.dtype).kind == "f" and t.dtype != args.dtype]
    if other:
        print(f"note: {len(other)} tensors are not {args.dtype} whatever their inputs (first: "
              f"{', '.join(other[:3])}); they are compared in their own precision")
    try:
        report = verify(symbol, ptd, ctx, args.rtol, args.atol, args.seed, dtypes=dtypes,
                        oracle=args.oracle, **shapes)
    except VerificationError as e:
        report = e.report
    worst = report.worst
    print(f"compared {len(report.comparisons)} tensors (outputs, gradients, aux states) in "
          f"{args.dtype}, rtol={report.rtol:g} atol={report.atol:g} seed={report.seed}: "
          f"{'all agree' if report.ok else f'{len(report.failures)} differ'}")
    print(f"worst: {worst.describe()}; {worst.violation:.3g} of its "
          f"{'allowance against the float64 oracle' if report.oracle else 'tolerance'}")
    if report.ok:
        print("ok: the partitioned graph computes what the model computes")
        return 0
    failures = sorted(report.failures, key=lambda c: (-c.violation, c.name))
    print(f"DIFFERS: {len(failures)} tensors are outside the tolerance:")
    for c in failures[:_MAX_LISTED]:
        print(f"  {c.describe()}")
    if len(failures) > _MAX_LISTED:
        print(f"  ... {len(failures) - _MAX_LISTED} more")
    if report.diagnosis:
        print(f"note: {report.diagnosis}")
    return 1


def _draw(args: argparse.Namespace, parsed: _Parsed, symbol, shapes) -> int:
    from tofu_mx.runtime.draw import FORMATS, INSTALL_HINT, Picture, draw
    from tofu_mx.runtime.partitioned import partition
    ctx = parsed.contexts
    suffix = os.path.splitext(args.output)[1].lower()
    ptd = partition(symbol, ctx, memory_budget=parsed.budget, options=parsed.options,
                    machine=args.machine, **shapes)
    try:
        drawing = draw(ptd, args.output, view=args.view, max_operators=args.coarsen_above,
                       only=args.only)
    except OSError as e:
        raise TofuError(f"cannot write --output {args.output!r}: {e.strerror or e}; free some "
                        f"space or give another path") from e
    pic = drawing.picture
    if drawing.missing_dot:
        print(f"Graphviz's dot program is not installed, so wrote {drawing.path} instead of "
              f"{args.output}; install it ({INSTALL_HINT}), then run: dot -T{FORMATS[suffix]} "
              f"{drawing.path} -o {args.output}, or draw the layer view (--view layers)")
        return 0
    if isinstance(pic, Picture):
        groups = sum(1 for n in pic.nodes if n.kind == "group")
        drawn = (f"{pic.operators} operators"
                 f"{f' drawn as {groups} groups' if pic.coarsened else ''}")
    else:
        drawn = f"{len(pic.layers)} layers"
    print(f"wrote {drawing.path}: {drawn} on {_devices(len(ctx))}, {len(ptd.fallbacks)} run "
          f"whole; {format_bytes(pic.forward_bytes)} cross devices in the forward pass")
    return 0


_COMMANDS = {"summary": _summary, "plan": _plan, "verify": _verify, "draw": _draw}


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    """Warnings of the package as ``tofu-mx: warning: ...`` lines on stderr."""
    def show(message, category, filename, lineno, file=None, line=None):
        print(f"tofu-mx: warning: {' '.join(str(message).split())}", file=sys.stderr)
    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def _error(message: str) -> int:
    print(f"tofu-mx: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code: 0 done, 1 ``verify`` found a difference, 2 an error."""
    with _one_line_warnings():
        try:
            args = build_parser().parse_args(argv)
            parsed = _check_arguments(args)
            symbol, shapes = _model(args)
            return _COMMANDS[args.command](args, parsed, symbol, shapes)
        except TofuError as e:
            return _error(str(e))
        except mx.base.MXNetError as e:     # from the graph or shapes given: see the docstring
            if os.environ.get("TOFU_MX_TRACEBACK"):
                raise
            return _error(f"MXNet failed: {mxnet_message(e)}; check the model and the shapes "
                          f"given (TOFU_MX_TRACEBACK=1 shows where it failed)")
        except BrokenPipeError:        # the reader went away (``tofu-mx plan ... | head``)
            return reader_gone()


def reader_gone() -> int:
    """What a command whose reader closed the pipe (``... | head``) returns: 0, quietly (the
    reader had what it wanted); stdout goes to /dev/null so that Python's last flush at exit
    raises nothing."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
