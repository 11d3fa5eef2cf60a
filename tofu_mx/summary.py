"""What a graph holds: operators by type, parameters and their bytes, activation bytes."""
from __future__ import annotations

import decimal
import re
from collections import Counter
from dataclasses import dataclass

from nnvm_passes.ir import Graph
from tofu_mx.arguments import show
from tofu_mx.errors import InvalidArgumentError

#: byte units parse_bytes reads (lower case): binary (KiB = 1024) and decimal (KB = 1000)
BYTE_UNITS = {"": 1, "b": 1,
              "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4,
              "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4}
#: amounts parse_bytes refuses from here up: more bytes than MXNet can count (int64)
MAX_BYTES = 2 ** 63
_AMOUNT = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)(e[+-]?\d+)?\s*([a-z]*)\s*", re.IGNORECASE)


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.50 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def parse_bytes(text: str) -> int:
    """An amount of memory as written by a person, in bytes: ``"16GiB"``, ``"512 MiB"``,
    ``"1.5GB"``, ``"1e9"``, ``"1024"``. ``KiB``/``MiB``/``GiB``/``TiB`` are powers of 1024,
    ``KB``/``MB``/``GB``/``TB`` powers of 1000, a bare number (or ``B``) is bytes; case and a
    space before the unit do not matter. A fraction of a byte is rounded to the nearest.

    Raises :class:`tofu_mx.InvalidArgumentError` naming the text and the accepted forms; a
    negative amount, ``nan``, ``inf`` and amounts of :data:`MAX_BYTES` or more get their own
    message. 0 is an amount (whether a budget of 0 makes sense is the caller's call).
    """
    found = _AMOUNT.fullmatch(str(text))
    unit = found.group(3).lower() if found else None
    if unit not in BYTE_UNITS:
        _refuse_amount(str(text))
    number = decimal.Decimal(found.group(1) + (found.group(2) or ""))
    if number >= decimal.Decimal(MAX_BYTES) / BYTE_UNITS[unit]:     # before it overflows
        raise InvalidArgumentError(
            f"{show(text, 40)} is too large an amount of memory: {MAX_BYTES:.3g} bytes (2**63) or "
            f"more; give an amount a device can have, e.g. 16GiB")
    return int((number * BYTE_UNITS[unit]).to_integral_value(decimal.ROUND_HALF_EVEN))


def _refuse_amount(text: str) -> None:
    written = text.strip()
    if re.fullmatch(r"[+-]?(nan|inf(inity)?)\s*[a-z]*", written, re.IGNORECASE):
        why = " (not a finite number)"
    elif written.startswith("-") and _AMOUNT.fullmatch(written[1:]):
        why = " (negative)"
    else:
        why = ""
    raise InvalidArgumentError(
        f"cannot read {show(text, 40)} as an amount of memory{why}; expected a number of bytes "
        f"with an optional unit: 1024, 1e9, 512MiB, 16GiB, 1.5GB (KiB MiB GiB TiB: powers of "
        f"1024; KB MB GB TB: powers of 1000)")


@dataclass(frozen=True)
class GraphSummary:
    """Counts and bytes of one imported graph (forward pass, one copy of everything)."""

    op_counts: tuple[tuple[str, int], ...]   # (operator, count), most frequent first
    param_count: int                         # parameter tensors
    param_elements: int
    param_bytes: int
    aux_bytes: int                           # auxiliary states (BatchNorm statistics)
    input_bytes: int                         # data and label inputs
    activation_bytes: int                    # every operator output, hidden outputs included

    @property
    def num_operators(self) -> int:
        return sum(count for _, count in self.op_counts)

    def __str__(self) -> str:
        ops = ", ".join(f"{op} x{count}" for op, count in self.op_counts)
        return "\n".join([
            f"operators    {self.num_operators:>14,}   ({ops})",
            f"parameters   {self.param_elements:>14,}   in {self.param_count} tensors, "
            f"{format_bytes(self.param_bytes)}",
            f"aux states   {format_bytes(self.aux_bytes):>14}",
            f"inputs       {format_bytes(self.input_bytes):>14}",
            f"activations  {format_bytes(self.activation_bytes):>14}   (all operator outputs of "
            f"one forward pass)",
        ])


def summarize(graph: Graph) -> GraphSummary:
    """Counts and bytes of ``graph``."""
    counts = Counter(n.op for n in graph.operators())
    params = [n.outputs[0] for n in graph.variables("param")]
    return GraphSummary(
        op_counts=tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        param_count=len(params),
        param_elements=sum(t.size for t in params),
        param_bytes=sum(t.nbytes for t in params),
        aux_bytes=sum(n.outputs[0].nbytes for n in graph.variables("aux")),
        input_bytes=sum(n.outputs[0].nbytes for n in graph.variables()
                        if n.kind in ("data", "label")),
        activation_bytes=sum(t.nbytes for n in graph.operators() for t in n.outputs),
    )
