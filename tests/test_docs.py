"""The documents say what the tree holds: docs/architecture.md's tree lists every package,
module and Lua script (each with its job) and nothing that is gone, and every link to a
heading of a document finds it.

The tree is the first fenced block under the heading ``## The tree`` of docs/architecture.md,
one entry a line::

    project/                  the Scrapy project package
      frontier/               the shared, leased request queue
        keys.py               every key of a spider

Two spaces of indent per level; a folder's name ends with ``/``; the job follows after at least
two spaces. Under ``project/``, ``spiders/`` and ``pipelines/`` every ``.py`` file but
``__init__.py``, every ``.lua`` file and every folder that holds one needs a line, but the files
of ``project/templates/`` (genspider's templates, copied into new projects, not modules); a
listed entry anywhere must exist.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: The folders whose every module and script the tree lists.
CHECKED = ("project", "spiders", "pipelines")
#: Folders whose files are data, not modules: only the folder itself is listed.
DATA = ("project/templates",)

_ENTRY = re.compile(r"^(?P<indent> *)(?P<name>\S+)(?: {2,}(?P<job>\S.*))?$")


class TreeFormatError(ValueError):
    """The tree block does not follow the documented format."""


def tree_block(text: str) -> tuple[int, list[str]]:
    """The tree's lines, and the line number in *text* of the first one."""
    section = re.search(r"^## The tree\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    if section is None:
        raise TreeFormatError("docs/architecture.md has no '## The tree' section")
    block = re.search(r"^```[^\n]*\n(.*?)^```", section[1], re.MULTILINE | re.DOTALL)
    if block is None:
        raise TreeFormatError("the '## The tree' section has no fenced block")
    first = text[: section.start(1) + block.start(1)].count("\n") + 1
    return first, block[1].splitlines()


def parse_tree(text: str) -> dict[str, tuple[int, str]]:
    """Each listed path (folders end with ``/``) -> (its line in the document, its job)."""
    first, lines = tree_block(text)
    entries: dict[str, tuple[int, str]] = {}
    parents: list[str] = []
    for number, line in enumerate(lines, first):
        match = _ENTRY.match(line)
        if match is None or len(match["indent"]) % 2:
            raise TreeFormatError(f"line {number}: not '<2n spaces><name>  <job>': {line!r}")
        depth = len(match["indent"]) // 2
        if depth > len(parents):
            raise TreeFormatError(f"line {number}: indented under no folder: {line!r}")
        del parents[depth:]
        path = "".join(parents) + match["name"]
        if path in entries:
            raise TreeFormatError(f"line {number}: {path} is listed twice")
        entries[path] = (number, (match["job"] or "").strip())
        if match["name"].endswith("/"):
            parents.append(match["name"])
    return entries


def expected_entries(root: Path = ROOT) -> set[str]:
    """What the tree must list: modules, Lua scripts and the folders that hold them."""
    found: set[str] = set()
    for top in CHECKED:
        for path in (root / top).rglob("*"):
            relative = path.relative_to(root).as_posix()
            if "__pycache__" in path.parts or path.suffix not in (".py", ".lua"):
                continue
            if any(relative.startswith(f"{data}/") for data in DATA):
                continue
            if path.name != "__init__.py":
                found.add(relative)
            found.update(f"{parent.as_posix()}/" for parent in Path(relative).parents[:-1])
    found.update(f"{data}/" for data in DATA if (root / data).is_dir())
    return found


def _job(path: Path) -> str:
    """A suggested job for a new entry: its module docstring's first line."""
    if path.suffix == ".py":
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError):
            doc = None
        if doc:
            return doc.splitlines()[0].rstrip(".")
    elif path.suffix == ".lua":
        header = re.match(r"--\[\[\s*(\S[^\n]*)", path.read_text(encoding="utf-8"))
        if header:
            return header[1].strip()
    return "<its job>"


def tree_problems(text: str, root: Path = ROOT) -> list[str]:
    """What to change in the tree so that it matches *root*, one instruction a line."""
    entries = parse_tree(text)
    problems = []
    for path, (number, job) in sorted(entries.items(), key=lambda e: e[1][0]):
        if not (root / path.rstrip("/")).exists():
            problems.append(f"remove line {number} ({path} does not exist)")
        elif not job:
            problems.append(f"line {number}: give {path} its job after two spaces")
    for path in sorted(expected_entries(root) - set(entries)):
        parent = path.rstrip("/").rpartition("/")[0] + "/"
        depth = path.rstrip("/").count("/")
        name = path.rstrip("/").rpartition("/")[2] + ("/" if path.endswith("/") else "")
        line = f"{'  ' * depth}{name:<{max(26 - 2 * depth, len(name) + 2)}}{_job(root / path)}"
        if parent in entries:
            where = f"under line {entries[parent][0]} ({parent})"
        else:
            where = f"under the new {parent} line" if parent != "/" else "at the top"
        problems.append(f"add {where}: {line!r}")
    return problems


def test_the_architecture_tree_lists_every_module_and_script_and_nothing_else() -> None:
    problems = tree_problems(ARCHITECTURE.read_text(encoding="utf-8"))
    assert not problems, "docs/architecture.md's tree (## The tree):\n" + "\n".join(problems)


def test_the_tree_lists_the_step_phases_that_step_lua_includes() -> None:
    step = (ROOT / "project/frontier/lua/step.lua").read_text(encoding="utf-8")
    included = set(re.findall(r"\bstep/\w+\.lua\b", step))
    listed = {
        path.removeprefix("project/frontier/lua/")
        for path in parse_tree(ARCHITECTURE.read_text(encoding="utf-8"))
        if path.startswith("project/frontier/lua/step/") and path.endswith(".lua")
    }
    assert listed == included, (
        f"phases step.lua includes but the tree does not list: {sorted(included - listed)}; "
        f"listed but not included: {sorted(listed - included)}"
    )


# -- links into a document land on one of its headings --------------------------------------------

_ANCHOR_LINK = re.compile(r"\]\(([\w./-]*\.md)?#([\w-]+)\)")


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown document."""
    found: set[str] = set()
    fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        if fence or not line.startswith("#"):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("document", _documents(), ids=lambda p: p.name)
def test_every_link_to_a_heading_finds_it(document: Path) -> None:
    text = document.read_text(encoding="utf-8")
    broken = []
    for target, anchor in _ANCHOR_LINK.findall(text):
        linked = (document.parent / target).resolve() if target else document
        if linked.exists() and anchor not in anchors(linked.read_text(encoding="utf-8")):
            broken.append(f"{target}#{anchor}")
    assert broken == [], f"{document.name}: no such heading"


def test_anchors_are_githubs() -> None:
    text = (
        "# Top\n## The seen-set's forms\n```\n# not a heading\n```\n"
        "## `CONCURRENT_REQUESTS`: x\n## Top\n"
    )
    assert anchors(text) == {"top", "the-seen-sets-forms", "concurrent_requests-x", "top-1"}


# -- the check itself, on trees that part from a folder -------------------------------------------


def _project(tmp_path: Path) -> Path:
    for relative in (
        "project/__init__.py",
        "project/addon.py",
        "project/frontier/__init__.py",
        "project/frontier/keys.py",
        "project/frontier/lua/step.lua",
        "project/templates/spiders/fleet.tmpl",
        "project/templates/project/module/__init__.py",
        "spiders/__init__.py",
        "pipelines/__init__.py",
    ):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text('"""Every key of a spider."""\n')
    return tmp_path


_DOC = """# Architecture

## The tree

```
project/                  the package
  addon.py                the add-on
  templates/              genspider's templates
  frontier/               the frontier
    keys.py               every key
    lua/                  the scripts
      step.lua            one tick
spiders/                  spiders
pipelines/                pipelines
```

## How a page travels
"""


def test_a_tree_that_matches_its_folder_has_nothing_to_change(tmp_path: Path) -> None:
    assert tree_problems(_DOC, _project(tmp_path)) == []


def test_a_module_the_tree_misses_is_named_with_the_line_to_add(tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / "project/frontier/meta.py").write_text('"""The frontier\'s meta keys, in one place."""')
    (root / "project/frontier/lua/step").mkdir()
    (root / "project/frontier/lua/step/lease.lua").write_text("return 1\n")
    assert tree_problems(_DOC, root) == [
        "add under line 11 (project/frontier/lua/): '      step/               <its job>'",
        "add under the new project/frontier/lua/step/ line: '        lease.lua         <its job>'",
        (
            "add under line 9 (project/frontier/): "
            '"    meta.py               The frontier\'s meta keys, in one place"'
        ),
    ]


def test_an_entry_that_no_longer_exists_is_named_with_the_line_to_remove(tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / "project/frontier/keys.py").unlink()
    assert tree_problems(_DOC, root) == ["remove line 10 (project/frontier/keys.py does not exist)"]


def test_an_entry_without_a_job_is_named(tmp_path: Path) -> None:
    doc = _DOC.replace("keys.py               every key", "keys.py")
    assert tree_problems(doc, _project(tmp_path)) == [
        "line 10: give project/frontier/keys.py its job after two spaces"
    ]


def test_a_block_off_the_format_is_refused_with_its_line(tmp_path: Path) -> None:
    doc = _DOC.replace("    keys.py ", "   keys.py ")
    with pytest.raises(TreeFormatError, match=r"^line 10: not '<2n spaces><name>  <job>'"):
        tree_problems(doc, _project(tmp_path))
