"""The compiled core: which modules mypyc compiles, building them, and whether they are used.

Why: the fold, the step, the store and the codecs' hot paths are most of the CPU a
completion costs (issue 18), and they are already typed for `mypy --strict`, which is
what mypyc needs to compile them into C extensions. Compiled, the same source costs
a fifth less CPU per completion in local mode, an eighth in Kafka mode (bench/README.md,
"stop 22"). Nothing else
changes: the compiled modules are the same code, and every one of them still runs as
Python when it is not built.

Contract.

- `MODULES`: the modules compiled. They hold functions and plain classes over the
  records of `torpor.schemas.records` and `torpor.processors.fold.state`, which stay
  Python classes (they use slot tricks, `torpor.schemas.frozen`, that a compiled class
  does not have, and their codecs read their fields' declared types, which a compiled
  class does not keep: `str | None` becomes `type`), and the fold's own frozen records
  that nothing decodes (`fold.facts`, `fold.effects`): native classes that write their
  own `__init__` (`fold.effects` says why).
- `build()` (`bin/compile`, and `bin/venv` when the build is missing or out of date):
  one at a time (a lock file); removes the manifest and every earlier extension, compiles
  `MODULES` in place (a stub `.so` beside each source, the code in one shared library at
  the checkout's root), then writes `MANIFEST`: the interpreter's tag, the SHA-256 of
  every source the build depends on (`dependencies`: the 24 and every torpor module they
  import, since mypyc copies imported constants and types into its C), and the size and
  time of every extension. Needs a C compiler, the Python headers and setuptools (all in
  the lock or on the machine); raises if the build fails.
- `choose()` (run by `torpor/__init__.py`, before any of `MODULES` can be imported): the
  compiled modules are used only if `MANIFEST` names this interpreter and this module
  list, every source hashes as it did and every extension is the one built; then the
  shared library is loaded by its path, never another checkout's found on `sys.path`.
  Otherwise (a source edited since the build, another Python, a half-finished build,
  `TORPOR_PURE=1`) a finder makes every module of the package load from its `.py`. All
  or none: compiled modules call each other directly in C, so one loaded from a newer
  source would still see its neighbours' old code.
- `status()`: why the compiled modules are used or not, for a start-up log line;
  `active()`: whether they are.

Tests that replace a module-level function of `MODULES` (monkeypatch) see no effect on
compiled callers, which bound the original at build time: they are marked `pure_only`,
skipped while the compiled core is active, and run by `bin/test`'s pure pass
(`TORPOR_PURE=1`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Final

MODULES: Final = (
    "torpor.processors.fold.authority",
    "torpor.processors.fold.builtins",
    "torpor.processors.fold.calls",
    "torpor.processors.fold.children",
    "torpor.processors.fold.draft",
    "torpor.processors.fold.effects",
    "torpor.processors.fold.facts",
    "torpor.processors.fold.forks",
    "torpor.processors.fold.history",
    "torpor.processors.fold.inbound",
    "torpor.processors.fold.pending",
    "torpor.processors.fold.receipts",
    "torpor.processors.fold.transitions",
    "torpor.processors.fold.verify",
    "torpor.processors.models.callids",
    "torpor.processors.step",
    "torpor.processors.store.keys",
    "torpor.processors.store.kv",
    "torpor.processors.store.statecodec",
    "torpor.processors.store.tables",
    "torpor.schemas.avroreader",
    "torpor.schemas.avrowriter",
    "torpor.schemas.ids",
    "torpor.schemas.sortedjson",
)
PURE_ENV: Final = "TORPOR_PURE"
ROOT: Final = Path(__file__).resolve().parent.parent  # the checkout: MODULES' paths start here
MANIFEST: Final = ROOT / "torpor" / ".compiled.json"
GROUP: Final = "torpor_core"  # the shared library: `torpor_core__mypyc.<suffix>` at ROOT
BUILD_DIR: Final = ROOT / ".torpor" / "compiled"  # mypyc's C sources and the objects
_SUFFIX: Final = importlib.machinery.EXTENSION_SUFFIXES[0]  # e.g. .cpython-311-x86_64-linux-gnu.so

_UNCHOSEN: Final = "not chosen yet"
_status = _UNCHOSEN
_active = False


def source_path(module: str, root: Path = ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def extension_path(module: str, root: Path = ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_name(module.rpartition(".")[2] + _SUFFIX)


def shared_library_path(root: Path = ROOT) -> Path:
    """The one library holding every compiled module's code (each `.so` beside a source is a stub)."""
    return root / f"{GROUP}__mypyc{_SUFFIX}"


def _module_file(name: str, root: Path) -> Path | None:
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def dependencies(modules: Sequence[str], root: Path = ROOT) -> list[Path]:
    """The sources a build of `modules` depends on: theirs, and those of every module of
    their package they import, directly or not, with the packages' `__init__.py` on the way.
    Why not only theirs: mypyc writes the `Final` constants and the types of the modules a
    compiled one imports into its C code, so an edit to `schemas/records.py` or to a limit
    in `streams/config.py` must make the build stale too (review of 6616c8e)."""
    package = modules[0].partition(".")[0] if modules else ""
    seen: dict[str, Path] = {}
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name, root)
        if path is None:  # a name imported from a module, not a module
            continue
        seen[name] = path
        parts = name.split(".")
        todo.extend(".".join(parts[:depth]) for depth in range(1, len(parts)))
        for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
            if isinstance(node, ast.Import):
                todo.extend(alias.name for alias in node.names if alias.name.partition(".")[0] == package)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None \
                    and node.module.partition(".")[0] == package:
                todo.append(node.module)
                todo.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return sorted(seen.values())


def _digest(path: Path) -> str:
    """The SHA-256 of a file ("" if it cannot be read: it never matches)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def _stat(path: Path) -> list[int]:
    """Size and modification time: a build's extensions are several MiB, too many to hash at
    every import, and a rebuild or a half-finished write changes these."""
    try:
        found = path.stat()
    except OSError:
        return []
    return [found.st_size, found.st_mtime_ns]


def interpreter() -> str:
    """What a build is valid for: the implementation's cache tag and extension suffix."""
    return f"{sys.implementation.cache_tag}{_SUFFIX}"


def manifest_of(modules: Sequence[str], sources: Sequence[Path], root: Path = ROOT) -> dict[str, object]:
    """What `MANIFEST` says of a build of `modules` at `root` whose inputs are `sources`."""
    extensions = [*(extension_path(m, root) for m in modules), shared_library_path(root)]
    return {
        "interpreter": interpreter(),
        "modules": list(modules),
        "sources": {str(p.relative_to(root)): _digest(p) for p in sources},
        "extensions": {str(p.relative_to(root)): _stat(p) for p in extensions},
    }


def stale(manifest: Path = MANIFEST, modules: Sequence[str] = MODULES, root: Path = ROOT) -> str | None:
    """Why the build at `root` cannot be used (module docstring), or None if it can."""
    try:
        built = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return "not built (bin/compile builds it)"
    if not isinstance(built, dict) or built.get("interpreter") != interpreter():
        return f"built for another interpreter than {interpreter()} (bin/compile rebuilds it)"
    sources, extensions = built.get("sources"), built.get("extensions")
    if built.get("modules") != list(modules) or not isinstance(sources, dict) \
            or not isinstance(extensions, dict):
        return "built for another list of modules (bin/compile rebuilds it)"
    own = [str(source_path(m, root).relative_to(root)) for m in modules]
    changed = [name for name in own if name not in sources]
    changed += [name for name, digest in sources.items() if _digest(root / name) != digest]
    if changed:
        return f"out of date: {len(changed)} source(s) changed since the build, {changed[0]} first " \
               "(bin/compile rebuilds it)"
    wanted = [*(extension_path(m, root) for m in modules), shared_library_path(root)]
    now = {p: _stat(p) for p in wanted}
    moved = [p.name for p in wanted if not now[p] or extensions.get(str(p.relative_to(root))) != now[p]]
    if moved:
        return f"incomplete: {moved[0]} is missing or not the one built (bin/compile rebuilds it)"
    return None


class _SourceOnly:
    """A meta path finder: every module of `package` as its `.py`, never as a compiled
    extension beside it (one of `MODULES`, or one left by a build of a longer list).
    (Not an `importlib.abc.MetaPathFinder`: that import alone cost ~18 ms.)"""

    def __init__(self, package: str) -> None:
        self._prefix = package + "."

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not fullname.startswith(self._prefix):
            return None
        found = importlib.machinery.PathFinder.find_spec(fullname, path)
        if found is None or found.origin is None or found.origin.endswith(".py"):
            return found
        source = Path(found.origin).with_name(fullname.rpartition(".")[2] + ".py")
        return importlib.util.spec_from_file_location(fullname, source)


class _SharedLibrary:
    """A meta path finder for the build's shared library, by its path: the stubs import it
    by name, and `sys.path` could hold another checkout's (the venv's `.pth`, the working
    directory)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._name = path.name.partition(".")[0]

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self._name:
            return None
        return importlib.util.spec_from_file_location(fullname, self._path)


def choose(env: Mapping[str, str] = os.environ) -> None:
    """Use the compiled modules if they are built for these sources, else their `.py` (once)."""
    global _status, _active
    if _status != _UNCHOSEN:
        return
    if env.get(PURE_ENV, "") not in ("", "0"):
        reason: str | None = f"off ({PURE_ENV}={env[PURE_ENV]})"
    else:
        reason = stale()
    if reason is None:
        _status, _active = "in use", True
        sys.meta_path.insert(0, _SharedLibrary(shared_library_path()))
        return
    _status = reason
    sys.meta_path.insert(0, _SourceOnly(__name__.partition(".")[0]))


def status() -> str:
    """'in use', or why not."""
    return _status


def active() -> bool:
    return _active


def build(jobs: int = 2) -> None:
    """Compile `MODULES` in place and write `MANIFEST` (module docstring). Raises on failure.
    One build at a time per checkout (a lock file): a second waits, then builds again."""
    import fcntl  # build-time only, like the imports below

    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    with open(BUILD_DIR / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _build(jobs)


def toolchain_problem() -> str | None:
    """Why this machine cannot compile the core (no C compiler, no Python headers), or None.

    Checked before mypyc runs: its type check of the sources takes most of a minute, and on
    a machine without a compiler `bin/venv` would pay that at every run only to fail at
    the first C file."""
    import shlex
    import shutil
    import sysconfig

    # setuptools compiles with $CC when it is set, else with the CC this Python was built with.
    chosen = os.environ.get("CC") or str(sysconfig.get_config_var("CC") or "cc")
    compiler = (shlex.split(chosen) or ["cc"])[0]
    if shutil.which(compiler) is None:
        return f"no C compiler: {compiler!r} ($CC, or this Python's CC) is not on PATH"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        return f"no Python headers: {headers} is missing (python3-dev)"
    return None


def _build(jobs: int) -> None:
    problem = toolchain_problem()
    if problem is not None:
        raise RuntimeError(f"cannot compile the core: {problem}")
    MANIFEST.unlink(missing_ok=True)
    # Every extension in the package, not only those of `MODULES`: one left by a build of a
    # longer list would still be imported before its source.
    for built in [*(ROOT / "torpor").rglob(f"*{_SUFFIX}"), *ROOT.glob(f"{GROUP}__mypyc*")]:
        built.unlink()
    # Build-time only: a runtime without mypy (or setuptools) never imports these.
    from mypyc.build import mypycify
    from setuptools import Distribution

    inputs = dependencies(MODULES)
    before = manifest_of(MODULES, inputs)["sources"]
    previous = Path.cwd()
    os.chdir(ROOT)  # mypyc names each module from its path, relative to here
    try:
        extensions = mypycify([str(source_path(m).relative_to(ROOT)) for m in MODULES],
                              opt_level="3", group_name=GROUP, target_dir=str(BUILD_DIR))
        # A Distribution of our own, not setup(): setup() would read pyproject.toml, which
        # describes the package for hatchling, not this build.
        dist = Distribution({"name": GROUP, "ext_modules": extensions})
        command = dist.get_command_obj("build_ext")
        command.inplace = True
        command.build_temp = str(BUILD_DIR / "temp")
        command.build_lib = str(BUILD_DIR / "lib")
        command.parallel = jobs
        dist.run_command("build_ext")
    finally:
        os.chdir(previous)
    made = manifest_of(MODULES, inputs)
    if made["sources"] != before:
        raise RuntimeError("a source changed while it was being compiled: run bin/compile again")
    MANIFEST.write_text(json.dumps(made, indent=1) + "\n")


def main(argv: Sequence[str]) -> int:
    """`bin/compile [build|check|status]`: build; exit 1 if the build cannot be used; say why."""
    if list(argv) == ["build"]:
        build(os.cpu_count() or 1)
        print(f"compiled core: built {len(MODULES)} modules", file=sys.stderr)
        return 0
    if list(argv) in (["check"], ["status"]):
        reason = stale()
        print(f"compiled core: {'built, up to date' if reason is None else reason}", file=sys.stderr)
        return 0 if reason is None or argv[0] == "status" else 1
    print("usage: bin/compile [build|check|status]", file=sys.stderr)
    return 2
