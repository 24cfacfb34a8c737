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


# -- one home per default ----------------------------------------------------------------------


_ROW = re.compile(r"^\|\s*`([A-Z][A-Z0-9_]+)`\s*\|([^|]*)\|([^|]*)\|(.*)\|\s*$", re.MULTILINE)
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
        "addon.py", "config.py", "frontier", "items.py", "monitoring", "ops", "rendering", "runs",
        "schema.py", "settings.py", "storage", "templates", "utils.py",
    ]  # fmt: skip
