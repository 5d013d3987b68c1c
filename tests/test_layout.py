"""The packages' layout holds (docs/layout.md): which way imports go between packages, no import circle, who owns
which store, and the tests' folders mirror the packages.

Read from the source with ``ast``, imports inside functions included, so that a hidden import cannot break a rule.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = ("logstore", "filesink", "recovery")

PACKAGE_ORDER: tuple[tuple[str, ...], ...] = (
    ("logstore",),
    ("filesink.base",),
    ("filesink.output",),
    ("filesink.schema",),
    ("filesink.tasks",),
    ("filesink.committer",),
    ("filesink.rolling",),
    ("filesink.destination", "filesink.metrics"),
    ("recovery",),
    ("filesink.sink",),
    ("filesink.demo", "recovery.command"),
    ("filesink.cli",),
    ("filesink.face",),
)
"""The packages from the bottom up (docs/layout.md draws them): a module imports modules of its own package or of a
package further down, never one further up or one beside it. ``filesink.base`` is the modules loose at the top of
``filesink/`` that every package may use; ``recovery.command`` is ``filesink recover``'s parser, steps and text;
``filesink.face`` is the package's public face (``from filesink import ...``) and ``python -m filesink``."""
LOOSE = (
    "filesink.errors",
    "filesink.arrowvalues",
    "filesink.s3options",
    "filesink.argparsing",
    "filesink.lock",
    "filesink.localdirs",
    "filesink.words",
    "filesink.mavenjars",
)
"""The modules loose at the top of ``filesink/``, besides its ``__init__`` and ``__main__``: at most a dozen."""
ROLES = ("filesink.sink.start", "filesink.sink.batch", "filesink.sink.append", "filesink.sink.roll")
"""The sink's roles: the face (``filesink.sink.face``) inherits their steps, each over the state of
``filesink.sink.core``."""
SINK_FACE = "filesink.sink.face"
SINK_CORE = "filesink.sink.core"
SINK_CONNECT = "filesink.sink.connect"
RECOVERY_ENTRY = "recovery.startup"
"""The one entry point the sink's start goes through into recovery."""
RECOVER_COMMAND = ("recovery.cli", "recovery.__main__", "recovery.commands", "recovery.move", "recovery.render_text")
"""``filesink recover``'s parser, its steps and their text, on the commands' layer; what they share with other
clients of recovery (opening a sink, the owner lease, the JSON shapes) stays on recovery's."""
RENDERERS = ("recovery.render_text", "recovery.render_json")
"""What ``recover`` prints: made from what the steps computed, opening nothing."""
LOG_STORE = "logstore.store"
"""``LogStore``, the class users and the sink construct: its opening, its claims, the writer term."""
LOG_STORE_CORE = "logstore.storecore"
LOG_STORE_ROOMS = (
    "logstore.seal",
    "logstore.reads",
    "logstore.damaged",
    "logstore.truncation",
    "logstore.garbage",
    "logstore.rebuild",
    "logstore.backlog",
)
"""The log store's rooms: ``LogStore`` inherits their steps, each over the state of ``logstore.storecore``."""
LOG_TABLE_OWNERS = {"logstore.statedb", LOG_STORE, LOG_STORE_CORE, *LOG_STORE_ROOMS}
"""Who names the ``log_*`` tables: the database's migrations and ``LogStore`` (its core and its rooms)."""
DEMO = "filesink.demo"
OUTPUT = "filesink.output"
OPENERS = ("logstore.store", "logstore.statedb", "logstore.storage", "logstore.home", "filesink.lock", OUTPUT)
"""The modules that open a store, take its lock or read its records (the stores' owners)."""
STORAGE_CLIENTS = ("s3fs", "fsspec", "botocore", "aiobotocore")
LOG_TABLES = re.compile(
    r"\b(?:FROM|JOIN|INTO|UPDATE|TABLE)\s+(log_(?:store|epochs|segments|segment_vnodes|vnodes|given_up))\b",
    re.IGNORECASE,
)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(module: str) -> set[str]:
    """Every module ``module`` imports, anywhere in its source (relative imports resolved)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            submodules = {f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES}
            found |= submodules
            if len(submodules) < len(node.names):  # ``from package import module`` alone imports the module
                found.add(base)
    return found


def _package(module: str) -> str:
    """The package of :data:`PACKAGE_ORDER` that ``module`` belongs to."""
    if module.startswith("logstore"):
        return "logstore"
    if module in RECOVER_COMMAND:
        return "recovery.command"
    if module.startswith("recovery"):
        return "recovery"
    if module in ("filesink", "filesink.__main__"):
        return "filesink.face"
    if module in LOOSE:
        return "filesink.base"
    return ".".join(module.split(".")[:2])


def _rank(package: str) -> int:
    return next(i for i, level in enumerate(PACKAGE_ORDER) if package in level)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_modules_are_found():
    assert {"logstore.store", "filesink.committer.ledger", "filesink.output.fencing", "recovery.resolve"} <= set(
        MODULES
    )


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_is_in_a_package_of_the_order(module):
    """A new folder of ``filesink/`` (or a new loose module) takes its place in :data:`PACKAGE_ORDER` first."""
    assert any(_package(module) in level for level in PACKAGE_ORDER), f"{module}: {_package(module)} has no place"


def test_at_most_a_dozen_modules_are_loose_at_the_top_of_filesink():
    loose = sorted(p.stem for p in (ROOT / "filesink").glob("*.py"))
    assert len(loose) <= 12, loose
    assert sorted(f"filesink.{m}" for m in loose if m not in ("__init__", "__main__")) == sorted(LOOSE)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_packages(module):
    """logstore <- filesink's base <- output <- schema <- tasks <- committer <- rolling <- destination, metrics <-
    recovery <- the sink <- the demo, recover's command <- the command line <- the package's face."""
    mine = _rank(_package(module))
    ours = {m for m in _imports(module) if m in MODULES and _package(m) != _package(module)}
    wrong = sorted(f"{m} ({_package(m)})" for m in ours if _rank(_package(m)) >= mine)
    assert wrong == [], f"{module} ({_package(module)}) imports {wrong}: from a package above it or beside it"


def test_no_import_circle_anywhere_in_the_product():
    """No chain of imports leads from a module back to itself (imports inside functions included; a package's
    ``__init__`` counts as the modules it imports)."""
    graph = {m: {i for i in _imports(m) if i in MODULES and i != m} for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(m: str) -> None:  # Tarjan's strongly connected components
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in sorted(graph[m]):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    assert circles == []


def test_the_tests_mirror_the_packages():
    """Each folder of ``tests/filesink/`` is named after a package of ``filesink/``, and holds tests only."""
    folders = sorted(p.name for p in (ROOT / "tests" / "filesink").iterdir() if p.is_dir() and p.name[0] != "_")
    assert folders, "tests/filesink holds no folders"
    for folder in folders:
        assert (ROOT / "filesink" / folder / "__init__.py").exists(), f"tests/filesink/{folder}: no filesink.{folder}"
    assert not list((ROOT / "tests" / "filesink").glob("test_*.py")), "tests/filesink/ holds tests of no package"


def test_the_commit_path_does_not_import_recovery():
    """Only the sink's start-up runs recovery: every module the per-epoch path uses stays below it."""
    for module in (
        "filesink.rolling.planner",
        "filesink.committer.ledger",
        "filesink.tasks.writer",
        "filesink.rolling.backlog",
        OUTPUT,
    ):
        assert not any(_within(m, "recovery") for m in _imports(module)), module
    roll = ast.parse(MODULES["filesink.sink.roll"].read_text())
    rolls = [n for n in ast.walk(roll) if isinstance(n, ast.FunctionDef) and n.name in ("_roll", "_roll_steps")]
    assert len(rolls) == 2
    called = {n.func.id for r in rolls for n in ast.walk(r) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert not called & {"apply_recovery", "plan_recovery", "recover_at_start"}


def test_the_sink_reaches_recovery_through_its_start_and_one_entry_point():
    """Of the sink's modules, its start runs recovery, and only through :data:`RECOVERY_ENTRY`; the face, the core,
    the other roles and the open sinks of a process (Spark Connect) do not import recovery."""
    sinks = sorted(m for m in MODULES if _within(m, "filesink.sink"))
    importing = {m: sorted(i for i in _imports(m) if _within(i, "recovery")) for m in sinks}
    assert {m: i for m, i in importing.items() if i} == {"filesink.sink.start": [RECOVERY_ENTRY]}
    start = ast.parse(MODULES["filesink.sink.start"].read_text())
    taken = {
        a.name for n in ast.walk(start) if isinstance(n, ast.ImportFrom) and n.module == RECOVERY_ENTRY for a in n.names
    }
    assert taken == {"RecoveryPlan", "recover_at_start"}


def test_the_face_imports_the_roles_and_each_role_the_core_only():
    """The face inherits every role; a role reads the sink's state through ``filesink.sink.core``, never through the
    face or another role; ``filesink.sink.connect`` knows the sink only as what the face hands it."""
    assert set(ROLES) | {SINK_CONNECT, SINK_CORE} <= _imports(SINK_FACE)
    sinks = {SINK_FACE, *ROLES, SINK_CONNECT}
    for module in ROLES:
        assert SINK_CORE in _imports(module), module
        assert not sinks & (_imports(module) - {module}), module
    assert not (sinks | {SINK_CORE}) & _imports(SINK_CONNECT)
    assert not sinks & _imports(SINK_CORE)


def test_the_two_command_lines_do_not_import_each_other_both_ways():
    assert "recovery.cli" in _imports("filesink.cli.main")
    for module in (m for m in MODULES if _within(m, "recovery")):
        assert not any(_within(m, "filesink.cli.main") for m in _imports(module)), module


@pytest.mark.parametrize("module", RENDERERS)
def test_what_recover_prints_opens_nothing(module):
    """``recover``'s text and JSON are made from what its steps read: the renderers import no module that opens a
    store, takes its lock or reads it, no step, and of the ledger and the log store only their records' types."""
    assert module in MODULES
    ours = _imports(module)
    opened = sorted(m for m in ours if any(_within(m, o) for o in OPENERS) or m == "sqlite3")
    assert opened == [], f"{module} imports {opened}; the steps read the stores"
    steps = {"recovery.opening", "recovery.lease", "recovery.commands", "recovery.move", "recovery.cli"}
    assert not steps & ours, f"{module} imports {sorted(steps & ours)}"
    records = {"PlannedFile", "SchemaVersion", "DamagedSegment", "GivenUp"}
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            assert not {a.name for a in node.names} & {"logstore", "filesink.committer.ledger"}, module
        elif isinstance(node, ast.ImportFrom) and node.module in ("logstore", "filesink.committer.ledger"):
            taken = {a.name for a in node.names}
            assert taken <= records, f"{module} takes {sorted(taken - records)} from {node.module}"


def test_a_sink_description_is_imported_one_way():
    """The sink imports its description, never the reverse."""
    assert "filesink.sink.description" in _imports(SINK_FACE)
    assert not {SINK_FACE, SINK_CORE, *ROLES} & _imports("filesink.sink.description")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_the_owners_use_a_storage_client(module):
    """The output's S3 client belongs to filesink.output, the log store's to logstore.storage; the demo (an extra)
    has its own S3 server and its clients."""
    clients = sorted(m for m in _imports(module) if m.split(".")[0] in STORAGE_CLIENTS)
    if _within(module, OUTPUT) or module == "logstore.storage" or _within(module, DEMO):
        return
    assert clients == [], f"{module} imports {clients}; go through filesink.output or logstore.storage"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m not in LOG_TABLE_OWNERS))
def test_the_log_tables_are_read_through_the_log_store_only(module):
    found = sorted(set(LOG_TABLES.findall(MODULES[module].read_text())))
    assert found == [], f"{module} names the log store's tables {found}; use a LogStore method"


def test_the_log_store_is_its_face_over_rooms_over_a_core():
    """``LogStore`` (``logstore.store``) inherits every room; a room reads the store's state through
    ``logstore.storecore``, never through the face or another room (garbage collection builds on truncation: it
    publishes the truncate points before a sweep); the core imports no room."""
    assert {*LOG_STORE_ROOMS, LOG_STORE_CORE} <= _imports(LOG_STORE)
    store = {LOG_STORE, *LOG_STORE_ROOMS}
    allowed = {"logstore.garbage": {"logstore.truncation"}}
    for module in LOG_STORE_ROOMS:
        assert {LOG_STORE_CORE, *allowed.get(module, ())} & _imports(module), module
        assert store & (_imports(module) - {module}) == allowed.get(module, set()), module
    assert not store & _imports(LOG_STORE_CORE)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_sqlite_is_used_by_its_owners_only(module):
    """The connection and its errors belong to logstore (statedb, store); the ledger uses them for its tables."""
    if module in {"logstore.statedb", "logstore.store"}:
        return
    assert "sqlite3" not in _imports(module), f"{module} imports sqlite3; SQLite errors are translated by the owners"
