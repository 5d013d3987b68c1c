"""The packages' layout holds (docs/layout.md): which way imports go, and who owns which store.

Read from the source with ``ast``, imports inside functions included, so that a hidden import cannot break a rule.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = ("logstore", "filesink", "recovery")

TOP = {
    "filesink",
    "filesink.sink",
    "filesink.sink.core",
    "filesink.sink.start",
    "filesink.sink.batch",
    "filesink.sink.append",
    "filesink.sink.roll",
    "filesink.sink.connect",
    "filesink.sink.description",
    "filesink.cli.run",
    "filesink.cli.runconfig",
    "filesink.cli.runquery",
    "filesink.cli.connect_run",
    "filesink.cli.main",
    "filesink.cli.progress",
    "filesink.cli.jsonlog",
    "filesink.cli.preflight",
    "filesink.cli.inputschema",
    "filesink.cli.kafka_source",
    "filesink.__main__",
}
"""The layer above recovery: the sink object, its face and its roles (its start runs recovery; the package's
``__init__`` is its public face), where a sink opens (its description, under Spark Connect), the commands and what
only they use."""
ROLES = ("filesink.sink.start", "filesink.sink.batch", "filesink.sink.append", "filesink.sink.roll")
"""The sink's roles: the face (``filesink.sink``) inherits their steps, each over the state of ``filesink.sinkcore``."""
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
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES}
    return found


def _layer(module: str) -> int:
    if module.startswith("logstore"):
        return 0
    if module in TOP or module.startswith(DEMO) or module in RECOVER_COMMAND:
        return 3
    if module.startswith("recovery"):
        return 2
    return 1  # the file sink's core: ledger, planner, writer, output, ...


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_modules_are_found():
    assert {"logstore.store", "filesink.committer.ledger", "filesink.output.fencing", "recovery.resolve"} <= set(
        MODULES
    )


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module):
    """logstore <- filesink core <- recovery <- the sink object and the commands."""
    ours = {m for m in _imports(module) if m.split(".")[0] in PACKAGES and m in MODULES}
    upward = sorted(m for m in ours if _layer(m) > _layer(module))
    assert upward == [], f"{module} (layer {_layer(module)}) imports {upward} from a layer above"


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
    assert not called & {"apply_recovery", "plan_recovery"}


def test_only_the_sinks_start_imports_recovery():
    """Of the sink's modules, its start runs recovery; the face, the core, the other roles and the open sinks of a
    process (Spark Connect) do not import it."""
    sinks = ("filesink.sink", "filesink.sink.core", *ROLES, "filesink.sink.connect")
    importing = sorted(m for m in sinks if any(_within(i, "recovery") for i in _imports(m)))
    assert importing == ["filesink.sink.start"]


def test_the_face_imports_the_roles_and_each_role_the_core_only():
    """The face inherits every role; a role reads the sink's state through ``filesink.sinkcore``, never through the
    face or another role; ``filesink.connect`` knows the sink only as what the face hands it."""
    assert set(ROLES) | {"filesink.sink.connect", "filesink.sink.core"} <= _imports("filesink.sink")
    sinks = {"filesink.sink", *ROLES, "filesink.sink.connect"}
    for module in ROLES:
        assert "filesink.sink.core" in _imports(module), module
        assert not sinks & (_imports(module) - {module}), module
    assert not (sinks | {"filesink.sink.core"}) & _imports("filesink.sink.connect")
    assert not sinks & _imports("filesink.sink.core")


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


MODULES_ONLY = sorted(m for m, path in MODULES.items() if path.name != "__init__.py")
"""The modules, without the packages' ``__init__`` (a package's public face imports its modules)."""


@pytest.mark.parametrize("module", MODULES_ONLY)
def test_no_two_modules_import_each_other(module):
    """Imports between two modules go one way."""
    back = sorted(m for m in _imports(module) if m in MODULES_ONLY and m != module and module in _imports(m))
    assert back == [], f"{module} and {back} import each other"


def test_a_sink_description_and_the_connect_run_import_one_way():
    """The sink imports its description, never the reverse; ``filesink run`` hands a run through Spark Connect to
    ``filesink.connect_run``, which shares the run's pieces through ``runconfig`` and ``runquery``, not ``run``."""
    assert "filesink.sink.description" in _imports("filesink.sink")
    assert not any(_within(m, "filesink.sink") for m in _imports("filesink.sink.description"))
    assert "filesink.cli.connect_run" in _imports("filesink.cli.run")
    assert not any(_within(m, "filesink.cli.run") for m in _imports("filesink.cli.connect_run"))


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
