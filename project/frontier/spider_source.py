"""A spider's ``redis_key`` read from the project's source, without importing a spider.

``fleetcrawl status`` and the dashboard need one thing of a spider's class: the ``redis_key``
its nodes take seeds from. Scrapy's spider loader imports every module of SPIDER_MODULES to
find it, and with them the items, the rendering middleware and whatever the spiders import
(0.25 s of the 1.3 s ``fleetcrawl status`` took). Most spiders say it in their source: a class
whose ``name`` is a string, a ``redis_key`` string (or none), on bases from Scrapy or
scrapy-redis, or on classes whose source says the same. :func:`redis_key_in_source` reads
that with :mod:`ast`; anything it cannot be sure of (a name or key computed, a base it cannot
read, two classes of the name) is :data:`UNSURE`, and the caller asks Scrapy's loader.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Final

__all__ = ["UNSURE", "redis_key_in_source"]

#: The source does not tell for sure: ask Scrapy's spider loader.
UNSURE: Final = "\0unsure"
#: Packages whose spider classes set no ``redis_key`` of their own (scrapy-redis' is None).
_LIBRARIES = frozenset({"scrapy", "scrapy_redis"})
_MOST_FILES = 500
_MOST_DEPTH = 8


class _Unsure(Exception):
    pass


def redis_key_in_source(spider_modules: list[str], name: str) -> str | None:
    """The ``redis_key`` of the spider called *name* (None: it names none), or UNSURE."""
    try:
        modules = [_Module(path) for path in _module_files(spider_modules)]
        found = []
        for module in modules:
            for cls in module.classes.values():
                _plain_class(module, cls)  # else its name may be any spider's
                if _spider_name(cls) == name:
                    found.append((module, cls))
        if len(found) != 1:
            return UNSURE
        ((module, cls),) = found
        # a subclass inherits the name: Scrapy's loader may find it instead (the last wins)
        for other in modules:
            for sub in other.classes.values():
                if any((_dotted(b) or "").rpartition(".")[2] == cls.name for b in sub.bases):
                    return UNSURE
        return _redis_key(module, cls, 0)
    except (_Unsure, OSError, SyntaxError, ValueError, ImportError):
        return UNSURE


def _module_files(spider_modules: list[str]) -> list[Path]:
    """The source files Scrapy's ``walk_modules`` would import for SPIDER_MODULES."""
    files: list[Path] = []
    for dotted in spider_modules:
        path = _source_of(dotted)
        files += _package_files(path.parent) if path.name == "__init__.py" else [path]
        if len(files) > _MOST_FILES:
            raise _Unsure
    return files


def _package_files(folder: Path) -> list[Path]:
    """The modules of a package and of its subpackages (folders with an ``__init__.py``)."""
    files = sorted(folder.glob("*.py"))
    for sub in sorted(folder.iterdir()):
        if sub.is_dir() and (sub / "__init__.py").is_file():
            files += _package_files(sub)
    return files


def _source_of(dotted: str) -> Path:
    """The source file of module *dotted*, found without importing it or its packages."""
    top, *rest = dotted.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise _Unsure
    path = Path(spec.origin)
    if not rest:
        return path
    if path.name != "__init__.py":
        raise _Unsure
    base = path.parent.joinpath(*rest)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise _Unsure


class _Module:
    """One parsed source file: its top-level classes and the names it imports."""

    def __init__(self, path: Path) -> None:
        self.path = path
        tree = ast.parse(path.read_bytes(), str(path))
        self.classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        self.imports: dict[str, str] = {}  # local name -> dotted origin
        package = self._package(path)
        if not all(_plain_module_statement(node) for node in tree.body):
            raise _Unsure  # a class made or changed at import time in ways not read here
        for node in tree.body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.imports[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
            elif isinstance(node, ast.ImportFrom):
                origin = node.module or ""
                if node.level:
                    parts = package.split(".") if package else []
                    if node.level - 1 > len(parts):
                        continue
                    parts = parts[: len(parts) - (node.level - 1)]
                    origin = ".".join([*parts, *([origin] if origin else [])])
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = f"{origin}.{alias.name}"

    @staticmethod
    def _package(path: Path) -> str:
        """The dotted package of *path*, from the ``__init__.py`` files above it."""
        parts: list[str] = []
        folder = path.parent
        while (folder / "__init__.py").is_file():
            parts.insert(0, folder.name)
            folder = folder.parent
        return ".".join(parts)


def _spider_name(cls: ast.ClassDef) -> str | None:
    """The string *cls* sets ``name`` to in its body (None: it sets none)."""
    value = _assigned(cls, "name")
    if value is None:
        return None
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return value.value
    raise _Unsure  # a computed name may be any spider's


#: What a module may do at its top level for its classes to be read from the source.
_PLAIN_MODULE = (
    ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Expr,
    ast.Pass, ast.Assign, ast.AnnAssign, ast.If,
)  # fmt: skip
#: What a class body may hold: assignments to names, methods, a docstring.
_PLAIN_BODY = (ast.Assign, ast.AnnAssign, ast.FunctionDef, ast.AsyncFunctionDef, ast.Expr, ast.Pass)
#: Methods that may set a class attribute of a class or of its subclasses.
_HOOKS = frozenset({"__init_subclass__", "__new__", "__class_getitem__", "__set_name__"})
#: Packages whose class decorators set no class attribute but from the body's own.
_HARMLESS_DECORATORS = frozenset({"dataclasses", "attr", "attrs", "functools", "typing"})


def _plain_module_statement(node: ast.stmt) -> bool:
    """A top-level statement that cannot set a class attribute: no ``S.redis_key = ...``, no
    ``setattr``, no class defined under a condition (``if TYPE_CHECKING:`` imports are fine)."""
    if not isinstance(node, _PLAIN_MODULE):
        return False
    if isinstance(node, ast.If):
        return all(isinstance(n, ast.Import | ast.ImportFrom | ast.Pass) for n in node.body) and (
            not node.orelse
        )
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return all(isinstance(t, ast.Name) for t in targets)
    if isinstance(node, ast.Expr):
        return not any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setattr"
            for n in ast.walk(node)
        )
    return True


def _plain_class(module: _Module, cls: ast.ClassDef) -> None:
    """Raise _Unsure unless *cls*'s attributes are what its body assigns: no decorator but
    the standard library's or attrs' (``@dataclass``), no metaclass or keyword, and a body of
    plain assignments to names and methods (no ``if``, ``for``, ``+=``, hook)."""
    if cls.keywords:
        raise _Unsure
    for decorator in cls.decorator_list:
        called = decorator.func if isinstance(decorator, ast.Call) else decorator
        dotted = _dotted(called) or ""
        head, _, tail = dotted.partition(".")
        origin = module.imports.get(head, "")
        full = f"{origin}.{tail}" if tail else origin
        if full.split(".")[0] not in _HARMLESS_DECORATORS:
            raise _Unsure
    for node in cls.body:
        if not isinstance(node, _PLAIN_BODY):
            raise _Unsure
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in _HOOKS:
            raise _Unsure
        if isinstance(node, ast.Assign) and not all(isinstance(t, ast.Name) for t in node.targets):
            raise _Unsure
        if isinstance(node, ast.AnnAssign) and not isinstance(node.target, ast.Name):
            raise _Unsure


def _assigned(cls: ast.ClassDef, attribute: str) -> ast.expr | None:
    """The value *cls*'s body assigns to *attribute* last, if it does."""
    value = None
    for node in cls.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == attribute for t in targets):
            value = node.value
    return value


def _redis_key(module: _Module, cls: ast.ClassDef, depth: int) -> str | None:
    """*cls*'s ``redis_key``: its own, else its bases' (the first base that sets one)."""
    if depth > _MOST_DEPTH or len(cls.bases) > 1:
        raise _Unsure  # the order of several bases is Python's C3
    _plain_class(module, cls)
    value = _assigned(cls, "redis_key")
    if value is not None:
        if isinstance(value, ast.Constant) and (
            value.value is None or isinstance(value.value, str)
        ):
            return value.value
        raise _Unsure
    for base in cls.bases:
        found = _base_key(module, base, depth)
        if found is not None:
            return found
    return None


def _base_key(module: _Module, base: ast.expr, depth: int) -> str | None:
    dotted = _dotted(base)
    if dotted is None:
        raise _Unsure
    head, _, tail = dotted.partition(".")
    if not tail and head in module.classes:
        return _redis_key(module, module.classes[head], depth + 1)
    if head in {"object", "Generic"} and not tail:
        return None
    origin = module.imports.get(head)
    if origin is None:
        raise _Unsure
    full = f"{origin}.{tail}" if tail else origin
    if full.split(".")[0] in _LIBRARIES:
        return None
    where, _, name = full.rpartition(".")
    other = _Module(_source_of(where))
    if name not in other.classes:
        raise _Unsure  # re-exported, or not a class of that module
    return _redis_key(other, other.classes[name], depth + 1)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    if isinstance(node, ast.Subscript):  # Generic[T], RedisSpider[...]
        return _dotted(node.value)
    return None
