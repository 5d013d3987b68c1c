"""The simulation's harness (``dsim``) lives next to its tests; test modules are imported by path."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
