"""The tree shows the architecture: crawler nodes never load the operations tooling,
every setting has one documented default, and no document points at a missing file."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import project
from project.config import setting_fields
from tests.fleet import ROOT

RUNTIME = ("project", "spiders", "pipelines")


def _modules(package: str) -> list[str]:
    root = importlib.import_module(package)
    return [package] + [
        info.name for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}.")
    ]


def _runtime_modules() -> list[str]:
    return [m for pkg in RUNTIME for m in _modules(pkg) if not m.startswith("project.ops")]


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


# -- nodes and operations -----------------------------------------------------------------------


def test_no_runtime_module_imports_the_operations_tooling() -> None:
    offenders = {}
    for package in RUNTIME:
        for path in (ROOT / package).rglob("*.py"):
            if path.is_relative_to(ROOT / "project" / "ops"):
                continue
            bad = {name for name in _imports(path) if name.startswith(("project.ops", "tests"))}
            if bad:
                offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}


def test_a_node_loads_no_operations_module() -> None:
    """Every component the add-on wires in, and every runtime module, in a fresh interpreter."""
    code = f"""
import importlib, sys
from scrapy.settings import Settings
from scrapy.utils.misc import load_object
from project.addon import FleetAddon
import project.settings
settings = Settings()
settings.setmodule(project.settings)
FleetAddon().update_settings(settings)
for name in ("SCHEDULER", "DUPEFILTER_CLASS"):
    load_object(settings[name])
for name in ("DOWNLOADER_MIDDLEWARES", "EXTENSIONS", "ITEM_PIPELINES"):
    for component in settings.getdict(name):
        load_object(component) if isinstance(component, str) else component
for handler in settings.getdict("DOWNLOAD_HANDLERS").values():
    if handler is not None:  # None: a scheme no node may fetch
        load_object(handler)
for module in {_runtime_modules()!r}:
    importlib.import_module(module)
loaded = sorted(m for m in sys.modules if m.startswith(("project.ops", "tests")))
print(loaded)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_runtime_packages_ship_without_development_tooling() -> None:
    """What a scrapyd egg carries: no services launcher in the runtime capabilities."""
    for capability in ("frontier", "rendering", "storage", "monitoring"):
        for path in (ROOT / "project" / capability).rglob("*.py"):
            text = path.read_text()
            assert "apt-get install" not in text or "apt-get install chromium" in text, path
            assert "go build" not in text, path


# -- imports run one way ------------------------------------------------------------------------
#
# Every import counts: at module level, inside a function (an import there that closes a circle
# is a cycle with a bandage) and under ``if TYPE_CHECKING:`` (a type-only import is still one
# module knowing another: mypy and the reader follow it). An import names the module it loads:
# ``from a.b import c`` is ``a.b.c`` when that is a module, else ``a.b``; the packages' own
# ``__init__`` that Python runs on the way are not counted.


@dataclasses.dataclass(frozen=True)
class _Edge:
    path: str  # the importing file, from the repository's root
    line: int
    where: str  # "", "in a function" or "under TYPE_CHECKING"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" + (f", {self.where}" if self.where else "")


def _module_paths(root: Path) -> dict[str, Path]:
    paths: dict[str, Path] = {}
    for package in RUNTIME:
        for path in sorted((root / package).rglob("*.py")):
            if path.is_relative_to(root / "project" / "templates"):
                continue  # copied into a new project by `scrapy startproject`: not ours
            parts = path.relative_to(root).with_suffix("").parts
            paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return paths


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _placed_imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of a module, with where it runs."""
    found: list[tuple[ast.Import | ast.ImportFrom, str]] = []
    stack: list[tuple[ast.AST, str]] = [(tree, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((node, where))
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack += [(child, where or "under TYPE_CHECKING") for child in node.body]
            stack += [(child, where) for child in node.orelse]
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            where = where or "in a function"
        stack += [(child, where) for child in ast.iter_child_nodes(node)]
    return found


def _targets(node: ast.Import | ast.ImportFrom, package: str, modules: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            parts = parts[: len(parts) - node.level + 1]
            base = ".".join([*parts, base] if base else parts)
        names = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
            for alias in node.names
        ]
    targets = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            targets.append(name)
    return targets


def _import_graph(root: Path) -> dict[str, dict[str, _Edge]]:
    """``module -> {module it imports: the first import that does}`` over our own modules."""
    paths = _module_paths(root)
    graph: dict[str, dict[str, _Edge]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, _Edge] = {}
        placed = sorted(_placed_imports(ast.parse(path.read_text())), key=lambda p: p[0].lineno)
        for node, where in placed:
            for target in _targets(node, package, set(paths)):
                if target != name and target not in edges:
                    edges[target] = _Edge(str(path.relative_to(root)), node.lineno, where)
        graph[name] = edges
    return graph


def _reach(graph: dict[str, dict[str, _Edge]], start: str) -> set[str]:
    seen, stack = {start}, [start]
    while stack:
        for target in graph[stack.pop()]:
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


def _cycles(graph: dict[str, dict[str, _Edge]]) -> list[list[str]]:
    """Every elementary cycle, once, from its first module in sorted order."""
    reach = {name: _reach(graph, name) for name in graph}
    found: list[list[str]] = []
    for start in sorted(graph):
        # only modules on a circle through start: the walk stays inside its component
        circle = {name for name in reach[start] if start in reach[name]}
        stack = [[start]]
        while stack:
            path = stack.pop()
            for target in sorted(graph[path[-1]], reverse=True):
                if target == start:
                    found.append(path)
                elif target > start and target in circle and target not in path:
                    stack.append([*path, target])
    return sorted(found)


def _describe(graph: dict[str, dict[str, _Edge]], cycles: list[list[str]]) -> str:
    lines = [f"{len(cycles)} import cycles:"]
    for cycle in cycles:
        steps = [cycle[0]]
        for here, there in zip(cycle, [*cycle[1:], cycle[0]], strict=True):
            steps.append(f"  -> {there}  ({graph[here][there]})")
        lines.append("\n".join(steps))
    return "\n".join(lines)


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = _import_graph(ROOT)
    cycles = _cycles(graph)
    assert cycles == [], _describe(graph, cycles)


def test_the_cycle_check_sees_imports_in_functions_and_under_type_checking(
    tmp_path: Path,
) -> None:
    """The check itself, on a tree of four modules with a circle of each kind."""
    package = tmp_path / "project"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from project import b\n")
    (package / "b.py").write_text("from project.a import f\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from project.d import X\n"
    )
    (package / "d.py").write_text("from . import c\nX = 1\n")
    graph = _import_graph(tmp_path)
    assert _cycles(graph) == [["project.a", "project.b"], ["project.c", "project.d"]]
    assert graph["project.a"]["project.b"] == _Edge("project/a.py", 2, "in a function")
    assert graph["project.c"]["project.d"].where == "under TYPE_CHECKING"
    assert "project/d.py:1" in _describe(graph, _cycles(graph))


#: The frontier's one way into storage/: its dead letters (requests it gave up on, not items)
#: go to MongoDB through the sink the scheduler owns.
_FRONTIER_STORAGE = {"project.storage.deadletters"}


def test_the_frontier_does_not_reach_into_the_item_store() -> None:
    """The store hears the frontier through project/frontier/signals.py, never the reverse."""
    graph = _import_graph(ROOT)
    reaching = sorted(
        f"{module} imports {target} ({edge})"
        for module, edges in graph.items()
        if module.startswith("project.frontier")
        for target, edge in edges.items()
        if target.startswith("project.storage") and target not in _FRONTIER_STORAGE
    )
    assert reaching == []


def test_the_frontiers_meta_keys_have_one_home() -> None:
    """project/frontier/meta.py names them; every other module imports the name."""
    home = ROOT / "project" / "frontier" / "meta.py"
    spelled = sorted(
        f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}"
        for package in RUNTIME
        for path in (ROOT / package).rglob("*.py")
        if path != home
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"_(frontier|fleet)_\w+", node.value)
    )
    assert spelled == []


# -- one home per default ----------------------------------------------------------------------


_ROW = re.compile(r"^\|\s*`([A-Z][A-Z0-9_]+)`\s*\|([^|\n]*)\|([^|\n]*)\|(.*)\|\s*$", re.MULTILINE)
_GETTERS = {"get", "getint", "getfloat", "getbool", "getlist", "getdict", "getpriority",
            "getwithbase", "setdefault", "setdefault_in_component_priority_dict"}  # fmt: skip


def _reference() -> dict[str, tuple[str, str]]:
    """``name -> (type, default)`` from every table of docs/settings.md."""
    text = (ROOT / "docs" / "settings.md").read_text()
    return {m[1]: (m[2].strip(), m[3].strip()) for m in _ROW.finditer(text)}


def _config_classes() -> list[type]:
    return [
        value
        for name in _runtime_modules()
        for value in vars(importlib.import_module(name)).values()
        if isinstance(value, type)
        and dataclasses.is_dataclass(value)
        and value.__module__ == name
        and setting_fields(value)
    ]


def _setting_defaults() -> dict[str, tuple[object, str | None]]:
    defaults: dict[str, tuple[object, str | None]] = {}
    for cls in _config_classes():
        for f, name, default in setting_fields(cls):
            assert name not in defaults, f"{name} has two homes"
            defaults[name] = (default, f.metadata["shown"])
    return defaults


def _read_by_code() -> set[str]:
    """Settings named as a string constant in a settings call anywhere in the runtime code."""
    names: set[str] = set()
    for package in RUNTIME:
        for path in (ROOT / package).rglob("*.py"):
            if path.is_relative_to(ROOT / "project" / "ops") or path.name == "settings.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _GETTERS
                    and "settings" in ast.unparse(node.func.value)
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                    and re.fullmatch(r"[A-Z][A-Z0-9_]+", node.args[0].value)
                ):
                    names.add(node.args[0].value)
                elif (
                    isinstance(node, ast.Subscript)
                    and isinstance(node.slice, ast.Constant)
                    and isinstance(node.slice.value, str)
                    and re.fullmatch(r"[A-Z][A-Z0-9_]+", node.slice.value)
                    and "settings" in ast.unparse(node.value)
                ):
                    names.add(node.slice.value)
    from project import addon

    names |= set(addon._SETTINGS)
    names |= {"DOWNLOADER_MIDDLEWARES", "SPIDER_MIDDLEWARES", "EXTENSIONS", "ITEM_PIPELINES"}
    return names | set(_setting_defaults())


def test_every_setting_the_code_reads_is_documented_and_nothing_else() -> None:
    documented, read = set(_reference()), _read_by_code()
    assert sorted(read - documented) == [], "read by the code, missing from docs/settings.md"
    assert sorted(documented - read) == [], "in docs/settings.md, read by no code"


def _literal(text: str) -> object:
    return ast.literal_eval(text.strip().strip("`"))


@pytest.mark.parametrize("name", sorted(_setting_defaults()))
def test_the_reference_gives_the_configs_default(name: str) -> None:
    default, shown = _setting_defaults()[name]
    _, cell = _reference()[name]
    if shown is not None:
        assert cell.strip("`") == shown
        return
    documented = _literal(cell)
    if isinstance(default, (tuple, frozenset)):
        default = list(default)
    assert documented == default, f"{name}: docs say {cell}, the code says {default!r}"


def _same_literal(node: ast.AST, value: object) -> bool:
    if not isinstance(node, ast.Constant) or isinstance(value, (list, dict, tuple, set)):
        return False
    if isinstance(value, float) and type(node.value) is int:
        return node.value == value
    return type(node.value) is type(value) and node.value == value


def _address(default: object) -> str | None:
    """``scheme://host:port`` of a default that is an address."""
    match = re.match(r"[a-z+]+://[^/]+", default) if isinstance(default, str) else None
    return match[0] if match else None


def _leaves(tree: ast.AST) -> list[ast.stmt]:
    """Statements that hold no other statements (an assignment, a return, a call)."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.stmt)
        and not any(isinstance(child, ast.stmt) for child in ast.iter_child_nodes(node))
    ]


def _beside_names(stmt: ast.stmt, names: set[str]) -> list[tuple[str, list[ast.expr]]]:
    """``(name, values beside it)`` for each setting name in *stmt*: the other arguments of
    the call it is an argument of, its value in a dict, the alternatives of its ``or``."""
    parents = {child: node for node in ast.walk(stmt) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(stmt):
        if not (isinstance(node, ast.Constant) and node.value in names):
            continue
        parent = parents.get(node)
        beside: list[ast.expr] = []
        if isinstance(parent, ast.Call):
            beside = [a for a in parent.args if a is not node] + [k.value for k in parent.keywords]
            grand = parents.get(parent)
            if isinstance(grand, ast.BoolOp):  # settings.get("NAME") or 32
                beside += [v for v in grand.values if v is not parent]
        elif isinstance(parent, ast.Dict):
            beside = [v for k, v in zip(parent.keys, parent.values, strict=True) if k is node]
        found.append((str(node.value), beside))
    return found


def _defaults_by_name_and_field() -> tuple[dict[str, object], dict[str, list[tuple[str, object]]]]:
    by_name: dict[str, object] = {}
    by_field: dict[str, list[tuple[str, object]]] = {}
    for cls in _config_classes():
        for f, name, default in setting_fields(cls):
            by_name[name] = default
            by_field.setdefault(f.name, []).append((name, default))
    return by_name, by_field


def _repeats(source: str, where: str) -> list[str]:
    """Literals in *source* that repeat a ``setting()`` default next to that setting.

    1. The setting's name (the string ``"FRONTIER_SITE_CONCURRENCY"``) with its default as a
       literal beside it: another argument of one call (``settings.getint(NAME, 32)``), its
       value in a dict (``{"RETRY_TIMES": 3}``), the fallback of an ``or``.
    2. A text default assigned to a name, field or keyword called like the Config field it is
       the default of (``redis_url: str = "redis://..."`` in another Config).
    3. The ``scheme://host:port`` of an address default in any literal but the default itself.

    The ``setting()`` call itself is the one home; a default named by a constant is no
    literal. Numbers are only compared beside their setting's name, so an unrelated 30.0
    (a Redis socket timeout) is never taken for ``MONGO_SOCKET_TIMEOUT``.
    """
    by_name, by_field = _defaults_by_name_and_field()
    addresses = {name: a for name, d in by_name.items() if (a := _address(d))}
    found = []
    for stmt in _leaves(ast.parse(source)):
        nodes = list(ast.walk(stmt))
        if any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setting"
            for n in nodes
        ):
            continue
        text = ast.unparse(stmt)[:80]
        for name, beside in _beside_names(stmt, set(by_name)):
            if any(_same_literal(n, by_name[name]) for n in beside):
                found.append(f"{where}:{stmt.lineno}: {name}'s default in {text}")
        assigned = [(k.arg, k.value) for n in nodes if isinstance(n, ast.Call) for k in n.keywords]
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            assigned.append((stmt.target.id, stmt.value))
        if isinstance(stmt, ast.Assign):
            assigned += [(t.id, stmt.value) for t in stmt.targets if isinstance(t, ast.Name)]
        for field_name, value in assigned:
            for name, default in by_field.get(field_name or "", []):
                if isinstance(default, str) and default and _same_literal(value, default):  # type: ignore[arg-type]
                    found.append(f"{where}:{stmt.lineno}: {name}'s default in {text}")
        for n in nodes:
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                for name, address in addresses.items():
                    if address in n.value and n.value != by_name[name]:
                        found.append(f"{where}:{n.lineno}: {name}'s address in {n.value!r}")
    return found


def _repeated_defaults() -> list[str]:
    sources = {
        str(path.relative_to(ROOT)): path.read_text()
        for package in RUNTIME
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    found = [line for where, source in sources.items() for line in _repeats(source, where)]
    # an address default's literal itself, once: a second copy is a second home
    for name, default in _defaults_by_name_and_field()[0].items():
        if _address(default):
            copies = [
                where
                for where, source in sources.items()
                for n in ast.walk(ast.parse(source))
                if isinstance(n, ast.Constant) and n.value == default
            ]
            if len(copies) > 1:
                found.append(f"{name}'s default {default!r} is written in {copies}")
    return found


@pytest.mark.parametrize(
    "source",
    [
        'caps = [settings.getint("FRONTIER_SITE_CONCURRENCY", 32)]',
        'rate = settings.getfloat("FRONTIER_SITE_RATE", default=0.0)',
        'batch = settings.get("MONGO_BATCH_SIZE") or 100',
        '_SETTINGS = {"ROBOTSTXT_OBEY": True, "RETRY_TIMES": 3}',
        'redis_url: str = "redis://127.0.0.1:6379/0"',
        'URL = "redis://127.0.0.1:6379"',
        'client = connect(uri="mongodb://127.0.0.1:27017/admin")',
    ],
)
def test_the_default_check_finds_a_repeated_default(source: str) -> None:
    assert len(_repeats(source, "snippet")) == 1


@pytest.mark.parametrize(
    "source",
    [
        'concurrency = settings.getint("FRONTIER_SITE_CONCURRENCY")',
        "client = redis.Redis(socket_timeout=30.0)",  # not MONGO_SOCKET_TIMEOUT
        '_SETTINGS = {"RETRY_TIMES": FLEET_RETRY_TIMES, "DOWNLOAD_MAXSIZE": 3}',
        'raise NotConfigured("FRONTIER_BATCH_MAX must be between 1 and 2000")',
        'hint = "put the database in REDIS_URL (redis://host:6379/N)"',
        'limit = settings.getint("FRONTIER_BATCH_MAX") or 1',
    ],
)
def test_the_default_check_leaves_other_literals_alone(source: str) -> None:
    assert _repeats(source, "snippet") == []


def test_no_code_repeats_a_settings_default() -> None:
    """Every default lives in its Config's ``setting()`` (or a constant it names), never twice."""
    assert _repeated_defaults() == []


#: The fleet's own prefixes, one per component (docs/settings.md, "Names").
_PREFIXES = ("FRONTIER_", "MONGO_", "VALIDATION_", "RUNS_", "PLAYWRIGHT_", "MONITOR_", "DASHBOARD_",
             "BLOCK_", "SESSION_", "PROXY_", "EXPORT_", "FLEET_FEEDS", "FLEET_STOP_",
             "FLEET_HEALTH_", "FLEET_AUTOTUNE")  # fmt: skip
#: Names of Scrapy, scrapy-redis and scrapy-playwright the Configs read as they are.
_LIBRARY_NAMES = re.compile(
    r"(REDIS_\w+|SCHEDULER_\w+|MAX_IDLE_TIME_BEFORE_CLOSE|DUPEFILTER_DEBUG|DOWNLOAD_SLOTS"
    r"|RETRY_(ENABLED|TIMES|HTTP_CODES|PRIORITY_ADJUST))"
)


def test_every_fleet_setting_carries_its_components_prefix() -> None:
    odd = [
        name
        for name in _setting_defaults()
        if not name.startswith(_PREFIXES) and not _LIBRARY_NAMES.fullmatch(name)
    ]
    assert odd == []


def test_the_reference_opens_with_the_essentials_then_tuning_then_internals() -> None:
    text = (ROOT / "docs" / "settings.md").read_text()
    tiers = re.findall(r"^## (Essentials|Tuning|Internals)$", text, re.MULTILINE)
    assert tiers == ["Essentials", "Tuning", "Internals"]
    first = re.search(r"^## .*$", text, re.MULTILINE)
    assert first is not None
    assert first[0] == "## Essentials"
    essentials = text.split("## Essentials", 1)[1].split("## Tuning", 1)[0]
    assert 0 < len(_ROW.findall(essentials)) <= 15
    names = [m[1] for m in _ROW.finditer(text)]
    assert len(names) == len(set(names)), "a setting documented twice"


def test_the_reference_lists_every_former_name() -> None:
    from project.frontier.compat import RENAMED, RETIRED

    text = (ROOT / "docs" / "settings.md").read_text()
    former = text.split("## Former names", 1)[1]
    for old, new in RENAMED.items():
        assert f"| `{old}` | `{new}` |" in former
    for old in RETIRED:
        assert f"- `{old}`:" in former
    assert not set(RENAMED) & set(_setting_defaults()), "a former name is a setting again"
    assert not set(RETIRED) & set(_setting_defaults()), "a retired name is a setting again"


def test_the_reference_lists_chromiums_flags() -> None:
    from project.rendering.config import RenderingConfig

    text = (ROOT / "docs" / "settings.md").read_text()
    assert all(f"`{flag}`" in text for flag in RenderingConfig().launch_options["args"])


def test_settings_py_keeps_only_what_a_project_owner_changes() -> None:
    import project.settings as module

    names = {n for n in vars(module) if n.isupper()}
    assert names <= {
        "BOT_NAME", "SPIDER_MODULES", "NEWSPIDER_MODULE", "ADDONS", "REDIS_URL", "MONGO_URI",
        "MONGO_DATABASE", "ROBOTSTXT_OBEY", "LOG_LEVEL", "FEED_EXPORT_ENCODING", "TEMPLATES_DIR",
        # secrets, read from the environment like REDIS_URL: a webhook carries its token
        "RUNS_WEBHOOK_URL", "RUNS_WEBHOOK_PROXY",
    }  # fmt: skip


# -- documents ------------------------------------------------------------------------------------

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_PATH = re.compile(r"(?<![\w/.-])((?:docs|deploy|project|tests|spiders|pipelines)/[\w./-]+\w)")


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("document", _documents(), ids=lambda p: p.name)
def test_every_link_and_path_in_a_document_exists(document: Path) -> None:
    text = document.read_text()
    missing = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (document.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            missing.append(target)
    missing += [
        target
        for target in _PATH.findall(text)
        if not (ROOT / target).exists() and not (ROOT / target.split(":")[0]).exists()
    ]
    assert missing == []


def test_code_mentions_only_documents_that_exist() -> None:
    missing = [
        f"{path.relative_to(ROOT)}: {target}"
        for package in RUNTIME
        for path in (ROOT / package).rglob("*.py")
        for target in re.findall(r"\bdocs/[\w./-]+\.md", path.read_text())
        if not (ROOT / target).exists()
    ]
    assert missing == []


def test_the_readme_stays_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 320


def test_project_package_is_one_folder_per_capability() -> None:
    top = sorted(
        p.name for p in Path(project.__file__).parent.iterdir() if not p.name.startswith("__")
    )
    assert top == [
        "addon.py", "blocking", "config.py", "dataout", "frontier", "items.py", "monitoring", "ops",
        "rendering", "runs", "schema.py", "settings.py", "storage", "templates", "utils.py",
    ]  # fmt: skip
