"""The commands README.md and docs/*.md show work with the real ``filesink`` parser, as test_cli_reference.py checks
docs/cli.md's reference sections:

- every ``filesink ...`` (``python -m filesink ...``, ``python -m recovery ...``) command line in a fenced code block
  names a real command, and every option it uses is an exact option of that command (no abbreviations); a full
  command (not a synopsis with ``[...]``) gives the options the command requires, and parses;
- every ``filesink ...`` inline code span uses only exact options of the command it names;
- the exit codes the docs state for ``filesink run`` are the ones it has;
- the Polars example of the quickstart reads a partitioned output, and types ``event_date`` as ``Date``.

No Spark: the parser is built in this process, and the Polars example runs on a directory written with pyarrow.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from filesink import errors
from filesink.cli.main import build_parser

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

RUN_EXIT_CODES = {
    errors.EXIT_OK,
    errors.EXIT_FAILED,
    errors.EXIT_USAGE,
    errors.EXIT_LOCKED,
    errors.EXIT_DAMAGED,
    errors.EXIT_INTERRUPTED,
}
"""What ``filesink run`` exits with (``EXIT_NOT_A_SINK`` is ``recover``'s only)."""

SHELL_INFO = {"", "bash", "sh", "shell", "console", "sh-session", "text"}
"""Fenced blocks whose lines may be commands (not python blocks, which import the package)."""

FENCE = re.compile(
    r"^(?P<indent>[ ]*)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)\n(?P<body>.*?)^[ ]*(?P=fence)[ \t]*$", re.M | re.S
)
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
PYTHON = re.compile(r"(?:.*/)?python(?:3(?:\.\d+)?)?")
PROMPT = re.compile(r"^(?:\$|%|>)\s+")
# A word that is an option (--name, --name=value, -x), also after the [ ( | of a synopsis; not a value with a dash.
OPTION = re.compile(r"[\[(|]*(--?[A-Za-z][A-Za-z0-9_-]*)")
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*|\.\.\.|<[^>]*>|\[.*")


@dataclass
class Command:
    doc: str
    line: int
    text: str
    words: list[str]  # after the program: ["recover", "status", "--state-dir", "DIR"]
    fenced: bool

    def where(self) -> str:
        return f"{self.doc}:{self.line}: {self.text!r}"


# -- finding the commands -----------------------------------------------------------------------------------


def _blocks(text: str):
    """(info string, first line number of the body, the body dedented) of each fenced code block."""
    for m in FENCE.finditer(text):
        indent = len(m.group("indent"))
        body = "\n".join(line[indent:] if line[:indent].isspace() else line for line in m.group("body").splitlines())
        yield m.group("info").strip().lower(), text[: m.start("body")].count("\n") + 1, body


def _logical_lines(body: str):
    """(line number within the body, text) of each logical line: backslash continuations joined, and the indented
    lines of a synopsis that goes on without a backslash joined to the command they continue."""
    lines: list[tuple[int, str]] = []
    pending = False  # the previous line ended with a backslash
    for n, raw in enumerate(body.splitlines()):
        line = raw.rstrip()
        if (pending or (raw[:1].isspace() and line.strip().startswith(("[", "--")))) and lines:
            start, text = lines[-1]
            lines[-1] = (start, text + " " + line.strip())
        else:
            lines.append((n, line.strip()))
        pending = line.endswith("\\")
        if pending:
            start, text = lines[-1]
            lines[-1] = (start, text[:-1].rstrip())
    return lines


def _options_in(words: list[str]) -> list[str]:
    return [m.group(1) for m in map(OPTION.match, words) if m]


def _split_words(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote in a synopsis
        return text.split()


def _program_words(words: list[str]) -> list[str] | None:
    """The words after ``filesink`` (``python -m recovery X`` as ``recover X``), or None if this is not one."""
    while words and (ENV_ASSIGNMENT.fullmatch(words[0]) or words[0] in ("env", "sudo", "exec", "time")):
        words = words[1:]
    if not words:
        return None
    if words[0] == "filesink" or words[0].endswith("/filesink"):
        return words[1:]
    if PYTHON.fullmatch(words[0]) and words[1:2] == ["-m"] and len(words) > 2:
        if words[2] == "filesink":
            return words[3:]
        if words[2] == "recovery":
            return ["recover", *words[3:]]
    return None


def fenced_commands(doc: Path) -> list[Command]:
    text = doc.read_text()
    found = []
    for info, first, body in _blocks(text):
        if info not in SHELL_INFO:
            continue
        prompted = any(PROMPT.match(line) for line in body.splitlines())  # then the other lines are output
        for n, line in _logical_lines(body):
            if prompted and not PROMPT.match(line):
                continue
            line = PROMPT.sub("", line)
            if line.startswith("#"):
                continue
            for part in re.split(r"&&|\|\||;", line) if "filesink" in line else []:
                words = _program_words(_split_words(part.strip()))
                if words is not None:
                    found.append(Command(doc.name, first + n, part.strip(), words, fenced=True))
    return found


def _prose(text: str) -> str:
    """The text without its fenced code blocks (each replaced by as many empty lines, to keep line numbers)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def inline_commands(doc: Path) -> list[Command]:
    """``filesink ...`` inline code spans (which may wrap onto the next line) outside code blocks."""
    text = _prose(doc.read_text())
    found = []
    for m in re.finditer(r"(?<!`)`((?:python3? -m (?:filesink|recovery)|filesink)\b[^`]*)`(?!`)", text):
        span = " ".join(m.group(1).split())
        words = _program_words(_split_words(span))
        if words is not None:
            found.append(Command(doc.name, text[: m.start()].count("\n") + 1, span, words, fenced=False))
    return found


# -- the parser ---------------------------------------------------------------------------------------------


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """The ``filesink`` parser, built once (only read here; a command line is parsed by a new one)."""
    return build_parser()


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


@dataclass
class Resolved:
    path: tuple[str, ...]
    parsers: list[argparse.ArgumentParser]  # more than one for ``recover status|plan|apply``
    rest: list[str]
    leaf: bool  # names a command that takes no further command


def resolve(command: Command) -> Resolved:
    parser, path, words = _parser(), (), list(command.words)
    while words:
        choices = _subcommands(parser)
        if not choices:
            break
        word = words[0]
        if word in choices:
            parser, path, words = choices[word], (*path, word), words[1:]
            continue
        alternatives = word.split("|")
        if len(alternatives) > 1 and all(a in choices for a in alternatives):
            return Resolved((*path, word), [choices[a] for a in alternatives], words[1:], leaf=False)
        if word.startswith("-") or PLACEHOLDER.fullmatch(word):
            break  # an option of this level (--help), or a placeholder for the command (STEP, ...)
        raise AssertionError(f"{command.where()}: `filesink {' '.join(path)}` has no command {word!r}")
    return Resolved(path, [parser], words, leaf=not _subcommands(parser))


def _is_synopsis(command: Command) -> bool:
    return any(w.startswith("[") or w.endswith("...") or w == "|" or w == "..." for w in command.words)


def _has_placeholder_values(words: list[str]) -> bool:
    return any(not w.startswith("-") and PLACEHOLDER.fullmatch(w) for w in words)


# -- the tests ----------------------------------------------------------------------------------------------


def _all(kind) -> list[Command]:
    return [c for doc in DOCS for c in kind(doc)]


def _check_options(command: Command) -> int:
    resolved = resolve(command)
    name = "filesink " + " ".join(resolved.path)
    used = _options_in(resolved.rest)
    for option in used:
        for parser in resolved.parsers:
            assert option in _options(parser), (
                f"{command.where()}: `{name}` has no option {option} (exact names only: {sorted(_options(parser))})"
            )
    return len(used)


def test_fenced_commands_use_real_options():
    commands = _all(fenced_commands)
    assert len(commands) >= 12, [c.where() for c in commands]
    checked = sum(_check_options(c) for c in commands)
    assert checked >= 60


def test_inline_commands_use_real_options():
    commands = _all(inline_commands)
    assert len(commands) >= 40, [c.where() for c in commands]
    checked = sum(_check_options(c) for c in commands)
    assert checked >= 40


def _missing_required(resolved: Resolved, words: list[str]) -> list[str]:
    given = set(_options_in(words))
    missing = []
    for parser in resolved.parsers:
        for action in parser._actions:
            if action.required and action.option_strings and not given & set(action.option_strings):
                missing.append("/".join(action.option_strings))
    if resolved.path[:1] == ("recover",) and not given & {"--state-dir", "--log-store"}:
        missing.append("--state-dir or --log-store")  # recover() asks for one of the two
    return missing


def test_full_commands_give_required_options_and_parse():
    full = [c for c in _all(fenced_commands) if not _is_synopsis(c)]
    assert len(full) >= 3, [c.where() for c in full]
    parsed = 0
    for command in full:
        resolved = resolve(command)
        assert resolved.leaf, f"{command.where()}: names no complete command"
        missing = _missing_required(resolved, command.words)
        assert not missing, f"{command.where()}: a full command without {', '.join(missing)}"
        if _has_placeholder_values(resolved.rest):
            continue  # `--parallelism N`: parsing would fail on the placeholder, not on the doc
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            try:
                build_parser().parse_args(command.words)
            except SystemExit as e:
                raise AssertionError(f"{command.where()}: does not parse: {stderr.getvalue().strip()}") from e
        parsed += 1
    assert parsed >= 3


def test_synopses_name_every_required_option():
    synopses = [c for c in _all(fenced_commands) if _is_synopsis(c)]
    assert len(synopses) >= 8
    for command in synopses:
        resolved = resolve(command)
        if not resolved.leaf:
            continue
        missing = [m for m in _missing_required(resolved, command.words) if "--state-dir or" not in m]
        assert not missing, f"{command.where()}: the synopsis leaves out required {', '.join(missing)}"


# -- exit codes of `filesink run` ------------------------------------------------------------------------------

EXIT_MENTION = re.compile(r"\bexit(?:s|ing)?(?: with)?(?: (?:code|status)(?:es|s)?)?\s*\(?`?(\d+)`?", re.I)


def _sentences(text: str):
    """(line, sentence) of the prose: paragraphs and table rows split at sentence ends."""
    prose = _prose(text)
    for m in re.finditer(r"(?:[^\n]|\n(?![ \t]*\n|\|))+", prose):
        start = prose[: m.start()].count("\n") + 1
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", m.group(0)):
            yield start, " ".join(sentence.split())


def test_run_exit_codes_in_the_reference():
    """docs/cli.md's list of exit codes, as it applies to `run`, and the `filesink run` section's own list."""
    text = (ROOT / "docs" / "cli.md").read_text()
    listing = re.search(r"^Exit codes: (.*?)\n\n", text, re.M | re.S)
    assert listing, "docs/cli.md has no 'Exit codes:' paragraph"
    items = re.split(r"(?=`\d+` )", " ".join(listing.group(1).split()))
    for_run = set()
    for item in items:
        m = re.match(r"`(\d+)` ([^(]*)(?:\((.*)\))?", item)
        if not m:
            continue
        applies = re.findall(r"`([a-z][a-z -]*)`", m.group(3) or "")
        if not applies or any(a.split()[0] == "run" for a in applies):
            for_run.add(int(m.group(1)))
    assert for_run == RUN_EXIT_CODES, f"docs/cli.md 'Exit codes:' gives `run` {sorted(for_run)}"

    section = re.search(r"^## `filesink run`\n(.*?)(?=^## )", text, re.M | re.S)
    assert section, "docs/cli.md has no `filesink run` section"
    own = re.search(r"^Exit codes of `run`: (.*?)\n\n", section.group(1), re.M | re.S)
    assert own, "the `filesink run` section of docs/cli.md lists no 'Exit codes of `run`:'"
    listed = {int(c) for c in re.findall(r"`(\d+)`", own.group(1))}
    assert listed == RUN_EXIT_CODES, f"docs/cli.md's `filesink run` section lists exit codes {sorted(listed)}"
    for code in (int(c) for c in EXIT_MENTION.findall(section.group(1))):
        assert code in RUN_EXIT_CODES, f"docs/cli.md's `filesink run` section says it exits {code}"


def test_every_exit_code_stated_for_run_is_one_it_has():
    checked = 0
    for doc in DOCS:
        for line, sentence in _sentences(doc.read_text()):
            if "filesink run" not in sentence:
                continue
            allowed = RUN_EXIT_CODES | ({errors.EXIT_NOT_A_SINK} if "recover" in sentence else set())
            for code in (int(c) for c in EXIT_MENTION.findall(sentence)):
                assert code in allowed, f"{doc.name}:{line}: says `filesink run` exits {code}: {sentence!r}"
                checked += 1
    assert checked >= 3


# -- the quickstart's landing directory and reading the output with Polars -----------------------------------


def _python_block(doc: str, marker: str) -> str:
    blocks = [body for info, _, body in _blocks((ROOT / "docs" / doc).read_text()) if info == "python"]
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"docs/{doc}: {len(found)} python blocks hold {marker!r}"
    return found[0]


def test_quickstart_landing_has_the_columns_its_command_names(tmp_path, monkeypatch):
    """The snippet that makes ./landing runs, and its files have the --key and --partition-by columns of the
    quickstart's `filesink run` command."""
    pq = pytest.importorskip("pyarrow.parquet")
    monkeypatch.chdir(tmp_path)
    exec(compile(_python_block("quickstart.md", 'Path("landing")'), "docs/quickstart.md (landing)", "exec"), {})
    files = sorted((tmp_path / "landing").iterdir())
    assert files and all(f.name.endswith(".parquet") and not f.name.startswith((".", "_")) for f in files), files
    [run] = [c for c in fenced_commands(ROOT / "docs" / "quickstart.md") if c.words[:1] == ["run"]]
    assert run.words[run.words.index("--input") + 1] in ("./landing", "landing"), run.where()
    named = [run.words[i + 1] for i, w in enumerate(run.words) if w in ("--key", "--partition-by")]
    assert named, f"{run.where()}: names no key or partition column"
    for f in files:
        columns = pq.read_schema(f).names
        assert set(named) <= set(columns), f"{run.where()}: {f.name} has only {columns}"


# -- reading the output with Polars ---------------------------------------------------------------------------


def _polars_example() -> tuple[str, str]:
    """The quickstart's Polars example, and the prose after it up to the next example or heading."""
    text = (ROOT / "docs" / "quickstart.md").read_text()
    m = re.search(r"^```python\n((?:(?!```).)*?^import polars as pl\n.*?)^```\n(.*?)(?=^```|^#|\Z)", text, re.M | re.S)
    assert m, "docs/quickstart.md has no python block that imports polars"
    return m.group(1), m.group(2)


def test_polars_example_reads_event_date_as_date(tmp_path, monkeypatch):
    pl = pytest.importorskip("polars")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    code, prose = _polars_example()
    assert "`Date`" in prose, "the text after the Polars example does not say that event_date comes back as `Date`"

    # What the sink writes: part files under event_date=... directories, and its claim and commit mark beside them.
    output = tmp_path / "events"
    for day, ids in (("2026-11-01", [1, 2]), ("2026-11-02", [3])):
        (output / f"event_date={day}").mkdir(parents=True)
        table = pa.table({"event_id": ids, "user_id": [i * 10 for i in ids], "amount": [1.5] * len(ids)})
        pq.write_table(table, output / f"event_date={day}" / f"part-x-{day}.parquet")
    (output / "_filesink.json").write_text('{"sink_id": "x"}')
    (output / "_filesink_mark.json").write_text("{}")
    (output / "_filesink_staging").mkdir()
    monkeypatch.chdir(tmp_path)

    namespace: dict[str, object] = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(code, "docs/quickstart.md (Polars example)", "exec"), namespace)
    frames = [v for v in namespace.values() if isinstance(v, pl.DataFrame | pl.LazyFrame)]
    assert frames, "the Polars example leaves no DataFrame or LazyFrame"
    for frame in frames:
        schema = frame.collect_schema() if isinstance(frame, pl.LazyFrame) else frame.schema
        if "event_date" in schema:
            assert schema["event_date"] == pl.Date, f"Polars reads event_date as {schema['event_date']}"
            break
    else:
        raise AssertionError("no frame of the Polars example has an event_date column")
    for day in ("2026-11-01", "2026-11-02"):
        assert day in out.getvalue(), f"the Polars example printed no {day}: {out.getvalue()!r}"
