"""Every setting is reachable as the reference says (docs/reference/settings.md): as its
environment variable, as `--set NAME=VALUE` on the command line, and by the flag it names,
which exists."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from cronstream.cli import cli
from cronstream.cli.common import CliState, setting_assignments
from cronstream.shared.settings import ENV_PREFIX, Settings

SETTINGS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "settings.md"
SETTABLE = sorted(set(Settings.model_fields) - {"kafka_config"})
# A valid value for each setting that differs from its default.
SAMPLES: dict[str, str] = {
    "kafka_bootstrap_servers": "k1:9092", "database_url": "postgresql://u@db/x", "topic_prefix": "p.",
    "instance_id": "i-1", "http_port": "1234", "http_bind": "127.0.0.2", "log_level": "DEBUG",
    "log_format": "json", "ui_bind": "0.0.0.0", "ui_identity_header": "X-User", "ui_token": "t" * 20,
    "ui_session_key": "k" * 20, "ui_protect_reads": "true", "worker_id": "w9", "worker_queues": "a,b",
    "topic_min_insync_replicas": "2", "topic_replication_factor": "3",
    "worker_allow_shell": "/bin/true,/bin/echo", "ui_allowed_hosts": "a.example,b.example",
    "ui_token_login": "false", "ui_trusted_proxies": "10.0.0.0/8,127.0.0.1",
    "ui_metrics_token": "m" * 20, "scheduler_data_dir": "/var/lib/cronstream/scheduler",
}


def sample(name: str) -> str:
    if name in SAMPLES:
        return SAMPLES[name]
    default = Settings.model_fields[name].default
    assert isinstance(default, int | float), f"give {name} a sample value"
    return str(default + 1 if name != "analytics_success_rate_percent" else default - 1)


def table() -> list[tuple[str, str]]:
    """(variable, own flag) of each row of the reference's table of settings."""
    rows = re.findall(r"^\| `(CRONSTREAM_[A-Z_<>]+)` \|.*\| *(.*?) *\| [^|]* \|$", SETTINGS_PAGE.read_text(),
                      re.MULTILINE)
    assert rows, "docs/reference/settings.md has a table of settings"
    return [(variable, "" if flag == "—" else flag) for variable, flag in rows]


def test_the_reference_lists_every_setting_and_nothing_else() -> None:
    listed = {variable for variable, _ in table()}
    assert listed == {ENV_PREFIX + name.upper() for name in SETTABLE} | {"CRONSTREAM_KAFKA_<PROPERTY>"}


def test_every_flag_the_reference_names_exists_on_its_command() -> None:
    # "`--flag`" (the top-level command), "`command --flag`" or "`--flag` (a, b, ...)".
    for variable, cell in table():
        found = re.fullmatch(r"`(?:(\w+) )?(--[\w-]+)(?: KEY=VALUE)?`(?: \(([\w, ]+)\))?", cell)
        if not cell:
            continue
        assert found, f"{variable}: cannot read {cell!r}"
        command, option, commands = found.groups()
        names = commands.split(", ") if commands else [command] if command else [None]
        for name in names:
            group = cli if name is None else cli.commands[name]
            options = {o for p in group.params if isinstance(p, click.Option) for o in p.opts}
            assert option in options, f"{variable}: {option} is not an option of {name or 'cronstream'}"


@pytest.mark.parametrize("name", SETTABLE)
def test_set_reaches_every_setting(name: str) -> None:
    from_env = getattr(Settings.from_env(environ={ENV_PREFIX + name.upper(): sample(name)}), name)
    assert from_env != Settings.model_fields[name].get_default(call_default_factory=True)
    for spelled in (name, ENV_PREFIX + name.upper()):
        settings = CliState(setting_assignments((f"{spelled}={sample(name)}",))).settings()
        assert getattr(settings, name) == from_env, spelled


def root(*args: str) -> CliState:
    """The state the top-level command leaves for its subcommand."""
    ctx = cli.make_context("cronstream", [*args, "jobs"])
    assert cli.callback is not None
    with ctx:
        ctx.invoke(cli.callback, **ctx.params)
    state = ctx.obj
    assert isinstance(state, CliState)
    return state


def test_a_settings_own_flag_wins_over_set_and_both_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRONSTREAM_WORKER_DEAD_AFTER_SECONDS", "60")
    monkeypatch.setenv("CRONSTREAM_HEARTBEAT_INTERVAL_SECONDS", "20")
    assert root().settings().worker_dead_after_seconds == 60
    state = root("--set", "worker_dead_after_seconds=7", "--set", "CRONSTREAM_RETENTION_DAYS=3",
                 "--heartbeat-interval-seconds", "2")
    settings = state.settings()
    assert (settings.worker_dead_after_seconds, settings.retention_days) == (7, 3)
    assert settings.heartbeat_interval_seconds == 2
    flagged = root("--set", "worker_dead_after_seconds=7", "--worker-dead-after-seconds", "9")
    assert flagged.settings().worker_dead_after_seconds == 9


def test_a_bad_set_is_a_usage_error_that_names_the_setting() -> None:
    with pytest.raises(click.BadParameter, match="did you mean worker_dead_after_seconds"):
        root("--set", "worker_dead_afer_seconds=3")
    with pytest.raises(click.UsageError, match="CRONSTREAM_WORKER_DEAD_AFTER_SECONDS"):
        root("--set", "worker_dead_after_seconds=soon").settings()
