"""The typed words of a :class:`~tofu_mx.search.plan.Plan`: how a tensor is stored at one
cut (:class:`StoredLayout`) and what an operator does at one cut (:class:`OpStrategy`).

Plans carry these values; their text (``split(1)``, ``replicated``, ``split b``,
``reduce ci``, ``replicate all``, ``whole``) is for reports and JSON only, and :func:`parse`
reads it back with a clear error.
"""
from __future__ import annotations

from dataclasses import dataclass

from tofu_mx.errors import InvalidArgumentError


@dataclass(frozen=True, order=True)
class StoredLayout:
    """How one cut stores a tensor: split on ``axis`` among the cut's parts (each part holds
    its slice of what the earlier cuts left it), or, with ``axis`` None, replicated (every
    part holds all of it)."""

    axis: int | None = None

    @property
    def replicated(self) -> bool:
        return self.axis is None

    def __str__(self) -> str:
        return "replicated" if self.axis is None else f"split({self.axis})"

    @staticmethod
    def parse(text) -> "StoredLayout":
        """The layout :meth:`__str__` wrote."""
        if text == "replicated":
            return REPLICATED_LAYOUT
        if isinstance(text, str) and text.startswith("split(") and text.endswith(")") and \
                text[6:-1].isdigit():
            return StoredLayout(int(text[6:-1]))
        raise InvalidArgumentError(f"a stored layout is 'replicated' or 'split(<axis>)', got "
                                   f"{text!r}; give the text Plan.to_json() wrote")

    @staticmethod
    def of(search_layout: tuple) -> "StoredLayout":
        """From the search's ``("split", axis)`` / ``("replicated",)``."""
        return REPLICATED_LAYOUT if search_layout[0] == "replicated" else \
            StoredLayout(search_layout[1])


REPLICATED_LAYOUT = StoredLayout(None)

#: what an operator's share does at one cut: split an output loop variable, reduce over a
#: reduction variable (partial outputs, combined), compute all of it on every part, or (no
#: description) run whole on part 0
STRATEGY_KINDS = ("split", "reduce", "replicate", "whole")


@dataclass(frozen=True, order=True)
class OpStrategy:
    """What one cut does with an operator: ``kind`` (:data:`STRATEGY_KINDS`) over the loop
    variable ``var`` of its description (None for ``whole``)."""

    kind: str
    var: str | None = None

    def __post_init__(self):
        if self.kind not in STRATEGY_KINDS:
            raise InvalidArgumentError(f"an operator's strategy is one of "
                                       f"{' / '.join(STRATEGY_KINDS)}, got {self.kind!r}")
        if (self.var is None) != (self.kind == "whole") or \
                (self.var is not None and not isinstance(self.var, str)):
            raise InvalidArgumentError(f"strategy {self.kind!r} takes "
                                       f"{'no' if self.kind == 'whole' else 'a'} loop variable, "
                                       f"got {self.var!r}")

    def __str__(self) -> str:
        return self.kind if self.var is None else f"{self.kind} {self.var}"

    @staticmethod
    def parse(text) -> "OpStrategy":
        """The strategy :meth:`__str__` wrote."""
        if not isinstance(text, str):
            raise InvalidArgumentError(f"an operator's strategy is text such as 'split b', got "
                                       f"{text!r}; give the text Plan.to_json() wrote")
        kind, _, var = text.partition(" ")
        return OpStrategy(kind, var or None)

    @staticmethod
    def of(strategy) -> "OpStrategy":
        """From a :class:`tofu_mx.tdl.analysis.Strategy`."""
        kind = {"output": "split", "reduce": "reduce", "replicate": "replicate",
                "whole": "whole"}[strategy.kind]
        return OpStrategy(kind, None if kind == "whole" else strategy.var)


@dataclass(frozen=True)
class OpaqueOp:
    """An operator the plan cannot analyse: no description (it runs whole on one device), or
    registered opaque (split on its batch axis, if it has one)."""

    name: str
    op: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.op}): {self.reason}"


__all__ = ["OpStrategy", "OpaqueOp", "REPLICATED_LAYOUT", "STRATEGY_KINDS", "StoredLayout"]
