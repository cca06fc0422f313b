"""The dependency direction of DESIGN section 9, checked on the imports themselves.

`schemas` <- `streams` <- `processors`, `connectors`; processors and connectors never
import each other; only the command line (`torpor.cli`) composes them. The fold imports
nothing from `streams`.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

PACKAGE: Final = Path(__file__).resolve().parent.parent / "torpor"

# layer -> the torpor layers it may import (itself always allowed).
ALLOWED: Final[dict[str, frozenset[str]]] = {
    "schemas": frozenset(),
    "streams": frozenset({"schemas"}),
    "processors": frozenset({"schemas", "streams"}),
    "connectors": frozenset({"schemas", "streams"}),
    "cli": frozenset({"schemas", "streams", "processors", "connectors"}),
}

# Pure modules of the fold: they may not reach Kafka plumbing either.
FOLD_MODULES: Final = ("fold", "state", "history", "builtins", "effects")


def _torpor_imports(path: Path, root: Path = PACKAGE.parent) -> set[str]:
    """The dotted `torpor.*` modules that `path` (under `root`) imports, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("torpor"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = path.relative_to(root).with_suffix("").parts
                base = parts[: len(parts) - node.level]
                module = ".".join((*base, node.module)) if node.module else ".".join(base)
                found.add(module)
            elif node.module and node.module.startswith("torpor"):
                found.add(node.module)
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


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


def test_the_fold_imports_nothing_from_streams() -> None:
    wrong: list[str] = []
    for name in FOLD_MODULES:
        path = PACKAGE / "processors" / f"{name}.py"
        if not path.exists():
            continue
        wrong.extend(
            f"torpor/processors/{name}.py imports {module}"
            for module in _torpor_imports(path)
            if _layer(module) in {"streams", "connectors", "cli"}
        )
    assert not wrong, "the fold must stay pure:\n" + "\n".join(wrong)


def test_the_checker_sees_a_wrong_edge(tmp_path: Path) -> None:
    # Guard against a checker that can never fail: planted wrong imports are found.
    planted = tmp_path / "torpor" / "connectors" / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from torpor.processors import fold\nfrom ..processors.fold import fold as f\n")
    imports = _torpor_imports(planted, root=tmp_path)
    assert imports == {"torpor.processors", "torpor.processors.fold"}
    assert {_layer(m) for m in imports} - ALLOWED["connectors"] == {"processors"}
