"""What a graph holds: operators by type, parameters and their bytes, activation bytes."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from nnvm_passes.ir import Graph


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.50 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


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
