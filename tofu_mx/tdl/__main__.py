"""``python -m tofu_mx.tdl --coverage [--mxnet [--public] | --symbol FILE --shape NAME=D1,D2 ...]``"""
import argparse
import sys

import mxnet as mx

from tofu_mx.cli import _shape, reader_gone
from tofu_mx.errors import TofuError
from tofu_mx.tdl.coverage import (builtin_graphs, coverage, format_coverage,
                                  format_mxnet_coverage, mxnet_coverage)
from tofu_mx.tdl.lang import TDLError


def main(argv=None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:     # ``python -m tofu_mx.tdl --coverage ... | head``
        return reader_gone()


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tofu_mx.tdl",
                                     description="operator description coverage")
    parser.add_argument("--coverage", action="store_true", required=True,
                        help="print which operators are described, checked, or opaque")
    parser.add_argument("--symbol", help="a symbol JSON file (default: the model zoo and the "
                                         "paper's models)")
    parser.add_argument("--shape", type=_shape, action="append",
                        help="input shape NAME=D1,D2,... for --symbol; repeat per input")
    parser.add_argument("--mxnet", action="store_true",
                        help="every operator MXNet registers: described (and checked against "
                             "its kernel), opaque, fallback or out of scope, with the reason")
    parser.add_argument("--public", action="store_true",
                        help="with --mxnet: list only the public names (no leading _)")
    args = parser.parse_args(argv)
    if args.mxnet:
        if args.symbol:
            parser.error("--mxnet and --symbol are exclusive")
        rows = mxnet_coverage()
        print(format_mxnet_coverage(rows, public_only=args.public))
        return 0 if all(r.ok for r in rows) else 1
    if args.public:
        parser.error("--public goes with --mxnet")
    try:
        if args.symbol:
            if not args.shape:
                raise TDLError("--symbol needs --shape NAME=D1,D2,... for each input")
            graphs = [(args.symbol, mx.sym.load(args.symbol), dict(args.shape))]
        else:
            graphs = builtin_graphs()
        rows = coverage(graphs)
    except (TofuError, mx.base.MXNetError) as e:
        print(f"tofu_mx.tdl: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(format_coverage(rows))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
