"""Install the servers that ``project.ops.services`` runs: redis-server and FerretDB; and the
tools that check ``deploy/kubernetes``: kustomize, kubeconform and their schemas.

redis-server comes from Debian's package (apt-get, as root). FerretDB, kustomize and
kubeconform are built with Go into ``<cache>/bin/``; the cache is ``FLEETCRAWL_CACHE_DIR`` or
``~/.cache/fleetcrawl``, and a file lock keeps concurrent builds (parallel test
sessions) from racing. The schemas come from PyPI (Kubernetes') and the Go module proxy
(KEDA's CRDs), never from GitHub.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Final

from project.ops.processes import ServiceError

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

__all__ = [
    "FERRETDB_VERSION",
    "KEDA_VERSION",
    "KUBECONFORM_VERSION",
    "KUBERNETES_SCHEMA_LAYOUT",
    "KUBERNETES_SCHEMA_VERSIONS",
    "KUSTOMIZE_VERSION",
    "ensure_ferretdb",
    "ensure_kubeconform",
    "ensure_kubernetes_schemas",
    "ensure_kustomize",
    "ensure_redis_server",
]

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
    _make_folder(binary.parent, what)
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


# --- the checks of deploy/kubernetes ----------------------------------------------------------
#
# Pinned releases that Go 1.24 builds (each newer one needs a newer Go than many machines have);
# tests/test_deploy_kubernetes.py renders every kustomization with kustomize and checks each
# manifest with kubeconform against these schemas, offline.

KUSTOMIZE_VERSION: Final = "v5.8.1"
KUBECONFORM_VERSION: Final = "v0.7.0"
#: The ScaledObject and TriggerAuthentication schemas: KEDA's CRDs in its Go module.
KEDA_VERSION: Final = "v2.18.0"
#: The Kubernetes releases whose schemas the manifests are checked against.
KUBERNETES_SCHEMA_VERSIONS: Final = ("1.31.0", "1.37.0")
#: kubeconform's ``-schema-location``, below the folder of :func:`ensure_kubernetes_schemas`:
#: one folder per release, strict schemas only (there is no schema without ``-strict``).
KUBERNETES_SCHEMA_LAYOUT: Final = (
    "{{ .NormalizedKubernetesVersion }}-local{{ .StrictSuffix }}"
    "/{{ .ResourceKind }}{{ .KindSuffix }}.json"
)

#: kubernetes-validate's wheel bundles the JSON schemas of every Kubernetes release (PyPI).
_KUBERNETES_VALIDATE: Final = (
    "kubernetes-validate",
    "1.37.0",
    "85136d018a27b50ec7fc049d902bfa5193f5976807e6c0f408e3ab6fe078cad9",  # its sha256
)
_KEDA_MODULE: Final = "github.com/kedacore/keda/v2"
_KEDA_CRDS: Final = ("keda.sh_scaledobjects.yaml", "keda.sh_triggerauthentications.yaml")
_KUBECONFORM_MODULE: Final = "github.com/yannh/kubeconform"
#: The wheel's schemas name their definitions by an absolute reference that kubeconform would
#: fetch from kubernetes.io; they are read from the folder itself instead.
_DEFINITIONS_REF: Final = '"/api/_definitions.json#'
_DONE: Final = "COMPLETE"


def _tool_runs(binary: Path, argv: Sequence[str]) -> bool:
    if not binary.is_file():
        return False
    try:
        done = subprocess.run(
            [str(binary), *argv], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("%s does not run (%s); building it again", binary, exc)
        return False
    if done.returncode != 0:
        logger.warning("%s does not run (exit %d); building it again", binary, done.returncode)
        return False
    return True


def _make_folder(folder: Path, what: str) -> None:
    """*folder* and its parents, or a ServiceError that says *what* could not be done."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ServiceError(f"{what}: cannot create {folder}: {exc}") from exc


def _go_or_fail(what: str) -> str:
    go = shutil.which("go")
    if go is None:
        raise ServiceError(f"{what}: go is not on PATH (Go >= 1.24 builds it)")
    return go


def _go_env() -> dict[str, str]:
    # CGO off: both tools are pure Go, and a machine without a C compiler builds them too.
    return {**os.environ, "GO111MODULE": "on", "GOFLAGS": "", "CGO_ENABLED": "0"}


def _go_tool(name: str, package: str, version: str, check: Sequence[str]) -> Path:
    """Return ``<cache>/bin/<name>-<version>``, ``go install``-ing *package* if it is missing."""
    cache = _cache_dir()
    binary = cache / "bin" / f"{name}-{version}"
    what = f"cannot build {name} {version}"
    _make_folder(binary.parent, what)
    with _file_lock(binary.parent / f".{name}.lock"):
        if _tool_runs(binary, check):
            return binary
        go = _go_or_fail(what)
        logger.warning("building %s %s into %s (once)", name, version, binary)
        build = cache / "build" / f"{name}-{version}"
        shutil.rmtree(build, ignore_errors=True)
        _run_tool(
            [go, "install", f"{package}@{version}"],
            what,
            cwd=binary.parent,
            env={**_go_env(), "GOBIN": str(build)},
        )
        try:
            (build / name).replace(binary)
        except OSError as exc:
            raise ServiceError(f"{what}: go install left no {build / name}: {exc}") from exc
        shutil.rmtree(build, ignore_errors=True)
        if not _tool_runs(binary, check):
            raise ServiceError(f"{what}: the freshly built {binary} does not run")
        return binary


def ensure_kustomize() -> Path:
    """Return kustomize (``<cache>/bin/kustomize-v5.8.1``), building it with Go if missing."""
    return _go_tool(
        "kustomize", "sigs.k8s.io/kustomize/kustomize/v5", KUSTOMIZE_VERSION, ["version"]
    )


def ensure_kubeconform() -> Path:
    """Return kubeconform (``<cache>/bin/kubeconform-v0.7.0``), building it with Go if missing."""
    return _go_tool(
        "kubeconform", f"{_KUBECONFORM_MODULE}/cmd/kubeconform", KUBECONFORM_VERSION, ["-v"]
    )


def _go_module_dir(go: str, module: str, version: str, what: str, cwd: Path) -> Path:
    """The read-only source of *module* at *version* in Go's module cache (downloaded once)."""
    listing = _run_tool(
        [go, "mod", "download", "-json", f"{module}@{version}"], what, cwd=cwd, env=_go_env()
    )
    try:
        return Path(json.loads(listing)["Dir"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ServiceError(
            f"{what}: unexpected output of go mod download: {listing[:200]!r}"
        ) from exc


def _download_wheel(into: Path, what: str) -> Path:
    name, version, sha256 = _KUBERNETES_VALIDATE
    _run_tool(
        [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--dest", str(into), f"{name}=={version}",
        ],
        what,
    )  # fmt: skip
    wheels = list(into.glob("*.whl"))
    if len(wheels) != 1:
        raise ServiceError(f"{what}: pip download left {len(wheels)} wheels in {into}, not 1")
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != sha256:
        raise ServiceError(f"{what}: {wheels[0].name} has sha256 {digest}, not {sha256}")
    return wheels[0]


def _extract_kubernetes_schemas(wheel: Path, into: Path, what: str) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        for version in KUBERNETES_SCHEMA_VERSIONS:
            prefix = f"kubernetes_validate/kubernetes-json-schema/v{version}-local-strict/"
            members = [n for n in names if n.startswith(prefix) and n.endswith(".json")]
            if not members:
                raise ServiceError(f"{what}: {wheel.name} has no schemas of Kubernetes {version}")
            folder = into / f"v{version}-local-strict"
            folder.mkdir()
            for member in members:
                schema = json.loads(archive.read(member))
                schema.pop("$id", None)  # a kubernetes.io address: refs are resolved from here
                text = json.dumps(schema).replace(_DEFINITIONS_REF, '"_definitions.json#')
                if '"/api/' in text or '"$ref": "http' in text:
                    raise ServiceError(
                        f"{what}: {member} references a schema outside the wheel; the format"
                        f" of {wheel.name} changed"
                    )
                (folder / member.removeprefix(prefix)).write_text(text, encoding="utf-8")


def ensure_kubernetes_schemas() -> Path:
    """Return the folder of the JSON schemas (:data:`KUBERNETES_SCHEMA_LAYOUT`) that
    kubeconform checks ``deploy/kubernetes`` against, making it once.

    Kubernetes' own come from the wheel of kubernetes-validate (PyPI, its sha256 pinned),
    KEDA's from its CRDs (the Go module), converted by kubeconform's own
    ``scripts/openapi2jsonschema.py`` (from its Go module; it needs PyYAML), strict: a
    property no schema names is an error, as it is for Kubernetes' own.
    """
    cache = _cache_dir()
    name, version, _ = _KUBERNETES_VALIDATE
    root = cache / "kubernetes-schemas" / f"{name}-{version}-keda-{KEDA_VERSION}"
    what = "cannot prepare the Kubernetes schemas"
    _make_folder(root.parent, what)
    with _file_lock(root.parent / ".schemas.lock"):
        if (root / _DONE).is_file() and all(
            (root / f"v{release}-local-strict").is_dir() for release in KUBERNETES_SCHEMA_VERSIONS
        ):
            return root
        go = _go_or_fail(what)
        logger.warning("preparing the Kubernetes and KEDA schemas in %s (once)", root)
        partial = root.with_name(f"{root.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        crds = partial / "crds"
        try:
            crds.mkdir(parents=True)
            wheel = _download_wheel(partial, what)
            _extract_kubernetes_schemas(wheel, partial, what)
            wheel.unlink()
        except OSError as exc:
            raise ServiceError(f"{what}: cannot write the schemas in {partial}: {exc}") from exc
        keda = _go_module_dir(go, _KEDA_MODULE, KEDA_VERSION, what, root.parent)
        kubeconform = _go_module_dir(
            go, _KUBECONFORM_MODULE, KUBECONFORM_VERSION, what, root.parent
        )
        _run_tool(
            [
                sys.executable,
                str(kubeconform / "scripts" / "openapi2jsonschema.py"),
                *(str(keda / "config" / "crd" / "bases" / crd) for crd in _KEDA_CRDS),
            ],
            what,
            cwd=crds,
            env={
                **os.environ,
                # scaledobject-keda-v1alpha1.json: the names kubeconform's layout asks for
                "FILENAME_FORMAT": "{kind}-{group}-{version}",
                "DENY_ROOT_ADDITIONAL_PROPERTIES": "1",
            },
        )
        converted = sorted(crds.glob("*.json"))
        if len(converted) != len(_KEDA_CRDS):
            raise ServiceError(
                f"{what}: openapi2jsonschema.py wrote {[p.name for p in converted]} from"
                f" {len(_KEDA_CRDS)} CRDs"
            )
        try:
            for version_dir in partial.glob("v*-local-strict"):
                for schema in converted:
                    shutil.copyfile(schema, version_dir / schema.name)
            shutil.rmtree(crds)
            (partial / _DONE).write_text(
                f"kubernetes-validate {version}, KEDA {KEDA_VERSION}, converted by kubeconform"
                f" {KUBECONFORM_VERSION}\n",
                encoding="utf-8",
            )
            shutil.rmtree(root, ignore_errors=True)
            partial.replace(root)
        except OSError as exc:
            raise ServiceError(f"{what}: cannot write the schemas in {partial}: {exc}") from exc
        return root
