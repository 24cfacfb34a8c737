"""What project/rendering/handler.py needs from scrapy-playwright's private download path,
checked on the installed release: when a release changes it, this fails and says what to do."""

from __future__ import annotations

import ast
import inspect
import textwrap
import tomllib
from importlib.metadata import version

from packaging.requirements import Requirement
from scrapy_playwright.handler import ScrapyPlaywrightDownloadHandler

from project.rendering.handler import BoundedPlaywrightHandler
from tests.fleet import ROOT

_METHOD = "_download_request_with_page"
_SIGNATURE = "async def _download_request_with_page(self, request, page, spider) -> Response"
_HINT = (
    f"scrapy-playwright {version('scrapy-playwright')} changed"
    f" ScrapyPlaywrightDownloadHandler.{_METHOD}, which BoundedPlaywrightHandler"
    f" (project/rendering/handler.py) overrides to bound every render. It expects"
    f" `{_SIGNATURE}`, called once per render by the handler's download path inside a"
    " `try` whose `except` closes the page (unless playwright_include_page) and re-raises."
    " Read the new scrapy_playwright/handler.py, adapt the override so a render still ends at"
    " PLAYWRIGHT_RENDER_TIMEOUT and frees its page (tests/test_rendering_hostile.py proves"
    " it), then move the scrapy-playwright bound in pyproject.toml and its pin in"
    " constraints.txt."
)


def _library_class() -> ast.ClassDef:
    tree = ast.parse(textwrap.dedent(inspect.getsource(ScrapyPlaywrightDownloadHandler)))
    found = tree.body[0]
    assert isinstance(found, ast.ClassDef)
    return found


def _calls_of_the_method(function: ast.AST) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == _METHOD
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    ]


def test_the_overridden_method_keeps_its_signature() -> None:
    method = getattr(ScrapyPlaywrightDownloadHandler, _METHOD, None)
    assert method is not None, _HINT
    found = inspect.signature(method)
    hint = f"{_HINT} Found: {found}."
    assert inspect.iscoroutinefunction(method), hint
    expected = [
        (name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for name in ("self", "request", "page", "spider")
    ]
    assert [(p.name, p.kind) for p in found.parameters.values()] == expected, hint
    returned = found.return_annotation
    assert getattr(returned, "__name__", returned) == "Response", hint
    ours = inspect.signature(BoundedPlaywrightHandler._download_request_with_page)
    assert [(p.name, p.kind) for p in ours.parameters.values()] == expected


def test_the_download_path_calls_it_and_closes_the_page_when_it_raises() -> None:
    """The override raises on a render past its bound; the caller must free the page."""
    callers = [
        function
        for function in _library_class().body
        if isinstance(function, ast.AsyncFunctionDef)
        and function.name != _METHOD
        and _calls_of_the_method(function)
    ]
    assert len(callers) == 1, _HINT
    guarded = [
        node
        for node in ast.walk(callers[0])
        if isinstance(node, ast.Try) and any(_calls_of_the_method(n) for n in node.body)
    ]
    assert guarded, _HINT
    call = _calls_of_the_method(guarded[0])[0]
    assert [ast.unparse(arg) for arg in call.args] == ["request", "page", "spider"], _HINT
    handlers = " ".join(ast.unparse(handler) for handler in guarded[0].handlers)
    assert "except Exception" in handlers, _HINT
    assert "await page.close()" in handlers, _HINT
    assert "playwright_include_page" in handlers, _HINT
    assert handlers.rstrip().endswith("raise"), _HINT


def test_the_method_closes_the_page_of_a_render_that_ends() -> None:
    """On success the library closes the page itself: the override adds no close of its own."""
    method = next(
        node
        for node in _library_class().body
        if isinstance(node, ast.AsyncFunctionDef) and node.name == _METHOD
    )
    source = ast.unparse(method)
    assert "await page.close()" in source, _HINT
    assert "playwright_include_page" in source, _HINT


def test_the_handler_is_built_from_the_crawler_alone() -> None:
    """BoundedPlaywrightHandler.__init__(crawler) calls the library's with the crawler."""
    parameters = list(inspect.signature(ScrapyPlaywrightDownloadHandler.__init__).parameters)
    assert parameters == ["self", "crawler"], _HINT


def test_the_handler_built_after_the_engine_started_is_launched_as_the_signal_would() -> None:
    """project/rendering/download.py builds the handler at the first render, after
    engine_started, and calls what scrapy-playwright connects to it: an awaitable method that
    takes nothing and starts the browser provider."""
    method = getattr(ScrapyPlaywrightDownloadHandler, "_maybe_launch_in_thread", None)
    assert method is not None, _HINT
    assert inspect.iscoroutinefunction(method), _HINT
    assert list(inspect.signature(method).parameters) == ["self"], _HINT
    source = textwrap.dedent(inspect.getsource(ScrapyPlaywrightDownloadHandler.__init__))
    assert "_maybe_launch_in_thread, signals.engine_started" in source, _HINT


def test_the_pin_covers_only_the_release_these_checks_passed_on() -> None:
    """pyproject.toml bounds scrapy-playwright above: a new release waits for this file."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (requirement,) = [
        Requirement(spec)
        for spec in project["dependencies"]
        if Requirement(spec).name == "scrapy-playwright"
    ]
    assert any(s.operator in ("<", "<=", "==", "~=") for s in requirement.specifier), (
        "scrapy-playwright needs an upper bound in pyproject.toml: " + _HINT
    )
    assert requirement.specifier.contains(version("scrapy-playwright")), _HINT
    pinned = [
        line.split("==", 1)[1].strip()
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line.startswith("scrapy-playwright==")
    ]
    assert pinned == [version("scrapy-playwright")], "constraints.txt pins another release"
