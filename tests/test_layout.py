"""House rules of the package layout (issue 14), checked by reading the source tree.

- pure stage modules import neither zarr, dask, yaml, threadpoolctl nor read ``os.environ``;
- only ``distfit/stores/`` imports zarr, only ``distfit/runtime/cluster.py`` imports dask.distributed,
  only ``distfit/runtime/threads.py`` reads the environment and talks to threadpoolctl;
- no private name (``_x``) is imported from another module (package, tests and benchmarks);
- imports at the top of the module, except optional dependencies and the boundary to Dask
  (``distfit/runtime/placement.py``: the runtime's Dask side, imported when a cluster is used);
- one way to do each thing: one checksum (the only hashlib user besides the spec hash), one
  ``Domain`` from a schema (``Domain.from_schema``);
- no module over about 700 lines; tests laid out like the package.
"""
from __future__ import annotations

import ast
import functools
import inspect
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "distfit"
MODULES = sorted(PACKAGE.rglob("*.py"))

#: The mathematics: pure functions on numpy arrays, no I/O, no cluster, no environment.
PURE = (
    "checks", "mathematics/*",
    "solver/*", "spec/model", "spec/targets", "spec/groups", "spec/queries", "spec/fields", "spec/schema", "plan/residual", "plan/allocate", "plan/composition",
    "plan/planner", "plan/levels", "release/noise", "data/synthetic", "estimate/geography",
    "estimate/measurements", "estimate/projection", "estimate/rounding",
    "mask/scaling", "mask/haar", "mask/account", "mask/orbit", "mask/ols",
)
#: Imports that may sit inside a function: optional dependencies, and what must run first.
LAZY_ALLOWED = {
    "matplotlib", "matplotlib.pyplot",  # report.py selects the Agg backend before pyplot loads
    "jax", "jax.numpy", "mbi",  # estimate/graphical.py: the optional graphical extra, on first use
}
#: The boundary to Dask (distfit/runtime/placement.py's docstring): the one module that imports
#: the runtime's Dask side inside functions, when a cluster is used or microdata is read.
LAZY_BOUNDARY = {"runtime/placement": {"distfit.runtime.cluster", "dask.dataframe"}}
MAX_LINES = 720


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).with_suffix("").as_posix()


def _is_pure(path: Path) -> bool:
    name = _name(path)
    return any(name == p or (p.endswith("/*") and name.startswith(p[:-1])) for p in PURE)


def _imports(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """(node, imported module) for every import statement, with relative imports resolved to
    their text (the package uses absolute imports only)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node, "." * node.level + (node.module or "")))
    return found


def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _top_package(module: str) -> str:
    return module.split(".")[0]


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_io_and_cluster_live_in_their_own_modules(path):
    name = _name(path)
    problems = []
    for node, module in _imports(_tree(path)):
        top = _top_package(module)
        if top == "zarr" and not name.startswith("stores/"):
            problems.append(f"imports {module} (zarr belongs in distfit/stores/)")
        if (top == "distributed" or module.startswith("dask.distributed")) and name != "runtime/cluster":
            problems.append(f"imports {module} (dask.distributed belongs in distfit/runtime/cluster.py)")
        if top == "threadpoolctl" and name != "runtime/threads":
            problems.append(f"imports {module} (thread pools belong in distfit/runtime/threads.py)")
        if _is_pure(path) and top in ("zarr", "dask", "distributed", "yaml", "threadpoolctl"):
            problems.append(f"pure module imports {module}")
        if module.startswith("."):
            problems.append(f"relative import {module}")
    for node in ast.walk(_tree(path)):  # a store's attrs are its facts: stated by distfit/stores/ alone
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else \
            [node.target] if isinstance(node, ast.AugAssign) else []
        if not name.startswith("stores/") and any(
                isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute) and t.value.attr == "attrs"
                for t in targets):
            problems.append(f"line {node.lineno}: sets a store's attrs (distfit/stores/ does)")
    text = path.read_text(encoding="utf-8")
    if "os.environ" in text and name != "runtime/threads" and (_is_pure(path) or name.startswith(("spec/", "solver/"))):
        problems.append("reads os.environ (only distfit/runtime/threads.py does)")
    assert not problems, f"distfit/{name}.py: " + "; ".join(problems)


def _private_imports(path: Path) -> list[str]:
    bad = []
    for node, module in _imports(_tree(path)):
        if isinstance(node, ast.ImportFrom) and _top_package(module) in ("distfit", "tests"):
            bad.extend(f"{alias.name} from {module}" for alias in node.names
                       if alias.name.startswith("_") and not alias.name.startswith("__"))
    return bad


@pytest.mark.parametrize("path", MODULES + sorted((ROOT / "tests").rglob("*.py"))
                         + sorted((ROOT / "benchmarks").glob("*.py")), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_private_name_imported_from_another_module(path):
    assert not _private_imports(path), f"{path.relative_to(ROOT)} imports private names: {_private_imports(path)}"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_imports_at_the_top(path):
    tree = _tree(path)
    allowed = LAZY_ALLOWED | LAZY_BOUNDARY.get(_name(path), set())
    late = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node, module in _imports(function):
            names = [module] if isinstance(node, ast.Import) else [module] + [f"{module}.{a.name}" for a in node.names]
            if not any(n in allowed for n in names):
                late.append(f"line {node.lineno}: {module}")
    assert not late, f"distfit/{_name(path)}.py imports inside functions: {late}"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_module_size(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"distfit/{_name(path)}.py has {lines} lines (split it by concept)"


def test_one_checksum():
    """Store checksums are computed in one module; hashlib elsewhere only in the spec (its hash,
    and the seeded jitter of target rules)."""
    users = sorted(_name(p) for p in MODULES if any(_top_package(m) == "hashlib" for _, m in _imports(_tree(p))))
    assert set(users) <= {"stores/checksum", "spec/model", "spec/targets"}, users


def test_one_domain_from_a_schema():
    """``Domain.from_schema`` is the one way from a stored schema back to a Domain."""
    rebuilt = [f"distfit/{_name(p)}.py" for p in MODULES
               if _name(p) != "mathematics/domain" and 'Domain(tuple(schema["attributes"])' in p.read_text(encoding="utf-8")]
    assert not rebuilt, rebuilt


def test_tests_are_laid_out_like_the_package():
    """tests/<folder>/test_<module>.py tests distfit/<folder>/<module>.py (a few named exceptions)."""
    extra = {"test_layout", "test_readme", "test_docs", "test_cluster_files", "pipeline/test_run_cluster", "plan/test_streaming",
             "stores/test_xarray",  # every store opened by xarray
             "estimate/test_wide",  # the estimate job at real width through the command line, memory capped
             "cluster/test_slurm"}  # cluster/slurm and cluster/jobqueue_run.py on a real SLURM
    orphans = []
    for test in sorted((ROOT / "tests").rglob("test_*.py")):
        rel = test.relative_to(ROOT / "tests").with_suffix("").as_posix()
        if rel in extra:
            continue
        module = PACKAGE / (rel.replace("test_", "", 1) + ".py") if "/" not in rel else \
            PACKAGE / rel.rsplit("/", 1)[0] / (rel.rsplit("/", 1)[1][len("test_"):] + ".py")
        if not module.is_file():
            orphans.append(rel)
    assert not orphans, f"test files with no module of that name: {orphans}"


def _room(module: str) -> str | None:
    """The room (first package level under ``distfit``) of an imported module, ``top`` for the
    package's top-level modules and ``__init__``; None outside distfit."""
    parts = module.split(".")
    if parts[0] != "distfit":
        return None
    if len(parts) == 1 or not (PACKAGE / parts[1]).is_dir():
        return "top"  # a top-level module, or a name of distfit/__init__.py (__version__)
    return parts[1]


def _import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        rel = path.relative_to(PACKAGE).parts
        source = rel[0] if len(rel) > 1 else "top"
        edges = graph.setdefault(source, set())
        for node, module in _imports(_tree(path)):
            targets = [module]
            if isinstance(node, ast.ImportFrom) and module == "distfit":
                targets = [f"distfit.{alias.name}" for alias in node.names]
            for target in targets:
                room = _room(target)
                if room is not None and room != source:
                    edges.add(room)
    return graph


def test_the_import_graph_is_the_documented_one():
    """docs/architecture.md's ``imports`` block lists, per room, exactly the rooms it imports:
    an undocumented edge fails, and so does a documented edge that no longer exists."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("```imports\n", 1)[1].split("```", 1)[0]
    documented = {}
    for line in block.strip().splitlines():
        room, _, targets = line.partition(":")
        documented[room.strip()] = {t.strip() for t in targets.split(",") if t.strip()}
    actual = {room: edges for room, edges in _import_graph().items() if edges}
    assert actual == documented, {room: (sorted(actual.get(room, set()) - documented.get(room, set())),
                                         sorted(documented.get(room, set()) - actual.get(room, set())))
                                  for room in set(actual) | set(documented)
                                  if actual.get(room) != documented.get(room)}


def test_every_room_is_documented():
    """Every folder of the package is a room of docs/architecture.md's table, and the top level
    holds only ``__init__`` and at most three small modules."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rooms = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert not [room for room in rooms if f"| `{room}/` |" not in text]
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= 3 and all(len((PACKAGE / f"{m}.py").read_text().splitlines()) <= 100 for m in top), top


def _is_data_access(module, qualname: str) -> bool:
    """A property (or cached property) getter: reading a value, not a step of the path."""
    owner_name, _, attr = qualname.rpartition(".")
    owner = getattr(module, owner_name, None) if owner_name and "." not in owner_name else None
    if owner is None:
        return False
    return isinstance(inspect.getattr_static(owner, attr, None), (property, functools.cached_property))


def test_the_spec_path_enters_no_module_more_than_four_times(tmp_path, capsys):
    """Issue 27: following a spec from YAML to the plan store (``distfit plan``, serial, the PL94
    spec) enters no module more than 4 times. Counted from the running code (``sys.setprofile``):
    the distinct call edges from one distfit module into a function of another that itself calls
    on into a third module (the orchestration a reader follows; leaf helpers, property reads and
    imports left out)."""
    from distfit.cli import main as cli

    stack: list[list] = []  # per distfit frame: module, function, caller's module and function, calls out
    edges: set[tuple[str, str, str, str]] = set()

    def profile(frame, event, _arg):
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("distfit."):
            return
        if event == "call":
            caller = stack[-1] if stack else None
            if caller is not None and caller[0] != module:
                caller[4] = True
            stack.append([module, frame.f_code.co_qualname, caller and caller[0], caller and caller[1], False])
        elif event == "return" and stack:
            callee, function, caller_module, caller_function, calls_out = stack.pop()
            if (calls_out and caller_module and caller_module != callee and function != "<module>"
                    and not _is_data_access(sys.modules[callee], function)):
                edges.add((caller_module, caller_function, callee, function))

    sys.setprofile(profile)
    try:
        code = cli.main(["plan", str(ROOT / "pipelines" / "pl94.yaml"), "--out", str(tmp_path / "p.zarr"), "--serial"])
    finally:
        sys.setprofile(None)
    capsys.readouterr()
    assert code == 0
    entries: dict[str, list[str]] = {}
    for caller_module, caller_function, callee, function in sorted(edges):
        entries.setdefault(callee, []).append(f"{caller_module}.{caller_function} -> {function}")
    assert len(entries) >= 8  # the walk was seen: cli, spec, plan, solver, stores ...
    assert {m: e for m, e in entries.items() if len(e) > 4} == {}
