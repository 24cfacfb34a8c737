"""deploy/container and deploy/kubernetes: what a platform runs is what the node's code expects.

Every kustomization of deploy/kubernetes is rendered with kustomize and each manifest validated
with kubeconform, strict (a field no schema names is an error, a kind without a schema too),
against Kubernetes' schemas and KEDA's CRDs, offline: the tools and the schemas are made once by
project/ops/install.py into ~/.cache/fleetcrawl (Go builds the tools the first time, about a
minute, so these tests are left out of ``make test-fast``). The Containerfile is checked by
reading it (no container starts on the machines this suite runs on); its HEALTHCHECK and the
manifests' probes and preStop hook run against a real node.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import time
import tomllib
import zipfile
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from scrapy.settings import Settings

from project.frontier.connection import RedisTarget
from project.frontier.stopping import StopConfig
from project.monitoring.dashboard import host_allowed
from project.ops.cli import _parser as cli_parser
from project.ops.install import (
    KUBERNETES_SCHEMA_LAYOUT,
    KUBERNETES_SCHEMA_VERSIONS,
    _extract_kubernetes_schemas,
    ensure_kubeconform,
    ensure_kubernetes_schemas,
    ensure_kustomize,
)
from project.ops.processes import ServiceError
from tests.fleet import ROOT, run_cli, wait_for

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fleet import Fleet

KUBERNETES = ROOT / "deploy" / "kubernetes"
CONTAINER = ROOT / "deploy" / "container"
#: The kustomizations a user applies, and the kinds each renders.
KUSTOMIZATIONS = ("base", "overlays/sentinel", "overlays/cluster")
KINDS = sorted(["Deployment", "Deployment", "PodDisruptionBudget", "ScaledObject", "Service"])
#: Environment variables the manifests may give a literal value: addresses and names, never
#: a credential (those come from the Secret).
LITERAL_ENV = {
    "DASHBOARD_ALLOWED_HOSTS",
    "REDIS_CLUSTER_NODES",
    "REDIS_SENTINELS",
    "REDIS_SENTINEL_MASTER",
}
#: What the Secret's REDIS_URL stands for when the overlays' settings are read.
SECRET_REDIS_URL = "redis://:secret@redis.example:6379/0"
#: kubeconform and kustomize may not reach any network: a fetch through this proxy fails.
OFFLINE = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}
#: The first build of the tools (Go) runs in the first test's set-up.
BUILD_TIMEOUT = 900


@dataclass(frozen=True)
class Kube:
    """kustomize, kubeconform and the folder of their schemas."""

    kustomize: Path
    kubeconform: Path
    schemas: Path

    def render(self, folder: Path) -> str:
        """``kustomize build FOLDER``; AssertionError with kustomize's message if it fails."""
        done = subprocess.run(
            [str(self.kustomize), "build", str(folder)],
            capture_output=True,
            text=True,
            timeout=120,
            env=_offline_env(),
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"kustomize build {folder} failed: {done.stderr.strip()}")
        return done.stdout

    def validate(self, manifests: str, version: str) -> tuple[int, dict[str, Any]]:
        """kubeconform's exit status and its report (every resource with its status)."""
        done = subprocess.run(
            [
                str(self.kubeconform),
                "-strict",
                "-summary",
                "-verbose",
                "-output",
                "json",
                "-kubernetes-version",
                version,
                "-schema-location",
                str(self.schemas / KUBERNETES_SCHEMA_LAYOUT),
                "-",
            ],
            input=manifests,
            capture_output=True,
            text=True,
            timeout=120,
            env=_offline_env(),
            check=False,
        )
        try:
            report = json.loads(done.stdout)
        except ValueError:
            raise AssertionError(
                f"kubeconform exited {done.returncode} without a report: {done.stderr.strip()}"
            ) from None
        return done.returncode, report


def _offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy")}
    env.pop("no_proxy", None)
    return {**env, **OFFLINE}


@pytest.fixture(scope="session")
def kube() -> Kube:
    """The tools, built (and the schemas made) the first time by project/ops/install.py."""
    try:
        return Kube(ensure_kustomize(), ensure_kubeconform(), ensure_kubernetes_schemas())
    except ServiceError as exc:
        pytest.fail(f"the Kubernetes tools cannot be installed: {exc}")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of deploy/kubernetes to change, with an overlay of a user's own
    (``overlays/mine``): the Sentinel overlay, their image, KEDA reading the dashboard."""
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, copy)
    mine = copy / "overlays" / "mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(MINE)
    return copy


MINE = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: fleetcrawl
resources: [../sentinel]
components: [../../components/metrics-api]
images: [{name: fleetcrawl, newName: registry.example.com/fleetcrawl, newTag: 0.1.0}]
"""


def documents(manifests: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(manifests) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def scrapy_settings(args: list[str]) -> dict[str, str]:
    """The ``-s NAME=VALUE`` of a command line."""
    settings = {}
    for flag, value in itertools.pairwise(args):
        if flag in ("-s", "--set"):
            name, _, setting = value.partition("=")
            settings[name] = setting
    return settings


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` in a command line, from the container's environment."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], text)


def container_env(spec: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the pod sees it (the Secret's values stood in for)."""
    secrets = {"REDIS_URL": SECRET_REDIS_URL}
    return {
        var["name"]: var["value"] if "value" in var else secrets.get(var["name"], "from-secret")
        for var in spec.get("env", [])
    }


def check_valid(kube: Kube, manifests: str) -> None:
    for version in KUBERNETES_SCHEMA_VERSIONS:
        code, report = kube.validate(manifests, version)
        invalid = [r for r in report["resources"] if r["status"] != "statusValid"]
        assert code == 0, f"Kubernetes {version}: {invalid}"
        assert not invalid, f"Kubernetes {version}: {invalid}"
        assert report["summary"]["valid"] == len(documents(manifests)), report["summary"]
        assert sorted(r["kind"] for r in report["resources"]) == KINDS


# -- the manifests -------------------------------------------------------------------------------


@pytest.mark.crawl
@pytest.mark.timeout(BUILD_TIMEOUT)
@pytest.mark.parametrize("kustomization", [*KUSTOMIZATIONS, "overlays/mine"])
def test_every_kustomization_renders_to_manifests_kubernetes_and_keda_accept(
    kube: Kube, tree: Path, kustomization: str
) -> None:
    folder = (tree if kustomization == "overlays/mine" else KUBERNETES) / kustomization
    check_valid(kube, kube.render(folder))


#: Changes Kubernetes or KEDA would refuse: (file, text, replacement, what kubeconform says).
BREAKS = {
    "an unknown field of a container": (
        "base/node.yaml",
        "          resources:\n",
        "          resource:\n",
        "additional properties 'resource' not allowed",
    ),
    "a number as text": (
        "base/node.yaml",
        "terminationGracePeriodSeconds: 30",
        "terminationGracePeriodSeconds: thirty",
        "terminationGracePeriodSeconds",
    ),
    "an unknown field of the ScaledObject": (
        "base/node-scaledobject.yaml",
        "  cooldownPeriod: 600",
        "  cooldownPeriods: 600",
        "additional properties 'cooldownPeriods' not allowed",
    ),
    "a trigger's option that is not a string": (
        "base/node-scaledobject.yaml",
        'threshold: "1"',
        "threshold: 1",
        "/spec/triggers/0/metadata/threshold",
    ),
    "a fallback behaviour KEDA does not know": (
        "base/node-scaledobject.yaml",
        "behavior: currentReplicas",
        "behavior: current",
        "/spec/fallback/behavior",
    ),
    "a kind no schema describes": (
        "base/node-scaledobject.yaml",
        "apiVersion: keda.sh/v1alpha1",
        "apiVersion: keda.sh/v1alpha2",
        "could not find schema for ScaledObject",
    ),
}


@pytest.mark.crawl
@pytest.mark.timeout(BUILD_TIMEOUT)
@pytest.mark.parametrize("name", BREAKS)
def test_a_manifest_kubernetes_or_keda_would_refuse_fails_the_check(
    kube: Kube, tree: Path, name: str
) -> None:
    path, text, replacement, said = BREAKS[name]
    source = (tree / path).read_text()
    assert source.count(text) == 1, f"{path} no longer has {text!r} once"
    (tree / path).write_text(source.replace(text, replacement))
    manifests = kube.render(tree / "base")
    for version in KUBERNETES_SCHEMA_VERSIONS:
        code, report = kube.validate(manifests, version)
        refused = [r for r in report["resources"] if r["status"] != "statusValid"]
        assert code == 1, (version, report)
        assert len(refused) == 1, refused
        assert said in refused[0]["msg"], refused[0]["msg"]


@pytest.mark.crawl
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_a_patch_that_no_longer_applies_fails_the_render(kube: Kube, tree: Path) -> None:
    patch = tree / "overlays" / "sentinel" / "redis-sentinel.yaml"
    patch.write_text(patch.read_text().replace("/containers/0/env/-", "/containers/1/env/-"))
    with pytest.raises(AssertionError, match=r"kustomize build .* failed"):
        kube.render(tree / "overlays" / "sentinel")


@pytest.mark.crawl
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_nodes_stop_within_the_grace_and_probe_the_file_they_keep(kube: Kube) -> None:
    docs = documents(kube.render(KUBERNETES / "base"))
    node = find(docs, "Deployment", "fleetcrawl-node")
    pod = node["spec"]["template"]["spec"]
    spec = container(node)
    assert spec["command"] == ["/usr/bin/tini", "--", "scrapy", "crawl"]
    settings = scrapy_settings(spec["args"])
    health = settings["FLEET_HEALTH_FILE"]
    # a node that finishes would be restarted in a loop: nodes wait for seeds
    assert settings["FRONTIER_KEEP_ALIVE"] == "True"
    ready = spec["readinessProbe"]["exec"]["command"]
    live = spec["livenessProbe"]["exec"]["command"]
    stop = spec["lifecycle"]["preStop"]["exec"]["command"]
    assert ready == ["fleetcrawl", "probe", "ready", "--file", health]
    assert live[:5] == ["fleetcrawl", "probe", "live", "--file", health]
    assert stop[:4] == ["fleetcrawl", "stop", "--file", health]
    # the node's own grace, then its close, inside the hook's wait, inside the pod's grace
    wait = float(stop[stop.index("--wait") + 1])
    assert StopConfig().stop_grace + 3 <= wait < pod["terminationGracePeriodSeconds"]
    # each parses as the fleetcrawl command reads it
    for argv in (ready, live, stop):
        cli_parser().parse_args(argv[1:])

    # the health file, the node's working folder and Chromium's /tmp are writable: the rest not
    assert spec["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in spec["volumeMounts"]}
    assert "emptyDir" in mounts["/tmp"]
    assert health.startswith("/tmp/")
    assert "emptyDir" in mounts[spec["workingDir"]]
    assert spec["resources"]["limits"]["memory"] == "1536Mi"

    # KEDA scales these nodes on the figure of their spider
    scaled = find(docs, "ScaledObject", "fleetcrawl-node")
    assert scaled["spec"]["scaleTargetRef"]["name"] == node["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    spider = spec["args"][0]
    assert trigger["metadata"]["query"] == f'max(fleetcrawl_useful_nodes{{spider="{spider}"}})'
    pdb = find(docs, "PodDisruptionBudget", "fleetcrawl-node")
    labels = pod_labels(node)
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert node["spec"]["selector"]["matchLabels"].items() <= labels.items()


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


@pytest.mark.crawl
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_the_dashboard_serves_metrics_where_its_service_and_scrapers_look(kube: Kube) -> None:
    docs = documents(kube.render(KUBERNETES / "base"))
    dashboard = find(docs, "Deployment", "fleetcrawl-dashboard")
    spec = container(dashboard)
    argv = spec["command"][2:] + spec["args"]
    assert spec["command"][:2] == ["/usr/bin/tini", "--"]
    assert argv[0] == "fleetcrawl"
    args = cli_parser().parse_args(argv[1:])
    assert (args.command, args.host) == ("dashboard", "0.0.0.0")
    (port,) = spec["ports"]
    assert port["containerPort"] == args.port
    annotations = dashboard["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(args.port)
    service = find(docs, "Service", "fleetcrawl-dashboard")
    assert service["spec"]["selector"].items() <= pod_labels(dashboard).items()
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    # KEDA's metrics-api asks for the dashboard by its service's name: answered, not a 400
    allowed = container_env(spec)["DASHBOARD_ALLOWED_HOSTS"].split(",")
    for name in ("fleetcrawl-dashboard", "fleetcrawl-dashboard.fleetcrawl.svc"):
        assert host_allowed(f"{name}:{args.port}", "0.0.0.0", allowed), name
    assert not host_allowed("attacker.example", "0.0.0.0", allowed)


@pytest.mark.crawl
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_a_users_overlay_names_the_image_and_can_point_keda_at_the_dashboard(
    kube: Kube, tree: Path
) -> None:
    docs = documents(kube.render(tree / "overlays" / "mine"))
    for name in ("fleetcrawl-node", "fleetcrawl-dashboard"):
        image = container(find(docs, "Deployment", name))["image"]
        assert image == "registry.example.com/fleetcrawl:0.1.0"
    assert {d["metadata"]["namespace"] for d in docs} == {"fleetcrawl"}
    (trigger,) = find(docs, "ScaledObject", "fleetcrawl-node")["spec"]["triggers"]
    assert trigger["type"] == "metrics-api"
    assert trigger["metadata"]["valueLocation"] == "useful_nodes"
    service = find(docs, "Service", "fleetcrawl-dashboard")
    url = trigger["metadata"]["url"]
    assert url.startswith(f"http://{service['metadata']['name']}.fleetcrawl.svc:")
    assert url.endswith(f":{service['spec']['ports'][0]['port']}/api/v1/scale")


@pytest.mark.crawl
@pytest.mark.timeout(BUILD_TIMEOUT)
@pytest.mark.parametrize(
    ("overlay", "mode", "described"),
    [
        ("base", "single", "redis://:***@redis.example:6379/0"),
        ("overlays/sentinel", "sentinel", "sentinel master 'mymaster' via redis-sentinel-0."),
        ("overlays/cluster", "cluster", "cluster redis-cluster-0.redis-cluster-headless:6379,"),
    ],
)
def test_each_overlay_points_every_process_at_its_redis(
    kube: Kube, overlay: str, mode: str, described: str
) -> None:
    docs = documents(kube.render(KUBERNETES / overlay))
    for name in ("fleetcrawl-node", "fleetcrawl-dashboard"):
        spec = container(find(docs, "Deployment", name))
        env = container_env(spec)
        # a $(VAR) Kubernetes cannot fill would reach the node as it is
        for arg in spec["command"] + spec["args"]:
            for var in re.findall(r"\$\((\w+)\)", arg):
                assert var in env, f"{name}: {arg} names {var}, which the container lacks"
        settings = Settings({"REDIS_URL": env["REDIS_URL"]})
        settings.setdict(scrapy_settings([expand(a, env) for a in spec["args"]]), "cmdline")
        target = RedisTarget.from_settings(settings, settings["REDIS_URL"], {})
        assert target.mode == mode, name
        assert target.describe().startswith(described), target.describe()


@pytest.mark.crawl
@pytest.mark.timeout(BUILD_TIMEOUT)
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_no_secret_is_written_in_the_manifests(kube: Kube, kustomization: str) -> None:
    manifests = kube.render(KUBERNETES / kustomization)
    assert not re.search(r"://[^/\s:@]*:[^/\s@]+@", manifests), "a URL with a password"
    for doc in documents(manifests):
        assert doc["kind"] not in ("Secret", "ConfigMap"), doc["metadata"]["name"]
        if doc["kind"] != "Deployment":
            continue
        for var in container(doc).get("env", []):
            if "value" in var:
                assert var["name"] in LITERAL_ENV, var
            else:
                assert var["valueFrom"]["secretKeyRef"]["name"] == "fleetcrawl", var


# -- the schemas ---------------------------------------------------------------------------------


def _wheel(tmp_path: Path, schemas: dict[str, dict[str, Any]]) -> Path:
    """A wheel laid out as kubernetes-validate's, with *schemas* by path below its schema folder."""
    wheel = tmp_path / "kubernetes_validate-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, schema in schemas.items():
            archive.writestr(
                f"kubernetes_validate/kubernetes-json-schema/{name}", json.dumps(schema)
            )
    return wheel


def test_the_schemas_are_read_from_their_folder_not_from_kubernetes_io(tmp_path: Path) -> None:
    ref = {"$ref": "/api/_definitions.json#/$defs/io.k8s.api.core.v1.PodSpec"}
    wheel = _wheel(
        tmp_path,
        {
            f"v{release}-local-strict/{name}": {"$id": "https://kubernetes.io/api/x", **ref}
            for release in KUBERNETES_SCHEMA_VERSIONS
            for name in ("pod-v1.json", "_definitions.json")
        },
    )
    (tmp_path / "out").mkdir()
    _extract_kubernetes_schemas(wheel, tmp_path / "out", "test")
    for release in KUBERNETES_SCHEMA_VERSIONS:
        schema = json.loads(
            (tmp_path / "out" / f"v{release}-local-strict" / "pod-v1.json").read_text()
        )
        assert schema == {"$ref": "_definitions.json#/$defs/io.k8s.api.core.v1.PodSpec"}


@pytest.mark.parametrize(
    ("schema", "said"),
    [
        ({"$ref": "https://kubernetes.io/api/other.json#/x"}, "references a schema outside"),
        ({"$ref": "/api/other.json#/x"}, "references a schema outside"),
    ],
)
def test_schemas_that_would_be_fetched_from_the_network_are_refused(
    tmp_path: Path, schema: dict[str, Any], said: str
) -> None:
    wheel = _wheel(
        tmp_path, {f"v{r}-local-strict/pod-v1.json": schema for r in KUBERNETES_SCHEMA_VERSIONS}
    )
    (tmp_path / "out").mkdir()
    with pytest.raises(ServiceError, match=said):
        _extract_kubernetes_schemas(wheel, tmp_path / "out", "test")


def test_a_wheel_without_a_release_is_refused(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, {"v1.0.0-local-strict/pod-v1.json": {}})
    (tmp_path / "out").mkdir()
    with pytest.raises(
        ServiceError, match=f"no schemas of Kubernetes {KUBERNETES_SCHEMA_VERSIONS[0]}"
    ):
        _extract_kubernetes_schemas(wheel, tmp_path / "out", "test")


# -- the image -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    name: str
    text: str

    def exec_form(self) -> list[str]:
        """The JSON array that ends the instruction (CMD, ENTRYPOINT, HEALTHCHECK ... CMD)."""
        return json.loads(self.text[self.text.index("[") :])


def instructions() -> list[Instruction]:
    """The Containerfile's instructions, continuation lines joined, comments left out."""
    found: list[Instruction] = []
    pending = ""
    for line in (CONTAINER / "Containerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment between continuation lines
        pending += line.rstrip().removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            name, _, text = pending.strip().partition(" ")
            found.append(Instruction(name.upper(), " ".join(text.split())))
            pending = ""
    assert not pending, "the Containerfile ends inside a continued line"
    return found


def named(name: str) -> list[Instruction]:
    return [i for i in instructions() if i.name == name]


def image_env() -> dict[str, str]:
    env = {}
    for instruction in named("ENV"):
        for pair in instruction.text.split():
            key, _, value = pair.partition("=")
            env[key] = value
    return env


def test_the_image_is_debian_with_its_chromium_and_not_root() -> None:
    (base,) = named("FROM")
    assert base.text == "debian:bookworm-slim"
    installs = [i.text for i in named("RUN") if "apt-get install" in i.text]
    assert len(installs) == 1
    packages = set(installs[0].split("apt-get install", 1)[1].split("&&")[0].split())
    assert {"chromium-headless-shell", "python3", "python3-venv", "tini"} <= packages
    assert "--no-install-recommends" in packages
    # the user's numeric id, created as fleetcrawl: runAsNonRoot can check it
    user = named("USER")[-1].text
    assert user == "10001:10001"
    assert any("useradd --system --uid 10001" in i.text for i in named("RUN"))
    for instruction in instructions():
        assert "playwright install" not in instruction.text.lower(), instruction


def test_the_image_installs_the_pinned_dependencies_but_not_the_project() -> None:
    (install,) = [i.text for i in named("RUN") if "pip install" in i.text]
    pip = install.split("pip install", 1)[1].split("&&")[0].split()
    assert "-c" in pip
    assert pip[pip.index("-c") + 1] == "/opt/fleetcrawl/constraints.txt"
    assert pip[pip.index("-r") + 1] == "/opt/fleetcrawl/requirements.txt"
    # nothing but the requirements: no ".", no "-e", no path of the project
    assert len([arg for arg in pip if not arg.startswith("-")]) == 2, pip
    assert "tomllib" in install
    assert '["project"]["dependencies"]' in install


def test_constraints_pin_everything_the_image_installs_for_debians_python() -> None:
    """The image installs pyproject's dependencies with constraints.txt on Debian bookworm's
    Python: every package it gets (the dependencies of the dependencies too, with their markers
    read for that Python) has its version there, a version that Python may install. pip and
    setuptools (scrapyd and scrapyd-client name them) come with the venv."""
    pinned = {
        _normal(name): version
        for name, _, version in (
            line.strip().partition("==")
            for line in (ROOT / "constraints.txt").read_text().splitlines()
        )
        if version
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    seen: set[str] = set()
    problems = []
    while todo:
        requirement = todo.pop()
        name = _normal(requirement.name)
        if name in seen or name in ("pip", "setuptools"):
            continue
        if requirement.marker and not requirement.marker.evaluate(IMAGE_PYTHON):
            continue
        seen.add(name)
        if name not in pinned:
            problems.append(f"{requirement} is not pinned in constraints.txt")
            continue
        try:
            installed = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            # only Debian's Python needs it (async-timeout below 3.11.3): pinned is all we know
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                problems.append(f"{name}=={pinned[name]} is not installed here to be read")
            continue
        assert installed.version == pinned[name], f"{name}: .venv is not constraints.txt"
        python = installed.metadata.get("Requires-Python") or ""
        if IMAGE_PYTHON["python_full_version"] not in SpecifierSet(python):
            problems.append(
                f"{name}=={pinned[name]} requires Python {python}; the image has Debian"
                f" bookworm's {IMAGE_PYTHON['python_full_version']}"
            )
        todo += [Requirement(r) for r in installed.requires or ()]
    assert not problems, "\n".join(problems)
    assert len(seen) > 30


#: Debian bookworm's python3, the image's: the environment markers are read for it.
IMAGE_PYTHON = {"python_version": "3.11", "python_full_version": "3.11.2", "extra": ""}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_image_copies_only_what_it_sends_and_runs_from_state() -> None:
    ignore = (CONTAINER / "Containerfile.dockerignore").read_text().splitlines()
    sent = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied = []
    for instruction in named("COPY"):
        *sources, _ = instruction.text.split()
        copied += [s.rstrip("/") for s in sources if not s.startswith("--")]
    assert set(copied) == sent
    for source in copied:
        assert (ROOT / source).exists(), source
    env = image_env()
    assert env["PYTHONPATH"] == "/opt/fleetcrawl/app"
    assert env["SCRAPY_SETTINGS_MODULE"] == "project.settings"
    (workdir,) = named("WORKDIR")
    assert workdir.text == env["HOME"] == "/var/lib/fleetcrawl"


def _script(name: str, tmp_path: Path) -> Path:
    """deploy/container/NAME with the image's paths pointing into this checkout; its ``scrapy``
    only says how it was called."""
    text = (CONTAINER / name).read_text()
    text = text.replace("/opt/fleetcrawl/.venv/bin/scrapy", "echo scrapy")
    text = text.replace("/opt/fleetcrawl/.venv", str(ROOT / ".venv"))
    text = text.replace("/opt/fleetcrawl/app", str(ROOT))
    script = tmp_path / name
    script.write_text(text)
    script.chmod(0o755)
    return script


@pytest.mark.parametrize(
    ("args", "crawls"),
    [
        ([], "products"),
        (["books"], "books"),
        (["books", "-s", "FRONTIER_KEEP_ALIVE=True"], "books -s FRONTIER_KEEP_ALIVE=True"),
        (["-s", "LOG_LEVEL=DEBUG"], "products -s LOG_LEVEL=DEBUG"),
    ],
)
def test_the_image_command_crawls_the_spider_named_keeping_its_health(
    args: list[str], crawls: str, tmp_path: Path
) -> None:
    assert os.access(CONTAINER / "fleetcrawl-node", os.X_OK)
    (entrypoint,) = named("ENTRYPOINT")
    assert entrypoint.exec_form() == ["/usr/bin/tini", "--", "fleetcrawl-node"]
    (cmd,) = named("CMD")
    assert cmd.exec_form() == ["products"]
    done = subprocess.run(
        [_script("fleetcrawl-node", tmp_path), *args], capture_output=True, text=True, check=True
    )
    spider, *rest = crawls.split(" ", 1)
    health = health_file()
    expected = f"scrapy crawl {spider} -s FLEET_HEALTH_FILE={health} {' '.join(rest)}"
    assert done.stdout.strip() == expected.strip()


def health_file() -> str:
    """Where the image's node keeps its health file (fleetcrawl-node's -s FLEET_HEALTH_FILE)."""
    script = (CONTAINER / "fleetcrawl-node").read_text()
    (path,) = re.findall(r"^exec .* -s FLEET_HEALTH_FILE=(\S+)", script, re.MULTILINE)
    return path


def healthcheck() -> list[str]:
    (check,) = named("HEALTHCHECK")
    return check.exec_form()


def test_the_image_healthcheck_reads_the_file_its_node_keeps(tmp_path: Path) -> None:
    assert healthcheck() == ["fleetcrawl", "probe", "live", "--file", health_file()]
    # the image's fleetcrawl command is the console script pyproject declares
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fleetcrawl"] == "project.ops.cli:main"
    assert "-m project.ops.cli" in (CONTAINER / "fleetcrawl").read_text()
    missing = tmp_path / "missing"
    done = subprocess.run(
        [_script("fleetcrawl", tmp_path), *healthcheck()[1:-1], str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done
    assert f"no health file at {missing}" in done.stderr


# -- against a real node -------------------------------------------------------------------------


@pytest.mark.crawl
@pytest.mark.timeout(BUILD_TIMEOUT)
@pytest.mark.slow("the preStop hook waits out the node's default 20 s stop grace")
def test_the_probe_and_prestop_commands_work_against_a_real_node(
    kube: Kube, fleet: Fleet, make_shop, mongo, tmp_path: Path
) -> None:
    """The manifests' node command, probes and preStop hook, and the image's HEALTHCHECK, run
    against a real node (their path to the health file moved to this test's folder): ready and
    live while it crawls, and the hook stops it with its default grace inside its wait, some
    downloads hanging."""
    spec = container(
        find(documents(kube.render(KUBERNETES / "base")), "Deployment", "fleetcrawl-node")
    )
    settings = scrapy_settings(spec["args"])
    path = settings["FLEET_HEALTH_FILE"]
    here = str(tmp_path / "fleetcrawl" / "health")

    def command(argv: list[str]) -> list[str]:
        assert argv[0] == "fleetcrawl"
        return [here if arg == path else arg for arg in argv[1:]]

    ready = command(spec["readinessProbe"]["exec"]["command"])
    live = command(spec["livenessProbe"]["exec"]["command"])
    stop = command(spec["lifecycle"]["preStop"]["exec"]["command"])
    image_live = command([here if a == health_file() else a for a in healthcheck()])

    def run(argv: list[str]) -> int:
        return run_cli(*argv, env={}, timeout=60).returncode

    assert run(ready) == 1  # no node yet
    assert run(stop) == 0  # nothing to stop
    shop = make_shop(products=40, latency_ms=20, slow_share=0.15, slow_ms=120_000)
    proc = fleet.start_node(**{**settings, "FLEET_HEALTH_FILE": here})
    fleet.seed(shop.url("/"))
    wait_for(lambda: run(ready) == 0, 90, "the readiness probe to pass", interval=0.5)
    assert run(live) == 0
    assert run(image_live) == 0
    # some products stored, so slow product pages are downloading
    wait_for(lambda: mongo.products.estimated_document_count() >= 5, 90, "products stored", 0.2)
    assert proc.poll() is None, fleet.log(0)[-3000:]

    asked = time.monotonic()
    done = run_cli(*stop, env={}, timeout=60)
    took = time.monotonic() - asked
    assert done.returncode == 0, (done.stdout, done.stderr, fleet.log(0)[-3000:])
    assert "stopped" in done.stdout
    assert proc.wait(5) == 0
    wait_seconds = float(stop[stop.index("--wait") + 1])
    assert took < wait_seconds
    stats = fleet.stats(0)
    assert stats["finish_reason"] == "shutdown"
    assert stats["fleet/stop/signal"] == "SIGTERM"
    print(f"stopped in {took:.1f} s, {stats.get('fleet/stop/cut', 0)} downloads cut")
    assert run(live) == 1  # gone
