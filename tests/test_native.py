"""The compiled core's guard (torpor/native.py): a build is used only when it matches its sources.

The stale build is the hazard: a `.so` beside its `.py` wins the import, so a source
edited after `bin/compile` would silently run its old code. These tests build a fake
tree (sources, a manifest, extension files) and check each way a build goes out of date,
that the finder loads sources instead, and, in fresh processes, that the real modules
come all from the build or all from their sources.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torpor import native

MODULES = ("pkg.alpha", "pkg.beta")


def _tree(root: Path) -> Path:
    """`pkg` with two compiled sources and one they import (`gamma`), their extensions and the
    shared library (stand-ins: never imported), and the manifest `build()` would write."""
    package = root / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "gamma.py").write_text("LIMIT: int = 10\n")
    native.source_path("pkg.alpha", root).write_text("from pkg.gamma import LIMIT\nNAME = 'pkg.alpha'\n")
    native.source_path("pkg.beta", root).write_text("import pkg.alpha\nNAME = 'pkg.beta'\n")
    for module in MODULES:
        native.extension_path(module, root).write_bytes(b"not an extension")
    native.shared_library_path(root).write_bytes(b"not a library either")
    manifest = root / "manifest.json"
    manifest.write_text(json.dumps(native.manifest_of(MODULES, native.dependencies(MODULES, root), root)))
    return manifest


def test_a_build_depends_on_its_sources_what_they_import_and_their_packages(tmp_path: Path) -> None:
    _tree(tmp_path)
    found = [p.relative_to(tmp_path).as_posix() for p in native.dependencies(MODULES, tmp_path)]
    assert found == ["pkg/__init__.py", "pkg/alpha.py", "pkg/beta.py", "pkg/gamma.py"]


def test_the_real_build_depends_on_the_records_and_the_limits_it_inlines() -> None:
    found = {p.relative_to(native.ROOT).as_posix() for p in native.dependencies(native.MODULES)}
    assert {"torpor/schemas/records.py", "torpor/processors/fold/state.py", "torpor/streams/config.py",
            "torpor/processors/step.py"} <= found


def test_a_build_that_matches_its_sources_is_used(tmp_path: Path) -> None:
    assert native.stale(_tree(tmp_path), MODULES, tmp_path) is None


def test_a_source_edited_after_the_build_makes_it_stale(tmp_path: Path) -> None:
    manifest = _tree(tmp_path)
    native.source_path("pkg.beta", tmp_path).write_text("NAME = 'edited'\n")
    reason = native.stale(manifest, MODULES, tmp_path)
    assert reason is not None and "out of date" in reason and "pkg/beta.py" in reason


def test_an_imported_module_edited_after_the_build_makes_it_stale(tmp_path: Path) -> None:
    """mypyc writes an imported `Final` constant into the compiled code: a new limit in a
    module that is not compiled must not leave the old one in force (review of 6616c8e)."""
    manifest = _tree(tmp_path)
    (tmp_path / "pkg" / "gamma.py").write_text("LIMIT: int = 11\n")
    assert "pkg/gamma.py" in (native.stale(manifest, MODULES, tmp_path) or "")


def test_a_missing_source_extension_or_shared_library_makes_it_stale(tmp_path: Path) -> None:
    manifest = _tree(tmp_path)
    native.shared_library_path(tmp_path).unlink()
    assert "incomplete" in (native.stale(manifest, MODULES, tmp_path) or "")
    native.shared_library_path(tmp_path).write_bytes(b"not a library either")  # another mtime
    assert "incomplete" in (native.stale(manifest, MODULES, tmp_path) or "")
    (tmp_path / "again").mkdir()
    manifest = _tree(tmp_path / "again")
    native.extension_path("pkg.alpha", tmp_path / "again").unlink()
    assert "incomplete" in (native.stale(manifest, MODULES, tmp_path / "again") or "")
    native.source_path("pkg.alpha", tmp_path / "again").unlink()
    assert "out of date" in (native.stale(manifest, MODULES, tmp_path / "again") or "")


@pytest.mark.parametrize("manifest_text", ["", "{", "[]", '{"interpreter": 1}', "null"])
def test_a_missing_or_garbled_manifest_means_not_built(tmp_path: Path, manifest_text: str) -> None:
    _tree(tmp_path)
    manifest = tmp_path / "garbled.json"
    manifest.write_text(manifest_text)
    assert native.stale(manifest, MODULES, tmp_path) is not None
    assert "not built" in (native.stale(tmp_path / "absent.json", MODULES, tmp_path) or "")


def test_a_build_for_another_interpreter_or_module_list_is_stale(tmp_path: Path) -> None:
    manifest = _tree(tmp_path)
    built = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**built, "interpreter": "cpython-399.so"}))
    assert "another interpreter" in (native.stale(manifest, MODULES, tmp_path) or "")
    manifest.write_text(json.dumps(built))
    assert "another list" in (native.stale(manifest, ("pkg.alpha",), tmp_path) or "")


def test_the_finder_loads_each_source_and_never_the_extension_beside_it(tmp_path: Path) -> None:
    _tree(tmp_path)
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); from torpor import native\n"
        "try:\n    import pkg.alpha\nexcept ImportError as e:\n    print('extension tried:', e)\n"
        "sys.modules.pop('pkg.alpha', None)\n"
        "sys.meta_path.insert(0, native._SourceOnly('pkg'))\n"
        "import pkg.alpha, pkg.beta; print(pkg.alpha.NAME, pkg.beta.NAME, pkg.alpha.__file__)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                          check=True, env={"TORPOR_PURE": "1", "PATH": ""}, timeout=120)
    lines = done.stdout.splitlines()
    # Without the finder the import system takes the (fake) extension first: the hazard.
    assert lines[0].startswith("extension tried:"), done.stdout
    assert lines[1].startswith("pkg.alpha pkg.beta ") and lines[1].endswith("alpha.py"), done.stdout


def _origins(env: dict[str, str]) -> tuple[set[str], str]:
    script = ("import importlib, torpor.native as n\n"
              "for m in n.MODULES: print(importlib.import_module(m).__file__)\n"
              "print(n.status())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env=env, timeout=120)
    *files, status = done.stdout.splitlines()
    assert len(files) == len(native.MODULES)
    return {Path(f).suffix for f in files}, status


def test_with_torpor_pure_every_module_of_the_core_is_its_source() -> None:
    suffixes, status = _origins({"TORPOR_PURE": "1", "PATH": ""})
    assert suffixes == {".py"} and status == "off (TORPOR_PURE=1)"


def test_the_core_is_all_compiled_when_the_build_is_fresh_and_all_source_otherwise() -> None:
    reason = native.stale()
    suffixes, status = _origins({"PATH": ""})
    if reason is None:  # bin/venv builds it: what bin/test and CI run
        assert suffixes == {".so"} and status == "in use"
    else:
        assert suffixes == {".py"} and status == reason


def test_a_machine_without_a_compiler_or_headers_is_told_so_before_mypyc_runs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sysconfig

    include = tmp_path / "include"
    include.mkdir()
    (include / "Python.h").write_text("")
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"include": str(include)})
    recorded = {"CC": "no-such-cc -pthread"}
    monkeypatch.setattr(sysconfig, "get_config_var", lambda name: recorded.get(name))
    monkeypatch.delenv("CC", raising=False)
    no_compiler = "no C compiler: 'no-such-cc' ($CC, or this Python's CC) is not on PATH"
    assert native.toolchain_problem() == no_compiler
    # $CC wins over the recorded one, as in setuptools (any program on PATH stands in here).
    monkeypatch.setenv("CC", f"{sys.executable} -O2")
    assert native.toolchain_problem() is None
    (include / "Python.h").unlink()
    missing = include / "Python.h"
    assert native.toolchain_problem() == f"no Python headers: {missing} is missing (python3-dev)"
    # The build stops there, before it removes anything: a checkout of its own shows it.
    root = tmp_path / "checkout"
    stub = root / "torpor" / f"kept{native._SUFFIX}"
    stub.parent.mkdir(parents=True)
    stub.write_bytes(b"an earlier build")
    monkeypatch.setattr(native, "ROOT", root)
    monkeypatch.setattr(native, "MANIFEST", root / "torpor" / ".compiled.json")
    native.MANIFEST.write_text("{}")
    with pytest.raises(RuntimeError, match="cannot compile the core: no Python headers"):
        native._build(1)
    assert stub.exists() and native.MANIFEST.exists()
