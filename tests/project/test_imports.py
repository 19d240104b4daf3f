"""The import rules between shardplan's packages: each stage imports only the stages before
it, so that a training worker needs neither solver nor service, and the vocabulary needs
nothing but pydantic and numpy.

An AST scan of every module of ``planner_service``, ``runtime`` and ``clients``, imports
inside functions included, against ``RULES`` and for import cycles between modules; the
same scan for private names imported from another module (``PRIVATE_IMPORTS_ALLOWED``) and
for import loops between the subpackages of ``ACYCLIC``; then, in a fresh interpreter, what
importing the vocabulary and the CLI actually loads.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("planner_service", "runtime", "clients")
# The core install's libraries (pyproject.toml's dependencies), as imported.
CORE = frozenset({"pydantic", "pydantic_core", "numpy"})
PLAN, COSTS, VALIDATE, SOLVE = (
    f"planner_service.{stage}" for stage in ("plan", "costs", "validate", "solve")
)
CHECK, REPORTS, SERVICE = (
    f"planner_service.{package}" for package in ("check", "reports", "service")
)
ROUTES, SERVICE_HTTP, SOLVER = (f"{SERVICE}.{part}" for part in ("routes", "http", "solver"))
STORE, SETTINGS, STATE = (f"{SERVICE}.{part}" for part in ("store", "settings", "state"))
PROCESSES, PAGES = f"{SERVICE}.processes", f"{SERVICE}.pages"
# planner_service/__init__.py holds the version only: every module may import it.
VERSION = "planner_service"


@dataclass(frozen=True)
class Rule:
    """What the modules of ``covers`` may import: first-party modules under ``ours`` but
    not under ``never``, third-party ones under ``theirs`` (None: any), and, inside
    functions only (the commands that need an extra import it when they run), anything
    under ``lazy``."""

    covers: str
    ours: tuple[str, ...]
    theirs: frozenset[str] | None
    says: str
    lazy: tuple[str, ...] = ()
    never: tuple[str, ...] = ()


CLIENT_OURS = (PLAN, COSTS, VALIDATE, CHECK, REPORTS, "clients")
CLIENTS_MAY = (
    "clients import plan, costs, validate, check, reports and the core install's libraries; "
)
RULES = (
    Rule(VERSION, (), frozenset(), "planner_service/__init__.py imports only the standard library"),
    Rule(PLAN, (PLAN,), CORE, "plan (the vocabulary) imports only plan, pydantic and numpy"),
    Rule(
        f"{PLAN}.runs",
        (),
        frozenset(),
        "plan.runs (schema 2.0's run encodings, which the vocabulary's models build on) "
        "imports only the standard library",
    ),
    Rule(COSTS, (PLAN, COSTS), CORE, "costs imports only plan and costs (and pydantic, numpy)"),
    Rule(
        VALIDATE,
        (PLAN, COSTS, VALIDATE),
        CORE,
        "validate imports only plan, costs and validate (and pydantic, numpy)",
    ),
    Rule(
        SOLVE,
        (PLAN, COSTS, SOLVE),
        CORE | {"ortools"},
        "solve imports only plan, costs and solve (and pydantic, numpy, ortools)",
    ),
    Rule(
        CHECK,
        (PLAN, COSTS, VALIDATE, CHECK),
        CORE,
        "check (the capacity analysis) imports only plan, costs, validate (to hold a baseline "
        "plan against the request) and check, never solve, not even inside a function: its "
        "plans come from the PlanSource it is given, so the service and a CLI without "
        "OR-Tools run it; and never reports (it computes, reports renders)",
    ),
    Rule(
        REPORTS,
        (PLAN, COSTS, CHECK, REPORTS),
        CORE,
        "reports imports only plan, costs and check (the results it renders)",
    ),
    Rule(SERVICE, ("planner_service",), None, "service may import all of planner_service"),
    Rule(
        STORE,
        (PLAN, STORE),
        CORE | {"zstandard", "psycopg", "psycopg_pool"},
        "the store imports only plan (the vocabulary) and itself of ours, so that the rest "
        "of the service builds on it and never the other way round; of libraries pydantic, "
        "numpy, zstandard and the PostgreSQL driver",
    ),
    Rule(
        ROUTES,
        ("planner_service",),
        None,
        "a route module never imports another route module: what two routes share (a "
        "dependency, a response, a job) lives in the module that owns it (deps.py, http/, "
        "solver/)",
        never=(ROUTES,),
    ),
    Rule(
        SERVICE_HTTP,
        (PLAN, SERVICE_HTTP, SETTINGS, STORE),
        None,
        "service/http (problems, responses, limits, paging, metrics, the fetch fast path) "
        "imports only plan, itself, the settings and the store: it knows nothing of "
        "solving, the process's state or the routes",
    ),
    Rule(
        PAGES,
        (PLAN, COSTS, REPORTS, PAGES),
        CORE,
        "service/pages (the HTML for people) imports only plan, costs, reports and itself: "
        "a page renders a plan and its request, so the routes hand it both, and it needs "
        "neither the store, the solver nor the routes",
    ),
    Rule(
        SOLVER,
        (PLAN, SOLVE, SOLVER, SERVICE_HTTP, SETTINGS, STATE, STORE, PROCESSES),
        None,
        "service/solver imports plan, solve, itself, service/http, the settings, the state, "
        "the store and processes.py; never the routes, their dependencies or the app",
    ),
    Rule(
        "runtime",
        (PLAN, COSTS, VALIDATE, "runtime", "clients.http"),
        CORE | {"torch", "fbgemm_gpu"},
        "runtime imports only plan, costs and validate of the planner (never solve or "
        "service), of the clients only the HTTP client (load_plan fetches a job's plan at "
        "startup with its retries, integrity check and cache; it needs only plan and httpx, "
        "both in the core install a worker has), and torch, fbgemm_gpu, pydantic, numpy",
    ),
    Rule(
        "clients",
        CLIENT_OURS,
        CORE | {"httpx"},
        CLIENTS_MAY + "solve only inside a command (shardplan plan); never planner_service.service",
        lazy=(SOLVE,),
    ),
    Rule(
        "clients.torchrec",
        CLIENT_OURS,
        CORE | {"httpx"},
        CLIENTS_MAY
        + "TorchRec interop reads TorchRec's objects by attribute and imports torchrec only "
        "inside to_torchrec_plan",
        lazy=("torchrec",),
    ),
    Rule(
        "clients.http",
        (PLAN, "clients.http"),
        CORE | {"httpx"},
        "the HTTP client imports only plan (the vocabulary), itself and httpx, so that it "
        "works on a core install (a training job's)",
    ),
    Rule(
        "clients.cli.measure",
        CLIENT_OURS,
        CORE | {"httpx"},
        CLIENTS_MAY
        + "only the measure command imports the runtime (and with it torch and FBGEMM), "
        "inside the command",
        lazy=("runtime",),
    ),
    Rule(
        "clients.cli.calibrate",
        CLIENT_OURS,
        CORE | {"httpx"},
        CLIENTS_MAY
        + "only the calibrate command imports the runtime (torch, FBGEMM), inside the command",
        lazy=("runtime",),
    ),
    Rule(
        "clients.cli.serve",
        CLIENT_OURS,
        CORE | {"httpx"},
        CLIENTS_MAY
        + "only the serve command imports planner_service.service and uvicorn, inside the "
        "command",
        lazy=(SERVICE, "uvicorn"),
    ),
)


@dataclass(frozen=True)
class Import:
    name: str  # the module imported, absolute
    line: int
    text: str  # the statement as written
    in_function: bool


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield module_name(path), path


def is_first_party_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(module: str, source: str, is_package: bool = False) -> Iterator[Import]:
    """Every import statement, at module level or in a function, with absolute names;
    ``from package import module`` counts as importing the module."""
    lines = source.splitlines()
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST, in_function: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import | ast.ImportFrom):
                text = " ".join(line.strip() for line in lines[child.lineno - 1 : child.end_lineno])
                for name in imported_names(child, package):
                    yield Import(name, child.lineno, text, in_function)
            yield from visit(child, inner)

    yield from visit(ast.parse(source), False)


def imported_names(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = from_base(node, package)
    names = [f"{base}.{alias.name}" for alias in node.names]
    return [name if is_first_party_module(name) else base for name in names]


def from_base(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` statement imports from."""
    base = node.module or ""
    if node.level:  # relative: from .x import y
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return base


def rule_for(module: str) -> Rule | None:
    """The most specific rule covering ``module`` (the version's rule covers only itself)."""

    def covers(rule: Rule) -> bool:
        return rule.covers == module or (rule.covers != VERSION and under(module, rule.covers))

    return max(filter(covers, RULES), key=lambda rule: len(rule.covers), default=None)


def allowed(rule: Rule, found: Import) -> bool:
    name = found.name
    top = name.partition(".")[0]
    if top in sys.stdlib_module_names or name == VERSION:
        return True
    if found.in_function and any(under(name, prefix) for prefix in rule.lazy):
        return True
    if top in PACKAGES:
        if any(under(name, prefix) for prefix in rule.never):
            return False
        return any(under(name, prefix) for prefix in rule.ours)
    return rule.theirs is None or top in rule.theirs


def violations(module: str, path: str, source: str, is_package: bool = False) -> list[str]:
    rule = rule_for(module)
    if rule is None:
        return [
            f"{path}: no rule in tests/project/test_imports.py covers {module}: add one to RULES"
        ]
    return [
        f"{path}:{found.line}: {module} imports {found.name} (`{found.text}`)"
        f"{' inside a function' if found.in_function else ''}, but {rule.says}"
        for found in imports(module, source, is_package)
        if not allowed(rule, found)
    ]


def test_every_module_imports_only_what_its_stage_may():
    found: list[str] = []
    scanned = 0
    for module, path in modules():
        source = path.read_text()
        relative = str(path.relative_to(ROOT))
        found += violations(module, relative, source, path.name == "__init__.py")
        scanned += 1
    assert scanned > 50  # every package was scanned, not an empty folder
    assert not found, "import rules broken:\n" + "\n".join(found)


def test_a_broken_rule_names_the_module_the_line_the_import_and_the_rule():
    source = textwrap.dedent(
        """
        import math
        from pydantic import BaseModel

        def late():
            from planner_service.solve.pipeline import solve
        """
    )
    assert violations("planner_service.plan.late", "planner_service/plan/late.py", source) == [
        "planner_service/plan/late.py:6: planner_service.plan.late imports "
        "planner_service.solve.pipeline (`from planner_service.solve.pipeline import solve`) "
        "inside a function, but plan (the vocabulary) imports only plan, pydantic and numpy"
    ]


@pytest.mark.parametrize(
    ("module", "source", "broken"),
    [
        ("runtime.late", "from planner_service import solve", True),
        ("runtime.late", "from planner_service.validate import validator", False),
        ("clients.cli.late", "import ortools", True),
        ("clients.cli.late", "from planner_service.solve.pipeline import solve", True),
        ("clients.cli.late", "def run():\n    from planner_service.solve import pipeline", False),
        ("clients.cli.late", "def run():\n    from planner_service.service import settings", True),
        (
            "clients.cli.serve",
            "def run():\n    from planner_service.service import settings",
            False,
        ),
        ("clients.cli.serve", "from planner_service.service import settings", True),
        ("clients.torchrec", "import torchrec", True),
        ("clients.torchrec", "def to_plan():\n    from torchrec.distributed import types", False),
        ("clients.torchrec", "def to_plan():\n    import torch", True),
        ("clients.cli.late", "def run():\n    import torchrec", True),
        ("clients.http.late", "import httpx", False),
        ("clients.http.late", "from planner_service.plan.canonical import plan_id_of", False),
        ("clients.http.late", "from planner_service.validate import validator", True),
        ("clients.http.late", "from clients.cli import plan", True),
        ("clients.http.late", "def run():\n    from planner_service.solve import pipeline", True),
        ("planner_service.costs.late", "from . import options", False),
        ("planner_service.costs.late", "from ..solve import problem", True),
        ("planner_service.costs.late", "import fastapi", True),
        ("planner_service.service.late", "import fastapi", False),
        ("planner_service.service.store.late", "from planner_service.service import state", True),
        ("planner_service.service.store.late", "from ..problems import ProblemError", True),
        ("planner_service.service.store.late", "from .database import named", False),
        ("planner_service.service.store.late", "import fastapi", True),
        ("planner_service.service.routes.late", "from . import solves", True),
        ("planner_service.service.routes.late", "from .solves import job_response", True),
        (
            "planner_service.service.routes.late",
            "def run():\n    from planner_service.service.routes import plans",
            True,
        ),
        ("planner_service.service.routes.late", "from ..http.responses import JSON", False),
        ("planner_service.service.routes.late", "from ..solver.jobs import SolveJobs", False),
        ("planner_service.service.app", "from .routes import plans, solves", False),
        ("planner_service.service.http.late", "from ..solver.pool import SolvePool", True),
        ("planner_service.service.http.late", "from ..state import ServiceState", True),
        ("planner_service.service.solver.late", "from ..routes.solves import router", True),
        ("planner_service.service.solver.late", "from ..deps import State", True),
        ("planner_service.service.solver.late", "from ..http.problems import ProblemError", False),
        ("planner_service.check.late", "from planner_service.costs import estimate", False),
        ("planner_service.check.late", "from planner_service.solve import explain", True),
        ("planner_service.check.late", "def run():\n    from planner_service.solve import x", True),
        ("planner_service.check.late", "from planner_service.reports import tables", True),
        ("planner_service.check.late", "from planner_service.validate import validator", False),
        ("planner_service.reports.late", "from planner_service.check import what_if", False),
        ("planner_service.reports.late", "from planner_service.solve import explain", True),
        ("clients.cli.late", "from planner_service.check import report", False),
        ("clients.http.late", "from planner_service.check import report", True),
        ("clients.http.late", "from planner_service.reports import tables", True),
    ],
)
def test_rules(module, source, broken):
    assert bool(violations(module, "late.py", source)) == broken


# --------------------------------------------------------------------------- import cycles

# Import cycles between first-party modules that other engineers are removing now, each as
# the set of modules in it (e.g. frozenset({"pkg.a", "pkg.b"})); an entry fails the test
# once its cycle is gone, so that the list only shrinks. Empty: issue 33 also names
# runtime/kernels.py -> runtime/sharding/layout.py -> ... -> kernels.py and
# service/routes/plans.py -> routes/solves.py (both being removed elsewhere), but neither is
# a cycle of ``import_graph``: the first closes only through the ``runtime`` package's
# __init__, which Python runs before any module of the package (a package's __init__
# re-exporting its modules is not a cycle), and the second is one-way.
ALLOWED_CYCLES: frozenset[frozenset[str]] = frozenset()


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, dict[str, Import]]:
    """For each module (name -> (source, is a package)), the first-party modules importing
    it runs, each with the statement that does: those it names (inside functions and under
    TYPE_CHECKING too), and the packages above them that it is not inside itself (their
    __init__ runs first; its own packages' already ran)."""
    graph: dict[str, dict[str, Import]] = {}
    for module, (source, is_package) in sources.items():
        edges = graph.setdefault(module, {})
        for found in imports(module, source, is_package):
            for target in (*_packages_above(found.name, module), found.name):
                if target in sources and target != module:
                    edges.setdefault(target, found)
    return graph


def _packages_above(name: str, importer: str) -> list[str]:
    parts = name.split(".")
    above = (".".join(parts[:end]) for end in range(1, len(parts)))
    return [package for package in above if not under(importer, package)]


def cycles(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Every set of modules that import each other (directly or through others), each as
    one cycle through its first module: the strongly connected components of more than
    one module, found by comparing what each module reaches (the graph is small)."""
    reach = {module: _reachable(graph, module) for module in graph}
    components = {
        frozenset(other for other in reach[module] if module in reach[other])
        for module in graph
        if module in reach[module]
    }
    return sorted(_cycle_through(graph, sorted(component)) for component in components)


def _reachable(graph: dict[str, dict[str, Import]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph.get(todo.pop(), {}):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _cycle_through(graph: dict[str, dict[str, Import]], component: list[str]) -> list[str]:
    """A shortest cycle from the component's first module back to it, breadth first."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    todo = [start]
    while todo:
        module = todo.pop(0)
        for target in graph[module]:
            if target == start:
                return [*paths[module], start]
            if target in members and target not in paths:
                paths[target] = [*paths[module], target]
                todo.append(target)
    raise AssertionError(f"{start} is in no cycle of {component}")


def describe(graph: dict[str, dict[str, Import]], cycle: list[str]) -> str:
    steps = [
        f"  {module}:{graph[module][target].line} `{graph[module][target].text}`"
        f"{' inside a function' if graph[module][target].in_function else ''}"
        for module, target in zip(cycle, cycle[1:], strict=False)
    ]
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


def test_no_first_party_module_imports_itself_through_others():
    """A cycle makes one of its modules run while another is half-imported (types.py
    imported codec inside a validator until issue 33): share what both need in a module
    that both import instead. Imports inside functions count."""
    sources = {module: (path.read_text(), path.name == "__init__.py") for module, path in modules()}
    graph = import_graph(sources)
    found = cycles(graph)
    unexpected = [cycle for cycle in found if frozenset(cycle) not in ALLOWED_CYCLES]
    assert not unexpected, "import cycles:\n" + "\n".join(describe(graph, c) for c in unexpected)
    gone = ALLOWED_CYCLES - {frozenset(cycle) for cycle in found}
    assert not gone, (
        f"no longer cycles: remove them from ALLOWED_CYCLES: {sorted(map(sorted, gone))}"
    )


def _graph(**sources: str) -> dict[str, dict[str, Import]]:
    """A graph of made-up modules ``pkg.<name>`` (``pkg`` its package's __init__)."""
    named = {("pkg" if name == "init" else f"pkg.{name}"): text for name, text in sources.items()}
    return import_graph({module: (text, module == "pkg") for module, text in named.items()})


def test_a_cycle_through_an_import_inside_a_function_is_found_and_described():
    graph = _graph(
        a="from pkg.b import x\n",
        b="import pkg.c\n",
        c="def late():\n    from pkg.a import y\n",
    )
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert describe(graph, cycles(graph)[0]).splitlines() == [
        "pkg.a -> pkg.b -> pkg.c -> pkg.a",
        "  pkg.a:1 `from pkg.b import x`",
        "  pkg.b:1 `import pkg.c`",
        "  pkg.c:2 `from pkg.a import y` inside a function",
    ]


def test_a_package_init_that_imports_its_modules_is_no_cycle_for_them():
    graph = _graph(init="from pkg.a import x\n", a="from pkg.b import y\n", b="x = 1\n")
    assert cycles(graph) == []
    # ... but a module that names its package's __init__ explicitly closes one
    looped = _graph(init="from pkg.a import x\n", a="import pkg\n")
    assert cycles(looped) == [["pkg", "pkg.a", "pkg"]]


# ---- private names stay in their module

# Production modules that take another module's private (``_``-prefixed) name, each as
# (importing module, the name as "module.name"), with a comment saying why it is tolerated
# for now. Tests may import private names; production code asks the owner for a public one.
PRIVATE_IMPORTS_ALLOWED: frozenset[tuple[str, str]] = frozenset()


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(module: str, source: str, is_package: bool = False) -> Iterator[Import]:
    """Every private name ``module`` takes from a first-party module it is not part of:
    ``from m import _name``, a private module imported by path, or ``alias._name`` on a
    module it imported. A private name belongs to what precedes it (``a.b._c``: ``a.b``),
    and only ``a.b`` and the modules under it may use it."""
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # local name -> the first-party module it is bound to
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            found += named_by_statement(node, package, bound)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = module_named(node.value, bound)
            if owner is not None:
                found.append(Import(f"{owner}.{node.attr}", node.lineno, ast.unparse(node), False))
    return (hit for hit in found if not under(module, private_owner(hit.name)))


def private_owner(name: str) -> str:
    """What a name's first private part belongs to: ``a.b._c.d`` -> ``a.b`` (``a.b.c``, with
    no private part: itself)."""
    parts = name.split(".")
    first = next((i for i, part in enumerate(parts) if is_private(part)), len(parts))
    return ".".join(parts[:first])


def named_by_statement(
    node: ast.Import | ast.ImportFrom, package: str, bound: dict[str, str]
) -> list[Import]:
    """The first-party names with a private part that one import statement takes; records
    the modules it binds in ``bound``."""
    text = ast.unparse(node)
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
        for alias in node.names:
            top = alias.name.partition(".")[0]
            if top in PACKAGES:
                bound[alias.asname or top] = alias.name if alias.asname else top
    else:
        base = from_base(node, package)
        names = [f"{base}.{alias.name}" for alias in node.names]
        for alias, name in zip(node.names, names, strict=True):
            if is_first_party_module(name):
                bound[alias.asname or alias.name] = name
    return [
        Import(name, node.lineno, text, False)
        for name in names
        if name.partition(".")[0] in PACKAGES and private_owner(name) != name
    ]


def module_named(node: ast.expr, bound: Mapping[str, str]) -> str | None:
    """The first-party module an expression names (``codec``, ``planner_service.plan``)."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = module_named(node.value, bound)
        name = f"{owner}.{node.attr}"
        return name if owner is not None and is_first_party_module(name) else None
    return None


def test_no_module_takes_another_modules_private_name():
    """What another module needs gets a public name and a documented role in its module
    (``runtime.sharding.module.ShardedTables``, used by checkpoints and resharding)."""
    found, allowed_seen = [], set()
    for module, path in modules():
        relative = path.relative_to(ROOT)
        for hit in private_imports(module, path.read_text(), path.name == "__init__.py"):
            if (module, hit.name) in PRIVATE_IMPORTS_ALLOWED:
                allowed_seen.add((module, hit.name))
                continue
            found.append(
                f"{relative}:{hit.line}: {module} takes the private {hit.name} (`{hit.text}`): "
                f"give it a public name in {private_owner(hit.name)}, or a public function "
                "that does what is needed"
            )
    assert not found, "private names imported:\n" + "\n".join(found)
    stale = sorted(PRIVATE_IMPORTS_ALLOWED - allowed_seen)
    assert not stale, f"PRIVATE_IMPORTS_ALLOWED lists imports that are gone: {stale}"


@pytest.mark.parametrize(
    ("module", "source", "taken"),
    [
        ("runtime.checkpoint", "from runtime.sharding.module import _ShardedTables", True),
        ("runtime.checkpoint", "from runtime.sharding.module import ShardedTables", False),
        ("runtime.checkpoint", "from .sharding.module import ShardedTables as _Tables", False),
        (
            "runtime.reshard",
            "def f():\n    from runtime.sharding import module\n    return module._sharded",
            True,
        ),
        (
            "runtime.reshard",
            "import runtime.sharding.module\nruntime.sharding.module._sharded",
            True,
        ),
        ("runtime.reshard", "import runtime.sharding.module as m\nm._sharded(1)", True),
        ("runtime.reshard", "from runtime.sharding import _helpers", True),
        ("runtime.sharding.module", "from runtime.sharding._helpers import f", False),
        ("runtime.sharding.module", "from ._helpers import f", False),
        ("runtime.sharding", "from runtime.sharding.module import _sharded", True),
        ("runtime.reshard", "import torch\ntorch._C", False),
        ("runtime.reshard", "self._tables", False),
        ("runtime.reshard", "from planner_service import __version__", False),
    ],
)
def test_private_names(module, source, taken):
    is_package = module == "runtime.sharding"
    assert bool(list(private_imports(module, source, is_package))) == taken


# ---- no import loops

# Packages whose modules import one another without a loop, at every level: among the
# modules of one package, and among a package's modules and subpackages, each subpackage
# taken whole (``runtime.kernels`` importing ``runtime.sharding.layout`` while
# ``runtime.sharding.module`` imports ``runtime.kernels`` is a loop between runtime.kernels
# and runtime.sharding, though no single module is on both ends).
# The planner's stages cannot loop between each other (RULES forbid every back-edge), so
# each stage is checked inside. planner_service.service is not yet: solver/jobs.py takes the
# whole ServiceState while state.py builds the SolvePool (solver <-> state); the jobs
# should take the parts of the state they use.
ACYCLIC = (
    "runtime",
    "clients",
    "planner_service.plan",
    "planner_service.costs",
    "planner_service.solve",
    "planner_service.validate",
    "planner_service.check",
    "planner_service.reports",
)


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    where: str  # path:line `statement`


def import_edges(package: str) -> list[Edge]:
    """Every import (module level, in functions, for type checking) from a module of
    ``package`` to another of its modules."""
    edges = []
    for module, path in modules():
        if not under(module, package):
            continue
        relative = path.relative_to(ROOT)
        for found in imports(module, path.read_text(), path.name == "__init__.py"):
            if under(found.name, package) and found.name != module:
                edges.append(Edge(module, found.name, f"{relative}:{found.line} `{found.text}`"))
    return edges


def part_of(module: str, level: str) -> str | None:
    """The module or subpackage of package ``level`` that holds ``module`` (``level`` for its
    own ``__init__``), or None outside it."""
    if not under(module, level):
        return None
    return ".".join(module.split(".")[: len(level.split(".")) + 1])


def import_loops(edges: Sequence[Edge]) -> list[str]:
    """A loop per package level that has one, each edge with the import that makes it."""
    names = {edge.importer for edge in edges} | {edge.imported for edge in edges}
    levels = sorted({name.rpartition(".")[0] for name in names} - {""})
    loops = []
    for level in levels:
        graph: dict[str, dict[str, Edge]] = {}
        for edge in edges:
            start, end = part_of(edge.importer, level), part_of(edge.imported, level)
            if start is not None and end is not None and start != end:
                graph.setdefault(start, {}).setdefault(end, edge)
        loop = first_loop(graph)
        if loop:
            steps = [graph[a][b] for a, b in zip(loop, loop[1:], strict=False)]
            path = " -> ".join(loop)
            loops.append(f"{level}: {path}, by " + "; ".join(step.where for step in steps))
    return loops


def first_loop(graph: Mapping[str, Mapping[str, Edge]]) -> list[str]:
    """A cycle of ``graph`` as its nodes, the first repeated at the end; [] when none."""
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> list[str]:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return []
        for nxt in sorted(graph.get(node, {})):
            loop = walk(nxt, [*path, node])
            if loop:
                return loop
        done.add(node)
        return []

    for start in sorted(graph):
        loop = walk(start, [])
        if loop:
            return loop
    return []


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_import_loop(package):
    edges = import_edges(package)
    assert edges  # the package was scanned
    loops = import_loops(edges)
    assert not loops, "import loops:\n" + "\n".join(loops)


def test_a_loop_names_its_level_its_modules_and_the_imports():
    """The loop issue 33 removed: the kernels took their key from the layouts, and the
    sharded module imports the kernels."""
    edges = [
        Edge("runtime.kernels", "runtime.sharding.layout", "runtime/kernels.py:46 `k`"),
        Edge("runtime.sharding.module", "runtime.kernels", "runtime/sharding/module.py:32 `m`"),
        Edge("runtime.sharding.module", "runtime.sharding.layout", "runtime/sharding/module.py:50"),
        Edge("runtime", "runtime.kernels", "runtime/__init__.py:1"),
    ]
    assert import_loops(edges) == [
        "runtime: runtime.kernels -> runtime.sharding -> runtime.kernels, by "
        "runtime/kernels.py:46 `k`; runtime/sharding/module.py:32 `m`"
    ]
    within = [
        Edge("runtime.sharding.a", "runtime.sharding.b", "a"),
        Edge("runtime.sharding.b", "runtime.sharding.a", "b"),
    ]
    assert import_loops(within) == [
        "runtime.sharding: runtime.sharding.a -> runtime.sharding.b -> runtime.sharding.a, by a; b"
    ]
    assert import_loops(edges[1:]) == []


def test_the_vocabulary_and_the_clients_load_no_solver_service_or_torch():
    """What a training worker (plan, costs, validate, the HTTP client), a CLI user (the
    check's analysis and reports included) or a TorchRec user building a request
    (clients.torchrec) loads on import."""
    script = textwrap.dedent(
        """
        import importlib, pkgutil, sys
        import planner_service.plan, planner_service.costs, planner_service.validate
        import planner_service.check, planner_service.reports
        packages = (
            planner_service.plan, planner_service.costs, planner_service.validate,
            planner_service.check, planner_service.reports,
        )
        for package in packages:
            for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                importlib.import_module(info.name)
        import clients.cli, clients.http, clients.torchrec
        heavy = (
            "ortools", "fastapi", "uvicorn", "starlette", "psycopg", "torch", "fbgemm_gpu",
            "torchrec",
        )
        print(" ".join(sorted(name for name in sys.modules if name.partition(".")[0] in heavy)))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == []


def _loaded_by(argv: list[str]) -> set[str]:
    """The modules ``shardplan *argv`` loads, run in a fresh interpreter."""
    script = textwrap.dedent(
        f"""
        import sys
        from clients.cli import main
        try:
            main({argv!r})
        except SystemExit:
            pass
        print(" ".join(sorted(sys.modules)))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def test_version_and_help_load_no_library_and_no_planner_module():
    """The parser is built from every command module, so their tops stay light: what a
    command runs with is imported inside its run (clients/cli/__init__.py, "Start-up")."""
    for argv in (
        ["--version"],
        ["--help"],
        ["diff", "--help"],
        ["migrate", "--help"],
        ["plan", "--help"],
        ["fetch", "-h"],
    ):
        loaded = _loaded_by(argv)
        ours = {name for name in loaded if under(name, "planner_service")}
        assert ours == {"planner_service"}, argv  # the version only
        libraries = {name.partition(".")[0] for name in loaded} & (CORE | {"httpx", "ortools"})
        assert not libraries, argv


def test_diff_migrate_and_validate_load_no_solver_service_or_numpy(tmp_path):
    missing = str(tmp_path / "missing.json")
    heavy = {"ortools", "fastapi", "uvicorn", "starlette", "torch", "numpy", "httpx"}
    commands = (["diff", missing, missing], ["migrate", missing, missing])
    for argv in (*commands, ["validate", missing, missing]):
        loaded = {name.partition(".")[0] for name in _loaded_by(argv)}
        assert "pydantic" in loaded  # it ran as far as reading the files
        assert not loaded & heavy, argv


def test_fetch_loads_httpx_but_no_solver_service_or_numpy():
    down = ["fetch", "a" * 64, "--server", "http://127.0.0.1:1", "--retries", "0"]
    loaded = {name.partition(".")[0] for name in _loaded_by(down)}
    assert {"httpx", "pydantic"} <= loaded  # it ran as far as asking the service
    assert not loaded & {"ortools", "fastapi", "uvicorn", "starlette", "torch", "numpy"}


def test_fetch_of_a_cached_plan_opens_no_client(tmp_path):
    """A launch script's ``shardplan fetch ID --cache-dir`` answers from the verified file
    without importing httpx (the client would answer from the same file)."""
    plan = json.loads((ROOT / "examples" / "plan.json").read_text())
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / f"{plan['plan_id']}.json").write_text(json.dumps(plan))
    output = tmp_path / "plan.json"
    down = ["--server", "http://127.0.0.1:1", "--retries", "0", "--cache-dir", str(tmp_path)]
    loaded = _loaded_by(["fetch", plan["plan_id"], *down, "-o", str(output)])
    assert json.loads(output.read_bytes()) == plan  # served from the cache: nothing listens
    assert not {name.partition(".")[0] for name in loaded} & {"httpx", "numpy", "ortools"}
