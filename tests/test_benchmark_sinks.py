"""The benchmarks that drive the sink without Spark (``tests/benchmarks/bench_home.py``, ``bench_sinks_direct.py``)
subclass :class:`ExactlyOnceParquetSink` and replace some of its steps. The tests do not run those benchmarks, so a
step whose parameters change would break them unnoticed: the sink would call the replacement with arguments it does
not take. Read from the source with ``ast``: the benchmarks' modules are not imported.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from filesink import ExactlyOnceParquetSink

BENCHMARKS = Path(__file__).parent / "benchmarks"


def overrides() -> list[tuple[str, str, list[str]]]:
    """(file, class.method, parameter names) of every method a benchmark's sink class defines that the sink has."""
    found = []
    for path in sorted(BENCHMARKS.glob("bench_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef) or not node.bases:
                continue
            bases = {ast.unparse(b) for b in node.bases}
            if not bases & {"ExactlyOnceParquetSink", "DirectSink"}:
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and hasattr(ExactlyOnceParquetSink, item.name):
                    args = item.args
                    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                    found.append((path.name, f"{node.name}.{item.name}", names))
    return found


def test_the_benchmarks_replace_steps_of_the_sink():
    assert {(f, m.split(".")[1]) for f, m, _ in overrides()} >= {
        ("bench_home.py", "_append"),
        ("bench_sinks_direct.py", "_append"),
    }


@pytest.mark.parametrize(("file", "method", "names"), [pytest.param(*o, id=f"{o[0]}:{o[1]}") for o in overrides()])
def test_a_replaced_step_takes_the_sinks_parameters(file, method, names):
    real = getattr(ExactlyOnceParquetSink, method.split(".")[1])
    expected = list(inspect.signature(real).parameters)
    assert names == expected, (
        f"{file}: {method} takes {names}, the sink's step takes {expected}: update the benchmark's replacement"
    )
