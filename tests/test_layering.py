"""The dependency direction of DESIGN section 9, checked on the imports themselves.

Between the top-level packages: `schemas` <- `streams` <- `processors`, `connectors`;
processors and connectors never import each other; only the command line (`torpor.cli`)
composes them. The Faust adapter (`torpor.faust`) sits beside the connectors, on
`schemas`, `streams` and `connectors`; nothing of Torpor imports it, and only it imports
`faust` and `aiokafka` (an optional extra: the rest of Torpor works without it).

Inside `torpor.processors`, four rooms (its package docstring): `fold` (pure: nothing of
the store, the models, `streams` or any I/O), `store` (the fold's types, nothing of Kafka
or models), `models` (the model stage: the fold's types and the store it reads), and the
runtimes at the top of the package, the only modules that compose the others.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Final

PACKAGE: Final = Path(__file__).resolve().parent.parent / "torpor"

# layer -> the torpor layers it may import (itself always allowed).
ALLOWED: Final[dict[str, frozenset[str]]] = {
    "schemas": frozenset(),
    "streams": frozenset({"schemas"}),
    "processors": frozenset({"schemas", "streams"}),
    "connectors": frozenset({"schemas", "streams"}),
    # The inspector (`torpor ui`) reads the topics and produces signed inputs; the command
    # line hands it what to produce with.
    "inspector": frozenset({"schemas", "streams"}),
    "cli": frozenset({"schemas", "streams", "processors", "connectors", "inspector"}),
    "faust": frozenset({"schemas", "streams", "connectors"}),
}

# Third-party packages of an optional extra, and the one layer that may import them.
EXTRA_ONLY: Final[dict[str, str]] = {"faust": "faust", "aiokafka": "faust", "mode": "faust"}

RUNTIMES: Final = "runtimes"  # the modules at the top of torpor/processors
# room -> the rooms of torpor.processors and the top-level layers it may import.
ROOMS: Final[dict[str, frozenset[str]]] = {
    "fold": frozenset({"schemas"}),
    "store": frozenset({"schemas", "fold"}),
    "models": frozenset({"schemas", "streams", "fold", "store"}),
    RUNTIMES: frozenset({"schemas", "streams", "fold", "store", "models"}),
}

# What the pure fold may not import: I/O, clocks, threads, and the clients of the outside world.
FOLD_FORBIDDEN: Final = frozenset({
    "asyncio", "io", "logging", "os", "pathlib", "random", "secrets", "shutil", "socket", "subprocess",
    "threading", "time", "urllib", "uuid",
    "anthropic", "boto3", "confluent_kafka", "fastavro", "httpx", "mcp", "openai", "rocksdict",
    "faust", "aiokafka", "opentelemetry",
})

# OpenTelemetry (the optional extra `otel`) is imported only by these modules, and they only
# when tracing is on: the rest of Torpor runs without it (docs/traces.md).
TRACING_MODULES: Final = frozenset({
    "streams/tracing.py", "processors/tracing.py", "connectors/tracing.py", "cli/traces.py", "cli/send.py",
})


def _imports(path: Path, root: Path = PACKAGE.parent) -> set[str]:
    """Every dotted module `path` (under `root`) imports, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = path.relative_to(root).with_suffix("").parts
                base = parts[: len(parts) - node.level]
                module = ".".join((*base, node.module)) if node.module else ".".join(base)
                found.add(module)
            elif node.module:
                found.add(node.module)
                # `from torpor.processors import step` imports the module torpor.processors.step.
                found.update(f"{node.module}.{alias.name}" for alias in node.names
                             if _is_module(root, f"{node.module}.{alias.name}"))
    return found


def _is_module(root: Path, dotted: str) -> bool:
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _torpor_imports(path: Path, root: Path = PACKAGE.parent) -> set[str]:
    return {m for m in _imports(path, root) if m == "torpor" or m.startswith("torpor.")}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _room(module: str) -> str | None:
    """The room of a `torpor.processors` module, a top-level layer's name, or None."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    if parts[1] != "processors":
        return parts[1]
    if len(parts) == 2:
        return None  # the package itself
    return parts[2] if parts[2] in ROOMS else RUNTIMES


def test_every_import_points_down_the_layers() -> None:
    wrong: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        layer = rel.parts[0] if len(rel.parts) > 1 else None
        if layer is None or layer not in ALLOWED:
            continue
        for module in _torpor_imports(path):
            target = _layer(module)
            if target is None or target == layer or target not in ALLOWED:
                continue
            if target not in ALLOWED[layer]:
                wrong.append(f"torpor/{rel} imports {module} ({layer} may not import {target})")
    assert not wrong, "imports against the layering of DESIGN section 9:\n" + "\n".join(wrong)


def _extra_problems(root: Path) -> list[str]:
    wrong: list[str] = []
    for path in sorted((root / "torpor").rglob("*.py")):
        rel = path.relative_to(root / "torpor")
        layer = rel.parts[0] if len(rel.parts) > 1 else None
        for imported in _imports(path, root):
            owner = EXTRA_ONLY.get(imported.split(".")[0])
            if owner is not None and layer != owner:
                wrong.append(f"torpor/{rel} imports {imported} (only torpor/{owner} may: an optional extra)")
    return wrong


def test_only_the_adapter_imports_its_optional_extra() -> None:
    wrong = _extra_problems(PACKAGE.parent)
    assert not wrong, "imports of an optional extra outside its adapter:\n" + "\n".join(wrong)


def test_the_checker_sees_an_extra_imported_outside_its_adapter(tmp_path: Path) -> None:
    for layer in ("connectors", "faust"):
        (tmp_path / "torpor" / layer).mkdir(parents=True)
        (tmp_path / "torpor" / layer / "planted.py").write_text("import faust\nfrom aiokafka import errors\n")
    assert sorted(_extra_problems(tmp_path)) == [
        "torpor/connectors/planted.py imports aiokafka (only torpor/faust may: an optional extra)",
        "torpor/connectors/planted.py imports faust (only torpor/faust may: an optional extra)",
    ]
    planted = tmp_path / "torpor" / "connectors" / "wrong_way.py"
    planted.write_text("from torpor.faust.app import App\n")
    assert {_layer(m) for m in _torpor_imports(planted, root=tmp_path)} - ALLOWED["connectors"] == {"faust"}


def _room_problems(root: Path) -> list[str]:
    wrong: list[str] = []
    base = root / "torpor" / "processors"
    for path in sorted(base.rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        room = _room(module)
        if room is None:
            continue
        for imported in _imports(path, root):
            if room == "fold" and imported.split(".")[0] in FOLD_FORBIDDEN:
                wrong.append(f"{module} imports {imported}: the fold does no I/O")
            target = _room(imported) if imported.startswith("torpor.") else None
            if target is None or target == room or target not in ROOMS.keys() | ALLOWED.keys():
                continue
            if target not in ROOMS[room]:
                wrong.append(f"{module} imports {imported} ({room} may not import {target})")
    return wrong


def test_the_rooms_of_processors_import_only_what_they_may() -> None:
    wrong = _room_problems(PACKAGE.parent)
    assert not wrong, "imports against the rooms of torpor.processors:\n" + "\n".join(wrong)


def test_the_checker_sees_a_wrong_edge(tmp_path: Path) -> None:
    # Guard against a checker that can never fail: planted wrong imports are found.
    planted = tmp_path / "torpor" / "connectors" / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from torpor.processors.fold import state\nfrom ..processors.store import kv\n")
    imports = _torpor_imports(planted, root=tmp_path)
    assert imports == {"torpor.processors.fold", "torpor.processors.store"}
    assert {_layer(m) for m in imports} - ALLOWED["connectors"] == {"processors"}


def test_the_checker_sees_a_wrong_room(tmp_path: Path) -> None:
    processors = tmp_path / "torpor" / "processors"
    for room, text in {
        "fold": "import time\nfrom torpor.processors.store import tables\n",
        "store": "from torpor.streams.config import Settings\nfrom torpor.processors import step\n",
        "models": "from torpor.processors.replay import Replayer\n",
    }.items():
        (processors / room).mkdir(parents=True)
        (processors / room / "planted.py").write_text(text)
    (processors / "step.py").write_text("from torpor.processors.fold import transitions\n")  # a runtime: fine
    assert sorted(_room_problems(tmp_path)) == sorted([
        "torpor.processors.fold.planted imports time: the fold does no I/O",
        "torpor.processors.fold.planted imports torpor.processors.store (fold may not import store)",
        "torpor.processors.store.planted imports torpor.streams.config (store may not import streams)",
        "torpor.processors.store.planted imports torpor.processors.step (store may not import runtimes)",
        "torpor.processors.models.planted imports torpor.processors.replay (models may not import runtimes)",
    ])


def test_only_the_tracing_modules_import_opentelemetry() -> None:
    wrong = [f"torpor/{path.relative_to(PACKAGE)} imports {imported}"
             for path in sorted(PACKAGE.rglob("*.py"))
             if path.relative_to(PACKAGE).as_posix() not in TRACING_MODULES
             for imported in _imports(path) if imported.split(".")[0] == "opentelemetry"]
    assert not wrong, "OpenTelemetry imported outside the tracing modules:\n" + "\n".join(wrong)


def test_torpor_runs_without_the_otel_extra() -> None:
    """Without the SDK (a provider's client may bring OpenTelemetry's API alone), the
    processor, the connectors and the command line import without any tracing module,
    tracing off is None, and asking for traces says which extra to install."""
    program = """
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
            raise ImportError(f"no module named {name!r} (blocked by the test)")
        return None
sys.meta_path.insert(0, Absent())
import torpor.cli, torpor.cli.processor, torpor.cli.processor_run, torpor.cli.connector, torpor.cli.send
import torpor.processors.processor, torpor.connectors.runtime
from torpor.cli.traces import start_tracing
from torpor.schemas.errors import ConfigError
assert start_tracing("off", "x") is None
try:
    start_tracing("otlp", "x")
except ConfigError as error:
    assert "torpor[otel]" in str(error), error
else:
    raise AssertionError("otlp without OpenTelemetry started")
assert not [m for m in sys.modules if m.startswith("torpor.") and m.endswith(".tracing")]
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
