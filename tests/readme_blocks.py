"""README.md's code blocks and the directives that say how to test them.

Blocks. A fenced block opened by ```` ```python ```` or ```` ```sh ```` is code to run; any
other fence (```` ```text ````, a bare ```` ``` ````, ```` ```json ````, ...) is not, and is
ignored. A fence may be indented by up to 3 spaces (inside a list item); that indentation is
taken off its lines. Shell written as ```` ```bash ````, ```` ```console ````, ```` ```shell ````
(and the like), or Python as ```` ```py ````, is refused: it would silently go untested, so
write ```` ```sh ```` or ```` ```python ````.

Directives. One or more HTML comments, each alone on its line, on the lines right before a
fence (blank lines between them allowed), say how that one block is tested:

    <!-- readme-test: skip: REASON -->   the block is not run; REASON (not empty) says why
    <!-- readme-test: exit N -->         ```sh only: the block is exactly one command (after
                                         joining lines that end in a backslash, leaving out
                                         blank and comment-only lines), whose status must be
                                         N (0-255); without it, every command must exit 0
    <!-- readme-test: prints TEXT -->    the block's stdout and stderr together contain TEXT
                                         (a plain substring, spaces at its ends dropped); may
                                         repeat, each TEXT must be there

A skipped block takes no other directive; a block takes at most one ``exit``. Anything else is
refused, naming the line: an unknown directive (``skpi``), a comment that mentions readme-test
but is not one directive on one line, a directive followed by text rather than a fence, a
directive on a fence that never runs, a fence never closed.

``parse_readme(text)`` returns the runnable blocks (skipped ones included, with their reason)
in README order, or raises ``ReadmeSpecError`` listing every problem found.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

#: fences whose code runs
RUN_LANGUAGES = ("python", "sh")
#: fences refused: shell or Python under another name would go untested
MISNAMED = {**dict.fromkeys(("bash", "shell", "console", "zsh", "shell-session", "sh-session",
                             "shellsession", "terminal"), "sh"),
            **dict.fromkeys(("py", "py3", "python3"), "python")}
USAGE = ("`<!-- readme-test: skip: REASON -->`, `<!-- readme-test: exit N -->` or "
         "`<!-- readme-test: prints TEXT -->`, each alone on its line")

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<ticks>`{3,})\s*(?P<info>[^`]*?)\s*$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*readme-test:\s*(?P<body>.*?)\s*-->\s*$")
_MENTION = re.compile(r"^\s*<!--.*readme[-_ ]?test", re.IGNORECASE)
_SKIP = re.compile(r"^\s*:\s*(?P<reason>\S.*)$")
_EXIT = re.compile(r"^\s+(?P<status>\d{1,3})$")
_PRINTS = re.compile(r"^\s+(?P<text>\S.*)$")


class ReadmeSpecError(ValueError):
    """README.md breaks the rules above; the message names each line and what to write."""


@dataclass(frozen=True)
class Directive:
    line: int                   # 1-based line of the comment
    kind: str                   # "skip", "exit" or "prints"
    value: str | int            # the reason, the status or the text


@dataclass(frozen=True)
class Fence:
    line: int                   # 1-based line of the opening ```
    language: str               # the info string's first word, lower case; "" when bare
    code: str                   # the lines between the fences, indentation taken off
    directives: tuple[Directive, ...]


@dataclass(frozen=True)
class Block:
    line: int                   # 1-based line of the opening ``` in README.md
    language: str               # "python" or "sh"
    code: str
    skip_reason: str | None     # not None: not run, and why
    expect_exit: int | None     # sh: the one command's expected status; None: all exit 0
    prints: tuple[str, ...]     # substrings the output must contain


def parse_readme(text: str, name: str = "README.md") -> tuple[Block, ...]:
    """The python and sh blocks of ``text`` in order, or ``ReadmeSpecError`` naming every
    problem as ``name:LINE: ...``."""
    problems: list[str] = []
    blocks = []
    for fence in scan(text, problems):
        try:
            block = to_block(fence)
        except ReadmeSpecError as e:
            problems.append(str(e))
            continue
        if block is not None:
            blocks.append(block)
    if problems:
        raise ReadmeSpecError(f"{name}: {len(problems)} problem(s) with its code blocks:\n"
                              + "\n".join(f"{name}:{p}" for p in problems))
    return tuple(blocks)


def scan(text: str, problems: list[str]) -> list[Fence]:
    """Every fence with the directives right before it; problems are appended as
    ``"LINE: message"``."""
    lines = text.splitlines()
    fences: list[Fence] = []
    pending: list[Directive] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening:
            end = _closing_line(lines, i, len(opening["ticks"]))
            if end is None:
                problems.append(f"{i + 1}: the ``` block opened here is never closed")
                return fences
            fences.append(Fence(i + 1, _language(opening["info"]),
                                _body(lines[i + 1:end], len(opening["indent"])), tuple(pending)))
            pending, i = [], end + 1
            continue
        if _MENTION.match(lines[i]):
            try:
                pending.append(parse_directive(lines[i], i + 1))
            except ReadmeSpecError as e:
                problems.append(str(e))
        elif lines[i].strip():
            problems.extend(_unattached(pending, f"text on line {i + 1}"))
            pending = []
        i += 1
    problems.extend(_unattached(pending, "the end of the file"))
    return fences


def parse_directive(line: str, number: int) -> Directive:
    """One ``<!-- readme-test: ... -->`` line, checked."""
    match = _DIRECTIVE.match(line)
    if match is None:
        raise ReadmeSpecError(f"{number}: not a directive: {line.strip()!r}; write {USAGE}")
    keyword, rest = re.match(r"^([A-Za-z_-]*)(.*)$", match["body"]).groups()
    if keyword == "skip":
        if not (skip := _SKIP.match(rest)):
            raise ReadmeSpecError(f"{number}: `skip` needs a reason: write "
                                  "`<!-- readme-test: skip: why it cannot run here -->`")
        return Directive(number, "skip", skip["reason"])
    if keyword == "exit":
        if not (exit_ := _EXIT.match(rest)) or int(exit_["status"]) > 255:
            raise ReadmeSpecError(f"{number}: `exit{rest}`: write `exit N` with N in 0-255")
        return Directive(number, "exit", int(exit_["status"]))
    if keyword == "prints":
        if not (prints := _PRINTS.match(rest)):
            raise ReadmeSpecError(f"{number}: `prints` needs the TEXT the output must contain")
        return Directive(number, "prints", prints["text"])
    raise ReadmeSpecError(f"{number}: unknown directive `{match['body']}`: write {USAGE}")


def to_block(fence: Fence) -> Block | None:
    """The fence as a Block, None for a fence that does not run; its directives checked."""
    if fence.language in MISNAMED:
        raise ReadmeSpecError(f"{fence.line}: ```{fence.language} blocks are never run: write "
                              f"```{MISNAMED[fence.language]}")
    if fence.language not in RUN_LANGUAGES:
        if fence.directives:
            raise ReadmeSpecError(f"{fence.directives[0].line}: a directive on the "
                                  f"```{fence.language} block of line {fence.line}, which "
                                  "never runs: only ```python and ```sh blocks run")
        return None
    by_kind = {kind: [d.value for d in fence.directives if d.kind == kind]
               for kind in ("skip", "exit", "prints")}
    _check_directives(fence, by_kind)
    return Block(fence.line, fence.language, fence.code,
                 skip_reason=by_kind["skip"][0] if by_kind["skip"] else None,
                 expect_exit=by_kind["exit"][0] if by_kind["exit"] else None,
                 prints=tuple(by_kind["prints"]))


def commands(code: str) -> tuple[str, ...]:
    """A sh block's commands: lines ending in a backslash joined to the next, spaces
    collapsed, blank and comment-only lines left out."""
    found: list[str] = []
    current = ""
    for line in code.splitlines():
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        if current.strip() and not current.lstrip().startswith("#"):
            found.append(" ".join(current.split()))
        current = ""
    if current.strip():
        found.append(" ".join(current.split()))
    return tuple(found)


def first_line(block: Block) -> str:
    """What a message shows of a block: its first command, or first line of code."""
    if block.language == "sh":
        return next(iter(commands(block.code)), "")
    return next((line.strip() for line in block.code.splitlines() if line.strip()), "")


def _check_directives(fence: Fence, by_kind: dict[str, list]) -> None:
    where = f"{fence.directives[0].line if fence.directives else fence.line}"
    if len(by_kind["skip"]) > 1 or len(by_kind["exit"]) > 1:
        raise ReadmeSpecError(f"{where}: the block of line {fence.line} has more than one "
                              "`skip` or `exit`: keep one")
    if by_kind["skip"] and (by_kind["exit"] or by_kind["prints"]):
        raise ReadmeSpecError(f"{where}: the block of line {fence.line} is skipped and takes "
                              "no `exit` or `prints`: drop them or the `skip`")
    if by_kind["exit"] and fence.language != "sh":
        raise ReadmeSpecError(f"{where}: `exit` is for ```sh blocks; the block of line "
                              f"{fence.line} is ```{fence.language}")
    if by_kind["exit"] and len(found := commands(fence.code)) != 1:
        raise ReadmeSpecError(f"{where}: `exit {by_kind['exit'][0]}` needs a block of exactly "
                              f"one command; the block of line {fence.line} has {len(found)}: "
                              "move the command expected to fail into a block of its own")


def _closing_line(lines: list[str], opening: int, ticks: int) -> int | None:
    closing = re.compile(rf"^ {{0,3}}`{{{ticks},}}\s*$")
    return next((j for j in range(opening + 1, len(lines)) if closing.match(lines[j])), None)


def _language(info: str) -> str:
    return info.split()[0].lower() if info.split() else ""


def _body(lines: list[str], indent: int) -> str:
    return "".join(line[min(indent, len(line) - len(line.lstrip(" "))):] + "\n"
                   for line in lines)


def _unattached(pending: list[Directive], before: str) -> list[str]:
    return [f"{d.line}: a directive must come right before a ``` block (blank lines "
            f"allowed), not before {before}" for d in pending]
