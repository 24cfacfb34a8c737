"""Every ``fleetcrawl`` command that fails exits non-zero with one line that names what failed
and what to do, and no traceback."""

from __future__ import annotations

import socket
import uuid
from typing import TYPE_CHECKING

import pytest

from project.ops.processes import free_port
from tests.fleet import run_cli

if TYPE_CHECKING:
    import subprocess

REDIS_COMMANDS = [
    ("status",),
    ("status", "--json"),
    ("status", "--watch", "--interval", "0.2"),
    ("failures", "list"),
    ("failures", "list", "--json"),
    ("failures", "retry"),
    ("failures", "purge"),
    ("dashboard",),
]


def _one_error_line(run: subprocess.CompletedProcess[str], status: int, *words: str) -> str:
    assert run.returncode == status, (run.returncode, run.stdout, run.stderr)
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    (line,) = lines
    assert line.startswith("error: "), line
    for word in words:
        assert word in line, (word, line)
    return line


@pytest.fixture
def unreachable_redis() -> str:
    """A Redis URL with nothing listening behind it."""
    return f"redis://127.0.0.1:{free_port()}/0"


@pytest.mark.parametrize("command", REDIS_COMMANDS, ids=" ".join)
def test_commands_fail_in_one_line_when_redis_is_unreachable(
    unreachable_redis: str, command: tuple[str, ...]
) -> None:
    port = ("--port", str(free_port())) if command[0] == "dashboard" else ()
    run = run_cli(*command, *port, env={"REDIS_URL": unreachable_redis})
    _one_error_line(run, 1, unreachable_redis, "unreachable", "REDIS_URL")


def test_commands_name_a_password_redis_refuses(redis_url: str, redis_client) -> None:
    user = f"fleet{uuid.uuid4().hex[:8]}"
    redis_client.acl_setuser(user, enabled=True, passwords=["+right"], commands=["+@all"])
    try:
        wrong = redis_url.replace("redis://", f"redis://{user}:wrong@")
        for command in (("status", "--json"), ("failures", "list"), ("dashboard",)):
            run = run_cli(*command, env={"REDIS_URL": wrong})
            line = _one_error_line(run, 1, "refused the credentials", "REDIS_URL")
            assert "wrong" not in line, "the password is masked"
    finally:
        redis_client.acl_deluser(user)


def test_dashboard_fails_in_one_line_when_its_port_is_taken(redis_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = run_cli("dashboard", "--port", str(port), env={"REDIS_URL": redis_url})
    _one_error_line(run, 1, f"cannot listen on 127.0.0.1:{port}", "--port")


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (("status",), {"REDIS_URL": "http://127.0.0.1:1/"}, ["not a Redis URL"]),
        (("failures", "list"), {"REDIS_URL": "localhost:6379"}, ["not a Redis URL"]),
        (("status", "-s", "FRONTIER_SITE_RATE=fast"), {}, ["FRONTIER_SITE_RATE"]),
        (("dashboard",), {"DASHBOARD_USERNAME": "ops", "DASHBOARD_PASSWORD": ""},
         ["DASHBOARD_USERNAME and DASHBOARD_PASSWORD"]),
        (("dashboard",), {"DASHBOARD_ALLOWED_HOSTS": "a:b:c"}, ["DASHBOARD_ALLOWED_HOSTS"]),
    ],
)  # fmt: skip
def test_bad_configuration_is_one_line_and_exit_2(
    unreachable_redis: str, args: tuple[str, ...], env: dict[str, str], words: list[str]
) -> None:
    run = run_cli(*args, env={"REDIS_URL": unreachable_redis, **env})
    _one_error_line(run, 2, *words)


def test_retry_keeps_a_dead_letter_that_is_not_json_without_a_traceback(
    redis_url: str, redis_client, keyspace, keys
) -> None:
    redis_client.lpush(keys.dead, b"{not json \x1b[2J")
    run = run_cli("failures", "retry", *keyspace.cli_args(), env={"REDIS_URL": redis_url})
    assert "Traceback" not in run.stderr
    assert run.returncode == 0, run.stderr
    assert redis_client.llen(keys.dead) == 1, "kept, not destroyed"
