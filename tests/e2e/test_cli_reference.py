"""docs/cli.md is the reference of the ``filesink`` command: every command and option that ``--help`` shows is
in the command's section, and every option in a section's usage block exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from filesink.cli.main import build_parser

DOCS = Path(__file__).parents[2] / "docs" / "cli.md"


def _commands(parser, prefix=()):
    for action in parser._actions:
        if hasattr(action, "choices") and isinstance(action.choices, dict):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from _commands(sub, (*prefix, name))


def _sections(text: str) -> dict[str, str]:
    """``filesink ...`` heading -> its text up to the next heading of the same or a higher level."""
    headings = [(m.start(), len(m.group(1)), m.group(2)) for m in re.finditer(r"^(#+) `(filesink[^`]*)`", text, re.M)]
    levels = [(m.start(), len(m.group(1))) for m in re.finditer(r"^(#+) ", text, re.M)]
    sections = {}
    for start, level, command in headings:
        end = next((s for s, lv in levels if s > start and lv <= level), len(text))
        sections[command] = text[start:end]
    return sections


def _options(parser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")}


def test_every_command_and_option_in_help_is_in_the_reference():
    sections = _sections(DOCS.read_text())
    for path, sub in _commands(build_parser()):
        command = "filesink " + " ".join(path)
        assert sub.description, f"{command} has no help text"
        assert command in sections, f"docs/cli.md has no section for `{command}`"
        ancestors = [" ".join(["filesink", *path[:n]]) for n in range(len(path), 0, -1)]
        text = "".join(sections.get(a, "") for a in ancestors)
        for action in sub._actions:
            for option in action.option_strings:
                if option in ("-h", "--help"):
                    continue
                assert action.help, f"{command} {option} has no help text"
                assert re.search(rf"`{re.escape(option)}\b", text), f"`{command} {option}` is not in docs/cli.md"


def test_usage_blocks_name_only_real_options():
    sections = _sections(DOCS.read_text())
    parsers = {"filesink " + " ".join(path): sub for path, sub in _commands(build_parser())}
    checked = 0
    for text in sections.values():
        for block in re.findall(r"```\n(.*?)```", text, re.S):
            words = block.split()
            command = next((" ".join(words[:n]) for n in (4, 3, 2) if " ".join(words[:n]) in parsers), None)
            assert command is not None, f"docs/cli.md: a usage block names no command: {block[:60]!r}"
            for option in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", block):
                assert option in _options(parsers[command]), f"docs/cli.md: {command} has no option {option}"
                checked += 1
    assert checked > 20


def test_help_of_every_command_runs():
    for path, _sub in _commands(build_parser()):
        proc = subprocess.run(
            [sys.executable, "-m", "filesink", *path, "--help"], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        assert f"usage: filesink {' '.join(path)}" in proc.stdout
