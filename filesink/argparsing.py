"""The command line's parser: an option must be spelled out (no abbreviations), and a mistyped one is named,
with the closest real option, before argparse complains about anything else (a missing required option, say).

``filesink --ouput x`` would otherwise say "the following arguments are required: --output", and
``--partition`` would silently run as ``--partition-by``.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from typing import Any

_NUMBER = re.compile(r"-\d+(\.\d*)?$|-\.\d+$")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` without abbreviations that names an unknown option first; its sub-command parsers
    are of this class too (argparse makes them of the parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        given = list(sys.argv[1:] if args is None else args)
        unknown = self.unknown_option(given)
        if unknown is not None:
            self.error(unknown)
        return super().parse_known_args(given, namespace)

    def unknown_option(self, args: Sequence[str]) -> str | None:
        """The message for the first option in ``args`` that this parser does not have (before the sub-command
        that takes the rest), or None."""
        commands = {name for action in self._subparsers_actions() for name in action.choices}
        for arg in args:
            if arg == "--":
                return None
            if arg in commands:
                return None  # the rest is the sub-command's, which checks it itself
            if not arg.startswith("-") or arg == "-" or _NUMBER.match(arg):
                continue
            name = arg.split("=", 1)[0]
            if name in self._option_string_actions:
                continue
            options = sorted(o for o in self._option_string_actions if o.startswith("--"))
            bare = {o.lstrip("-"): o for o in options}  # the dashes every option has would make all look close
            close = [bare[c] for c in difflib.get_close_matches(name.lstrip("-"), list(bare), n=1, cutoff=0.7)]
            started = [o for o in options if o.startswith(name)] if name.startswith("--") else []
            hint = close[0] if close else started[0] if len(started) == 1 else None
            suggestion = f"; did you mean {hint}?" if hint else f"; see `{self.prog} --help` for the options"
            return f"unrecognized option {name}{suggestion}"
        return None

    def _subparsers_actions(self) -> list[Any]:
        return [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]


def catalog_property(text: str) -> tuple[str, str]:
    """``--catalog KEY=VALUE``: one of pyiceberg's catalog properties (``uri=postgresql+psycopg2://...``,
    ``type=rest``, ``warehouse=s3://...``, ``name=prod``)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        problem = "no '='" if not sep else "no key before '='"  # not the text itself: a value may be a secret
        raise argparse.ArgumentTypeError(
            f"a catalog property is KEY=VALUE, e.g. uri=postgresql+psycopg2://user@host/db; this one has {problem}"
        )
    return key.strip(), value
