"""The words every command prints with: a count and its noun, a size in bytes.

Shared by ``filesink run``'s progress, ``filesink recover`` and the demo, so that neither command line imports the
other's modules.
"""

from __future__ import annotations

__all__ = ["plural", "size"]


def size(n: float) -> str:
    """``n`` bytes in binary units: ``812 B``, ``3.4 KiB``, ``128.0 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def plural(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless ``n`` is 1 (batches, epochs, files)."""
    if n == 1:
        return f"{n:,} {noun}"
    return f"{n:,} {noun}es" if noun.endswith(("tch", "sh", "ss", "x")) else f"{n:,} {noun}s"
