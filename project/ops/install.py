"""Install the servers that ``project.ops.services`` runs: redis-server and FerretDB.

redis-server comes from Debian's package (apt-get, as root). FerretDB is built
with Go into ``<cache>/bin/ferretdb``; the cache is ``FLEETCRAWL_CACHE_DIR`` or
``~/.cache/fleetcrawl``, and a file lock keeps concurrent builds (parallel test
sessions) from racing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Final

from project.ops.processes import ServiceError

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

__all__ = ["FERRETDB_VERSION", "ensure_ferretdb", "ensure_redis_server"]

logger = logging.getLogger(__name__)

FERRETDB_VERSION: Final = "v1.24.2"
#: The version the patched build reports (``ferretdb --version``): a binary built before the
#: patch, or with an older one, is built again.
FERRETDB_BUILD: Final = f"{FERRETDB_VERSION}-fleetcrawl.10"

#: fleetcrawl's patch of FerretDB (each ferretdb/*.go says why): the files it adds, and the text it
#: replaces, each found exactly once (or as many times as a fourth element says).
_PATCH_FILES: Final = {
    "fleetcrawl_id.go": "internal/backends/sqlite/fleetcrawl_id.go",
    "fleetcrawl_order.go": "internal/backends/sqlite/fleetcrawl_order.go",
    "fleetcrawl_find.go": "internal/handler/fleetcrawl_find.go",
    "fleetcrawl_wal.go": "internal/backends/sqlite/metadata/pool/fleetcrawl_wal.go",
}
_UPSTREAM_ID_WHERE: Final = """\
	if params.Filter.Len() == 1 {
		v, _ := params.Filter.Get("_id")
		switch v.(type) {
		case string, types.ObjectID:
%s			whereClause = fmt.Sprintf(` WHERE %%s = ?`, metadata.IDColumn)
			args = []any{string(must.NotFail(sjson.MarshalSingleValue(v)))}
		}
	}
"""
_PATCHES: Final = (
    (
        "internal/backends/sqlite/metadata/metadata.go",
        "IDColumn = DefaultColumn + \"->'$._id'\"",
        """IDColumn = DefaultColumn + `->"_id"`""",
    ),
    (
        "internal/backends/sqlite/collection.go",
        _UPSTREAM_ID_WHERE % "",
        (
            "\twhereClause, args, _ = fleetcrawlIDWhere(params.Filter)\n"
            "\tfleetcrawlTextIndex(ctx, db, meta.TableName, whereClause)\n"
        ),
    ),
    (
        "internal/backends/sqlite/collection.go",
        _UPSTREAM_ID_WHERE % "\t\t\tfilterPushdown = true\n",
        "\twhereClause, args, filterPushdown = fleetcrawlIDWhere(params.Filter)\n",
    ),
    (
        "internal/backends/sqlite/metadata/registry.go",
        "\t\tUnique: true,\n\t}})\n\tif err != nil {\n",
        (
            "\t\tUnique: true,\n\t}})\n\tif err == nil {\n\t\t_, err = db.ExecContext(ctx, fmt.Sprintf("
            "`CREATE INDEX IF NOT EXISTS %q ON %q (%s->>'$._id')`, tableName+\"_fleetcrawl_id_text\","
            " tableName, DefaultColumn))\n\t}\n\tif err != nil {\n"
        ),
    ),
    (
        "internal/backends/sqlite/query.go",
        '\tv := must.NotFail(sort.Get("$natural"))\n',
        (
            '\tif sort.Has("_id") {\n\t\treturn fleetcrawlOrderByID(sort)\n\t}\n\n'
            '\tv := must.NotFail(sort.Get("$natural"))\n'
        ),
    ),
    (
        "internal/backends/collection.go",
        '\t\tsortValue := params.Sort.Map()["$natural"].(int64)\n',
        (
            '\t\tsortValue, _ := params.Sort.Map()["$natural"].(int64)\n'
            '\t\tif byID, ok := params.Sort.Map()["_id"].(int64); ok {\n'
            "\t\t\tsortValue = byID\n\t\t}\n"
        ),
        2,  # the contracts of Query and Explain
    ),
    (
        "internal/handler/msg_find.go",
        "\t// Limit pushdown is not applied if:\n",
        "\tfleetcrawlPushdown(h, params, qp)\n\n\t// Limit pushdown is not applied if:\n",
    ),
    (
        "internal/handler/msg_find.go",
        "\titer, err := h.makeFindIter(queryRes.Iter, closer, params)\n",
        "\titer, err := h.makeFindIter(queryRes.Iter, closer, fleetcrawlUnsorted(params, qp))\n",
    ),
    (
        "internal/backends/sqlite/metadata/pool/opendb.go",
        "\treturn fsql.WrapDB(db, name, l), nil\n",
        (
            "\tif !memory {\n\t\tgo fleetcrawlCheckpoints(db, name, uri, l)\n\t}\n\n"
            "\treturn fsql.WrapDB(db, name, l), nil\n"
        ),
    ),
)

_FERRETDB_MODULE: Final = "github.com/FerretDB/FerretDB"
_INSTALL_TIMEOUT: Final = 1800.0

_apt_updated = False


def _output_tail(text: str, lines: int = 5) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:]) or "(no output)"


def _run_tool(
    argv: Sequence[str], what: str, *, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> str:
    tool = f"{Path(argv[0]).name} {argv[1]}"
    logger.info("running %s", " ".join(argv))
    try:
        done = subprocess.run(
            list(argv),
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_INSTALL_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"{what}: {tool} did not finish within {_INSTALL_TIMEOUT:g}s") from exc
    except OSError as exc:
        raise ServiceError(f"{what}: cannot run {tool}: {exc}") from exc
    if done.returncode != 0:
        raise ServiceError(
            f"{what}: {tool} exited {done.returncode}: {_output_tail(done.stderr or done.stdout)}"
        )
    return done.stdout


def ensure_redis_server() -> Path:
    """Return the path of ``redis-server``, installing Debian's package if it is missing."""
    global _apt_updated  # `apt-get update` once per process
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    what = "cannot install redis-server"
    apt_get = shutil.which("apt-get")
    if apt_get is None:
        raise ServiceError(
            f"{what}: it is not on PATH and apt-get is not available; install Redis >= 6"
        )
    if os.geteuid() != 0:
        raise ServiceError(f"{what}: apt-get needs root; run: sudo apt-get install -y redis-server")
    logger.warning("redis-server is not installed; installing it with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _apt_updated:
        _run_tool([apt_get, "update"], what, env=env)
        _apt_updated = True
    _run_tool([apt_get, "install", "-y", "--no-install-recommends", "redis-server"], what, env=env)
    found = shutil.which("redis-server")
    if not found:
        raise ServiceError(f"{what}: apt-get succeeded but redis-server is not on PATH")
    return Path(found)


def _cache_dir() -> Path:
    configured = os.environ.get("FLEETCRAWL_CACHE_DIR")
    return (
        Path(configured).expanduser().resolve()
        if configured
        else Path.home() / ".cache" / "fleetcrawl"
    )


def _ferretdb_runs(binary: Path) -> bool:
    if not binary.is_file():
        return False
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("%s does not run (%s); rebuilding it", binary, exc)
        return False
    if done.returncode == 0 and f"version: {FERRETDB_BUILD}" not in done.stdout:
        found = (done.stdout.strip().splitlines() or ["no version"])[0]
        logger.warning("%s is not the build fleetcrawl needs (%s, not %s); rebuilding it",
                       binary, found, FERRETDB_BUILD)  # fmt: skip
        return False
    if done.returncode != 0:
        logger.warning(
            "%s does not run (exit %d: %s); rebuilding it",
            binary,
            done.returncode,
            (done.stderr.strip().splitlines() or ["no output"])[0],
        )
        return False
    return True


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _patch_ferretdb(source: Path) -> None:
    """Apply fleetcrawl's patch to the FerretDB source in *source* (a writable copy)."""
    for name, where in _PATCH_FILES.items():
        patch = files(__package__ or "project.ops").joinpath("ferretdb", name)
        (source / where).write_text(patch.read_text(encoding="utf-8"), encoding="utf-8")
    for name, old, new, *times in _PATCHES:
        path = source / name
        text = path.read_text(encoding="utf-8")
        expected = times[0] if times else 1
        if text.count(old) != expected:
            raise ServiceError(
                f"cannot build ferretdb: {name} of {FERRETDB_VERSION} is not the text the patch"
                f" expects ({text.count(old)} matches of {old.splitlines()[0].strip()!r},"
                f" not {expected})"
            )
        path.write_text(text.replace(old, new), encoding="utf-8")


def ensure_ferretdb() -> Path:
    """Return ``<cache>/bin/ferretdb``, building FerretDB v1.24.2 with Go if it is missing.

    ``go install ...@v1.24.2`` gives a binary that panics at start (the module
    lacks the generated ``build/version/version.txt``), so the module source
    is copied, that file is written, and ``go build`` runs on the copy, with
    fleetcrawl's patch (``ferretdb/fleetcrawl_id.go``): upstream's SQLite backend
    never uses its ``_id`` index, so each find or update by ``_id`` scans the
    collection (25.7 ms at 10^4 documents) and storing slows as a catalogue grows;
    and ``ferretdb/fleetcrawl_wal.go``: a busy database's WAL never restarted, so it
    grew without end and slowed every read.
    """
    cache = _cache_dir()
    binary = cache / "bin" / "ferretdb"
    what = "cannot build ferretdb"
    try:
        binary.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ServiceError(f"{what}: cannot create {binary.parent}: {exc}") from exc
    with _file_lock(binary.parent / ".ferretdb.lock"):
        if _ferretdb_runs(binary):
            return binary
        go = shutil.which("go")
        if go is None:
            raise ServiceError(
                f"{what}: go is not on PATH (Go >= 1.21 builds FerretDB {FERRETDB_VERSION})"
            )
        logger.warning(
            "building FerretDB %s into %s (a few minutes the first time)", FERRETDB_VERSION, binary
        )
        env = {**os.environ, "GO111MODULE": "on", "GOFLAGS": ""}
        listing = _run_tool(
            [go, "mod", "download", "-json", f"{_FERRETDB_MODULE}@{FERRETDB_VERSION}"],
            what,
            cwd=cache,
            env=env,
        )
        try:
            module_dir = Path(json.loads(listing)["Dir"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ServiceError(
                f"{what}: unexpected output of go mod download: {listing[:200]!r}"
            ) from exc
        source = cache / "src" / f"ferretdb-{FERRETDB_VERSION}"
        try:
            shutil.rmtree(source, ignore_errors=True)
            # copyfile, not copy2: the module cache is read-only and the copy must not be.
            shutil.copytree(module_dir, source, copy_function=shutil.copyfile)
            for folder, _, _ in os.walk(source):
                Path(folder).chmod(0o755)
            (source / "build" / "version" / "version.txt").write_text(f"{FERRETDB_BUILD}\n")
            _patch_ferretdb(source)
        except OSError as exc:
            raise ServiceError(f"{what}: cannot prepare the source in {source}: {exc}") from exc
        partial = binary.with_name("ferretdb.partial")
        _run_tool(
            [go, "build", "-buildvcs=false", "-o", str(partial), "./cmd/ferretdb"],
            what,
            cwd=source,
            env=env,
        )
        partial.replace(binary)
        shutil.rmtree(source, ignore_errors=True)
        if not _ferretdb_runs(binary):
            raise ServiceError(f"{what}: the freshly built {binary} does not run")
        return binary
