"""Named failpoints for crash and fault tests.

A failpoint is a named place in the protocol where a test can make the process fail. They are configured by the
environment variable ``FILESINK_FAILPOINTS``, a comma-separated list of ``name=action`` where action is one of

- ``raise``: raise :class:`FailpointError`;
- ``kill``: SIGKILL the current process (nothing after that point runs, not even ``finally`` blocks);
- ``hang``: sleep until the process is killed;
- ``stop``: SIGSTOP the current process; it carries on from there when sent SIGCONT (a paused "zombie").

``name=action@N`` fires only on the N-th time (1-based) the failpoint is reached in this process.
``name#text=action`` fires only where the place's detail (for example the file being written) contains
``text``; ``@N`` then counts those places only. With the variable unset, :func:`failpoint` costs one
dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import time

ENV_VAR = "FILESINK_FAILPOINTS"
ACTIONS = ("raise", "kill", "hang", "stop")

_hits: dict[str, int] = {}


class FailpointError(RuntimeError):
    """Raised by a failpoint configured with the ``raise`` action."""


def _parse(spec: str) -> dict[str, tuple[str, str, int | None]]:
    result: dict[str, tuple[str, str, int | None]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, action = item.partition("=")
        nth: int | None = None
        if "@" in action:
            action, _, count = action.partition("@")
            nth = int(count)
        if not sep or action not in ACTIONS:
            raise ValueError(
                f"{ENV_VAR}: bad entry {item!r}; expected name=action with action one of {', '.join(ACTIONS)}"
            )
        name, _, text = name.strip().partition("#")
        result[name] = (action, text, nth)
    return result


def failpoint(name: str, detail: str = "") -> None:
    """Fail here if the environment asks for it (see the module docstring); ``detail`` says where exactly."""
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return
    config = _parse(spec).get(name)
    if config is None:
        return
    action, text, nth = config
    if text not in detail:
        return
    key = f"{name}#{text}" if text else name
    _hits[key] = _hits.get(key, 0) + 1
    if nth is not None and _hits[key] != nth:
        return
    if action == "raise":
        raise FailpointError(f"failpoint {name} fired" + (f" at {detail}" if detail else ""))
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    while True:  # hang
        time.sleep(3600)
