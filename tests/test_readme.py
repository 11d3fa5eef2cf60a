"""Every python and sh block of README.md runs as written and prints what it claims.

``test_every_readme_block_runs_as_written`` runs README's blocks in README order, as a
newcomer who has run ``make test`` (or ``pip install -e '.[cpu,test]'``) follows it in a
fresh clone, all in one temporary folder, so that a block may read what an earlier one wrote
(``net-symbol.json``). The rules for blocks and directives are in ``tests/readme_blocks.py``.

- The folder looks like the clone's root for what README uses: ``LINKED`` are symbolic links
  to this checkout; ``docs/`` is an empty folder of its own, since README's ``draw`` writes
  ``-o docs/...png`` and the committed picture must not be overwritten. Everything else a
  block writes stays in the folder.
- A ``sh`` block runs as one script, ``bash -e -o pipefail``: every command must exit 0, or,
  with ``exit N``, its one command must exit N. A ``python`` block is written to a file in the
  folder and run by this interpreter in a process of its own (its imports are its own).
- Environment: the user's, with the directory of ``sys.executable`` first on PATH (``python``
  and the ``tofu-mx`` that ``pip install -e`` put there are this environment's), and without
  ``MXNET_*`` variables, which ``import tofu_mx`` set in this pytest process and a newcomer's
  shell does not have. PYTHONPATH is not set: a newcomer has none, and the package is
  installed (editable) from this checkout, which the test checks first.
- Each block has ``BLOCK_TIMEOUT_S`` (the process group is killed at the end of it). Every
  block runs even after one fails; the failure lists every failing block with its README
  line, first line, exit status and last output lines, and every block's wall time (also in
  ``readme-timings.json`` in the test's tmp folder). The time is not asserted: over
  ``BUDGET_S`` it warns.

Deselect it with ``-m "not readme"``; run it alone with
``pytest tests/test_readme.py -m readme``.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.readme_blocks import (MISNAMED, Block, ReadmeSpecError, commands, first_line,
                                 parse_readme, scan)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: what README's blocks read from the clone, linked into the folder they run in
LINKED = ("examples", "bench", "tofu_mx", "nnvm_passes", "setup.py", "Makefile", "README.md")
#: folders README's blocks write into: real, empty ones in the folder
EMPTY = ("docs",)
BLOCK_TIMEOUT_S = 600
#: all blocks together; blocks past it are reported as not run, before pytest-timeout fires
CHAIN_LIMIT_S = 1500
#: what the chain should take (2 cores); over it the test warns, it does not fail
BUDGET_S = 360
TAIL_LINES = 40
#: commands that would change the environment the tests run in (reinstall this package,
#: rebuild .venv, run the suite inside a test): README must mark such blocks `skip: REASON`
CHANGES_ENVIRONMENT = re.compile(r"\bpip3?\s+install\b|(^|[;&|(]\s*)make\b")


@dataclass(frozen=True)
class Outcome:
    block: Block
    status: int | None          # None: timed out, or not run
    output: str                 # stdout and stderr together
    seconds: float
    problems: tuple[str, ...]   # empty: as README says


# ---- the parser, on small inline READMEs ------------------------------------------------

def test_python_and_sh_blocks_run_other_fences_are_ignored():
    blocks = parse_readme("# t\n\n```python\nprint(1)\n```\n\n```text\nout\n```\n```\nbare\n"
                          "```\n```json\n{}\n```\n```sh\necho hi\n```\n")
    assert [(b.line, b.language, b.code) for b in blocks] == [
        (3, "python", "print(1)\n"), (16, "sh", "echo hi\n")]
    assert blocks[0] == Block(3, "python", "print(1)\n", None, None, ())


def test_directives_attach_to_the_next_fence_only():
    text = ("<!-- readme-test: exit 2 -->\n\n<!-- readme-test: prints no plan fits -->\n"
            "<!-- readme-test: prints 10 devices -->\n```sh\ntofu-mx plan rnn\n```\n"
            "```sh\necho two\n```\n"
            "<!-- readme-test: skip: needs 8 GPUs -->\n```python\nimport x\n```\n")
    first, second, third = parse_readme(text)
    assert (first.expect_exit, first.prints) == (2, ("no plan fits", "10 devices"))
    assert (second.expect_exit, second.prints, second.skip_reason) == (None, (), None)
    assert third.skip_reason == "needs 8 GPUs"


def test_skip_without_a_reason_is_refused_naming_its_line():
    for directive in ("skip", "skip:", "skip:   ", "skip because"):
        with pytest.raises(ReadmeSpecError, match=r"README.md:3: `skip` needs a reason"):
            parse_readme(f"text\n\n<!-- readme-test: {directive} -->\n```sh\necho\n```\n")


def test_unknown_or_malformed_directives_are_refused():
    for line, message in [("<!-- readme-test: skpi: typo -->", r"unknown directive `skpi: typo`"),
                          ("<!-- readme-test: exits 2 -->", r"unknown directive `exits 2`"),
                          ("<!-- readme-test skip: no colon -->", r"not a directive"),
                          ("<!-- Readme-Test: skip: case -->", r"not a directive"),
                          ("<!-- readme-test: skip: two lines", r"not a directive"),
                          ("<!-- readme-test: exit two -->", r"`exit two`: write `exit N` with N in 0-255"),
                          ("<!-- readme-test: exit 256 -->", r"`exit 256`: write `exit N`"),
                          ("<!-- readme-test: prints -->", r"`prints` needs the TEXT")]:
        with pytest.raises(ReadmeSpecError, match=r"README.md:1: " + message):
            parse_readme(f"{line}\n```sh\necho\n```\n")


@pytest.mark.parametrize("text, message", [
    ("<!-- readme-test: exit 1 -->\nsome text\n```sh\nfalse\n```\n",
     r"README.md:1: a directive must come right before a ``` block .* not before text on "
     r"line 2"),
    ("<!-- readme-test: exit 1 -->\n\n", r"README.md:1: .*the end of the file"),
    ("<!-- readme-test: prints x -->\n```text\nx\n```\n",
     r"README.md:1: a directive on the ```text block of line 2, which never runs"),
    ("<!-- readme-test: exit 2 -->\n```sh\ntrue\nfalse\n```\n",
     r"README.md:1: `exit 2` needs a block of exactly one command; the block of line 2 has 2"),
    ("<!-- readme-test: exit 1 -->\n```python\nraise SystemExit(1)\n```\n",
     r"`exit` is for ```sh blocks"),
])
def test_a_directive_in_the_wrong_place_is_refused(text, message):
    """A directive must come right before a block that runs; ``exit`` needs an ```sh block of
    exactly one command."""
    with pytest.raises(ReadmeSpecError, match=message):
        parse_readme(text)


def test_exit_counts_a_command_across_comments_blank_lines_and_continuations():
    (block,) = parse_readme("<!-- readme-test: exit 2 -->\n```sh\n# a comment\n\n"
                            "tofu-mx plan rnn \\\n    --devices 6   # why\n```\n")
    assert block.expect_exit == 2


def test_conflicting_directives_are_refused():
    for directives, message in [(("skip: gpu", "prints x"), r"is skipped and takes no"),
                                (("exit 1", "exit 2"), r"more than one `skip` or `exit`"),
                                (("skip: a", "skip: b"), r"more than one `skip` or `exit`")]:
        text = "".join(f"<!-- readme-test: {d} -->\n" for d in directives) + "```sh\nx\n```\n"
        with pytest.raises(ReadmeSpecError, match=message):
            parse_readme(text)


def test_backslash_continuations_are_one_command():
    code = ("# comment\npython a.py --x 1 \\\n    --y 2   # trailing\n\n"
            "tofu-mx plan \\\n  rnn\n")
    assert commands(code) == ("python a.py --x 1 --y 2 # trailing", "tofu-mx plan rnn")
    assert first_line(Block(1, "sh", code, None, None, ())) == "python a.py --x 1 --y 2 # trailing"


def test_shell_under_another_name_is_refused():
    for language, write in [("bash", "sh"), ("console", "sh"), ("Shell", "sh"), ("py", "python")]:
        with pytest.raises(ReadmeSpecError, match=rf"README.md:2: ```{language.lower()} blocks "
                                                  rf"are never run: write ```{write}"):
            parse_readme(f"x\n```{language}\n$ ls\n```\n")


def test_every_problem_is_listed_and_fences_are_closed():
    with pytest.raises(ReadmeSpecError, match=r"2 problem\(s\)[^$]*:1: unknown[^$]*:5: ```bash"):
        parse_readme("<!-- readme-test: skpi -->\n```sh\nx\n```\n```bash\nls\n```\n")
    with pytest.raises(ReadmeSpecError, match=r"README.md:2: the ``` block opened here is never"):
        parse_readme("x\n```python\nprint(1)\n")


def test_indented_fences_and_directives_in_code_are_code():
    text = ("- item\n\n   ```sh\n   echo a\n     echo b\n   ```\n"
            "```text\n<!-- readme-test: skpi -->\n```\n")
    (block,) = parse_readme(text)
    assert block.code == "echo a\n  echo b\n"


# ---- the harness, on small inline READMEs -----------------------------------------------

def test_blocks_share_one_folder_that_looks_like_the_clone(tmp_path):
    blocks = parse_readme(
        "```sh\necho hello > note.txt\nls docs | wc -l\ntest -f setup.py -a -d tofu_mx\n```\n"
        "<!-- readme-test: prints hello from sh -->\n"
        "```python\nimport os\nprint(open('note.txt').read().strip(), 'from sh')\n"
        "print(os.path.islink('docs'), os.path.realpath('examples'))\n```\n"
        "<!-- readme-test: exit 3 -->\n<!-- readme-test: prints usage -->\n"
        "```sh\nsh -c 'echo usage >&2; exit 3'\n```\n")
    outcomes = run_chain(blocks, clone_like_folder(tmp_path), environment(tmp_path))
    assert [o.problems for o in outcomes] == [(), (), ()]
    assert outcomes[0].output == "0\n"                              # docs/ starts empty
    assert outcomes[1].output == f"hello from sh\nFalse {ROOT / 'examples'}\n"


def test_a_failing_block_is_named_by_line_with_its_output(tmp_path):
    blocks = parse_readme("text\n\n```sh\necho one\nfalse\necho never\n```\n"
                          "<!-- readme-test: prints nothing like this -->\n"
                          "```python\nprint('something')\n```\n"
                          "<!-- readme-test: exit 2 -->\n```sh\ntrue\n```\n")
    outcomes = run_chain(blocks, clone_like_folder(tmp_path), environment(tmp_path))
    assert [o.problems for o in outcomes] == [
        ("exit status 1, expected 0",), ("did not print 'nothing like this'",),
        ("exit status 0, expected 2",)]
    message = failure_message(outcomes)
    assert "README.md:3 (sh) `echo one`: exit status 1, expected 0" in message
    assert "README.md:9 (python) `print('something')`: did not print" in message
    assert "    | one\n" in message and "never" not in message
    assert re.search(r"line 3 +sh +\d+\.\d s +FAILED", message)


def test_a_block_past_its_time_is_killed_with_its_children(tmp_path):
    (block,) = parse_readme("```sh\nsleep 60 &\necho started\nwait\n```\n")
    started = time.monotonic()
    outcome = run_block(block, clone_like_folder(tmp_path), environment(tmp_path), timeout=2)
    assert time.monotonic() - started < 30
    assert outcome.status is None and outcome.problems == ("timed out after 2 s",)
    assert outcome.output == "started\n"


# ---- README.md itself ---------------------------------------------------------------------

def test_readme_writes_shell_as_sh():
    problems: list[str] = []
    misnamed = [f"README.md:{f.line}: ```{f.language}" for f in scan(README.read_text(), problems)
                if f.language in MISNAMED]
    assert not misnamed, ("blocks that would never run; write ```sh (or ```python): "
                          + ", ".join(misnamed))


def test_readme_blocks_follow_the_rules():
    blocks = parse_readme(README.read_text())     # raises, listing every problem
    unsafe = [f"README.md:{b.line}: `{c}`" for b in blocks if b.skip_reason is None
              and b.language == "sh" for c in commands(b.code) if CHANGES_ENVIRONMENT.search(c)]
    assert not unsafe, ("these would change the environment the tests run in; mark their "
                        "blocks `<!-- readme-test: skip: REASON -->`: " + ", ".join(unsafe))


@pytest.mark.readme
@pytest.mark.timeout(CHAIN_LIMIT_S + 300)
def test_every_readme_block_runs_as_written(tmp_path):
    blocks = parse_readme(README.read_text())
    check_installed_from_this_checkout(tmp_path)
    outcomes = run_chain(blocks, clone_like_folder(tmp_path), environment(tmp_path))
    total = sum(o.seconds for o in outcomes)
    (tmp_path / "readme-timings.json").write_text(json.dumps(
        [{"line": o.block.line, "language": o.block.language, "seconds": round(o.seconds, 2),
          "problems": list(o.problems)} for o in outcomes], indent=1))
    print(timings(outcomes))
    if total > BUDGET_S:
        warnings.warn(f"README's blocks took {total:.0f} s, over their {BUDGET_S} s budget: "
                      f"{timings(outcomes)}")
    assert not any(o.problems for o in outcomes), failure_message(outcomes)


# ---- running ------------------------------------------------------------------------------

def clone_like_folder(into: Path) -> Path:
    folder = into / "clone"
    folder.mkdir()
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name)
    for name in EMPTY:
        (folder / name).mkdir()
    return folder


def environment(into: Path) -> dict[str, str]:
    """The user's environment, this interpreter's directory first on PATH (with a ``python``
    in it), without the ``MXNET_*`` variables ``import tofu_mx`` set here."""
    bin_dirs = [str(Path(sys.executable).parent)]
    if not (Path(sys.executable).parent / "python").exists():
        (into / "bin").mkdir()
        (into / "bin" / "python").symlink_to(sys.executable)
        bin_dirs.insert(0, str(into / "bin"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MXNET_")}
    env["PATH"] = os.pathsep.join([*bin_dirs, env.get("PATH", "")])
    return env


def check_installed_from_this_checkout(into: Path) -> None:
    """README runs ``tofu-mx``, which imports the installed package: it must be this one."""
    script = Path(sys.executable).parent / "tofu-mx"
    assert script.exists(), (f"README runs `tofu-mx`, which `pip install -e '.[cpu,test]'` "
                             f"puts next to {sys.executable}; it is not there: install first")
    found = subprocess.run([sys.executable, "-c", "import importlib.util as u; "
                            "print(u.find_spec('tofu_mx').origin)"], cwd=into, text=True,
                           capture_output=True, env=environment(into), timeout=60)
    origin = Path(found.stdout.strip()).resolve()
    assert origin == ROOT / "tofu_mx" / "__init__.py", (
        f"the installed tofu_mx is {origin or found.stderr}, not this checkout's ({ROOT}): "
        f"`pip install -e '.[cpu,test]'` here, or README's `tofu-mx` runs other code")


def run_chain(blocks: tuple[Block, ...], folder: Path, env: dict[str, str]) -> list[Outcome]:
    """Every block not skipped, in order, each after the previous one whatever it gave."""
    outcomes: list[Outcome] = []
    deadline = time.monotonic() + CHAIN_LIMIT_S
    for block in blocks:
        if block.skip_reason is not None:
            continue
        left = deadline - time.monotonic()
        if left < 1:
            outcomes.append(Outcome(block, None, "", 0.0, (f"not run: the chain's "
                                                           f"{CHAIN_LIMIT_S} s ran out",)))
            continue
        outcomes.append(run_block(block, folder, env, timeout=min(BLOCK_TIMEOUT_S, int(left))))
        print(f"README.md:{block.line} {block.language} {outcomes[-1].seconds:.1f} s "
              f"{'FAILED' if outcomes[-1].problems else 'ok'}", flush=True)
    return outcomes


def run_block(block: Block, folder: Path, env: dict[str, str], timeout: int) -> Outcome:
    started = time.monotonic()
    process = subprocess.Popen(block_command(block, folder), cwd=folder, env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        status = process.returncode
    except subprocess.TimeoutExpired:
        kill_group(process)
        output, _ = process.communicate(timeout=30)
        status = None
    finally:                        # also when pytest-timeout or ^C interrupts the wait
        if process.poll() is None:
            kill_group(process)
            process.wait(timeout=30)
    text = output.decode(errors="replace")
    return Outcome(block, status, text, time.monotonic() - started,
                   problems(block, status, text, timeout))


def block_command(block: Block, folder: Path) -> list[str]:
    if block.language == "python":
        script = folder / f"readme_line_{block.line}.py"
        script.write_text(block.code)
        return [sys.executable, script.name]
    script = folder.parent / "blocks" / f"readme_line_{block.line}.sh"
    script.parent.mkdir(exist_ok=True)
    script.write_text(block.code)
    return ["bash", "-e", "-o", "pipefail", str(script)]


def kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def problems(block: Block, status: int | None, output: str, timeout: int) -> tuple[str, ...]:
    expected = 0 if block.expect_exit is None else block.expect_exit
    found = []
    if status is None:
        found.append(f"timed out after {timeout} s")
    elif status < 0:
        found.append(f"killed by signal {-status}, expected exit status {expected}")
    elif status != expected:
        found.append(f"exit status {status}, expected {expected}")
    found += [f"did not print {text!r}" for text in block.prints if text not in output]
    return tuple(found)


# ---- reporting ----------------------------------------------------------------------------

def failure_message(outcomes: list[Outcome]) -> str:
    failed = [o for o in outcomes if o.problems]
    parts = [f"{len(failed)} of {len(outcomes)} README blocks run did not do what README says"
             " (a later failure may follow from an earlier one):"]
    for o in failed:
        tail = o.output.splitlines()[-TAIL_LINES:]
        parts.append(f"\nREADME.md:{o.block.line} ({o.block.language}) `{first_line(o.block)}`: "
                     + "; ".join(o.problems) + f"\n  last {len(tail)} lines of its output:\n"
                     + "".join(f"    | {line}\n" for line in tail))
    parts.append(timings(outcomes))
    return "\n".join(parts)


def timings(outcomes: list[Outcome]) -> str:
    rows = [f"  line {o.block.line:<4} {o.block.language:<6} {o.seconds:7.1f} s  "
            f"{'FAILED' if o.problems else 'ok'}" for o in outcomes]
    total = sum(o.seconds for o in outcomes)
    return "\n".join(["wall time per block:", *rows, f"  total {total:.1f} s "
                      f"(budget {BUDGET_S} s)"])
