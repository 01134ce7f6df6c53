"""Settings: `CRONSTREAM_*` environment variables, overridable by CLI flags (docs/reference/settings.md).

Every setting has a default and is validated when a service starts, so a typo fails
the start with the variable's name instead of misbehaving later. Any librdkafka
property passes through as `CRONSTREAM_KAFKA_<PROPERTY>` with dots written as
underscores (`CRONSTREAM_KAFKA_SECURITY_PROTOCOL=SASL_SSL` → `security.protocol`),
or as `--kafka-config key=value` on the command line. Secrets never appear in logs:
`Settings.redacted()` is what services print.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from cronstream.shared.records import QueueName
from cronstream.shared.redaction import MASK, is_secret_name, redact_url
from cronstream.shared.topics import Topics

ENV_PREFIX = "CRONSTREAM_"
KAFKA_PASSTHROUGH_PREFIX = "CRONSTREAM_KAFKA_"
# Settings written as comma-separated lists in the environment.
LIST_SETTINGS = frozenset({"worker_queues", "ui_allowed_hosts", "ui_trusted_proxies"})
# ... and one written one entry per line (a shell command's argv may hold commas).
LINE_LIST_SETTINGS = frozenset({"worker_allow_shell"})
# The dashboard's tokens: shorter ones are refused at start.
MIN_TOKEN_LENGTH = 16
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$|^[0-9a-f:.]+$")


# Default HTTP ports, distinct so that `cronstream dev` runs every service side by side.
SERVICE_PORTS: dict[str, int] = {
    "scheduler": 9181,
    "dispatcher": 9182,
    "worker": 9183,
    "monitor": 9184,
    "analytics": 9185,
    "ui": 8180,
}


def _host(host: str) -> str:
    host = host.lower().rstrip(".")
    if host != "*" and not _HOSTNAME.match(host):
        raise ValueError(f"{host!r} is not a host name or an IP address (no port, no scheme)")
    return host


def _network(network: str) -> str:
    try:
        ipaddress.ip_network(network, strict=False)
    except ValueError:
        raise ValueError(f"{network!r} is not an IP address or a CIDR network") from None
    return network


def _shell_entry(entry: str) -> str:
    """Checked in full where it is used (services/worker/shell.py); a pattern, never."""
    if entry in ("*", "all") or entry.startswith("-"):
        raise ValueError(f"{entry!r}: name each command the shell handler may run (NAME=ARGV, "
                         "or an executable run with no argument), not a pattern")
    return entry


_ITEM_RULES: dict[str, Callable[[str], str]] = {
    "ui_allowed_hosts": _host, "ui_trusted_proxies": _network, "worker_allow_shell": _shell_entry}


def from_text(name: str, raw: str) -> Any:
    """A setting's value as written in the environment or `--set`: lists split."""
    if name in LIST_SETTINGS:
        return raw.split(",")
    return raw.split("\n") if name in LINE_LIST_SETTINGS else raw


def default_scheduler_data_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"cronstream-{os.getuid()}", "scheduler")


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class SettingsError(ValueError):
    """A setting is missing or invalid; the message names the variable, `names` the
    settings at fault (`topic_prefix`, ...)."""

    def __init__(self, message: str, names: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.names = tuple(names)


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kafka_bootstrap_servers: str = "localhost:9092"
    database_url: str = "postgresql://postgres@localhost:5432/cronstream"
    topic_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{0,100}$")] = "cronstream."
    topic_partitions: Annotated[int, Field(ge=1, le=1000)] = 6
    # Production clusters: `cronstream init` creates topics with this replication factor and
    # min.insync.replicas (-1 / None: the broker's defaults).
    topic_replication_factor: Annotated[int, Field(ge=-1, le=32)] = -1
    topic_min_insync_replicas: Annotated[int, Field(ge=1, le=32)] | None = None
    heartbeat_interval_seconds: Annotated[float, Field(gt=0)] = 30
    worker_dead_after_seconds: Annotated[float, Field(gt=0)] = 90
    worker_concurrency: Annotated[int, Field(ge=1, le=10_000)] = 8
    worker_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:@-]{1,128}$")] = Field(
        default_factory=default_worker_id
    )
    worker_queues: list[QueueName] = Field(default_factory=lambda: ["default"])
    worker_drain_grace_seconds: Annotated[float, Field(ge=0)] = 30
    # A worker whose group join has not come back for this long starts over with a fresh
    # consumer (services/worker/service.py: _rejoin). Rebalances take seconds.
    worker_rejoin_after_seconds: Annotated[float, Field(gt=0)] = 30
    # An attempt's log keeps at most this many bytes (the rest is counted and said), and a
    # worker ships at most this many bytes of logs a second (services/worker/capture.py, logs.py).
    worker_log_limit_bytes: Annotated[int, Field(ge=1024, le=1 << 30)] = 1 << 20
    worker_log_rate_bytes: Annotated[int, Field(ge=1024, le=1 << 30)] = 4 << 20
    # The commands the built-in `shell` handler may run (`--allow-shell`): `NAME=ARGV` with
    # typed placeholders, or executables run with no argument; empty: the handler is not
    # registered (services/worker/shell.py).
    worker_allow_shell: list[str] = Field(default_factory=list)
    scheduler_session_timeout_ms: Annotated[int, Field(ge=1000, le=300_000)] = 6_000
    # Shards of the clock: the partitions `init` gives job-definitions, scheduler-state and
    # retries (fixed once the topics exist: services read the count from them).
    scheduler_shards: Annotated[int, Field(ge=1, le=1024)] = 16
    # Warm standbys of every shard, on other scheduler processes (as many as there are).
    scheduler_standbys: Annotated[int, Field(ge=0, le=8)] = 1
    # Where a scheduler keeps its shards' stores (a cache of Kafka: losing it costs a read).
    scheduler_data_dir: str = Field(default_factory=default_scheduler_data_dir)
    # The leader commits the fires of ALLOW jobs up to this long before they are due, and
    # the workers start them at their scheduled_at, never before: the hops in between no
    # longer add to the start lag (docs/decisions/0027). 0: fire when due.
    scheduler_fire_ahead_ms: Annotated[int, Field(ge=0, le=1000)] = 300
    # A stable name for this instance (scheduler, dispatcher, monitor, analytics): its
    # transactional.id and client ids derive from it, so a restarted instance fences and
    # aborts its predecessor. On Kubernetes: the pod name of a StatefulSet.
    instance_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:@-]{1,128}$")] | None = None
    # HTTP for /metrics, /healthz, /readyz; None = the service's default port (SERVICE_PORTS),
    # or a free one when that is taken (health.open_http); 0 = any free port (logged as
    # action=http_serving).
    http_port: Annotated[int, Field(ge=0, le=65535)] | None = None
    http_bind: str = "0.0.0.0"
    kafka_config: dict[str, str] = Field(default_factory=dict)
    log_level: str = "INFO"
    log_format: Literal["logfmt", "json"] = "logfmt"
    # `cronstream ui` (docs/decisions/0040): actions need the token (bearer or login
    # session) or an identity header set by a trusted proxy; reads are open unless
    # ui_protect_reads. ui_session_key signs sessions and CSRF tokens (shared by replicas).
    ui_bind: str = "127.0.0.1"
    ui_token: SecretStr | None = None
    ui_identity_header: Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")] | None = None
    ui_protect_reads: bool = False
    ui_session_key: SecretStr | None = None
    # Least privilege for the dashboard (docs/decisions/0041). Hosts it answers besides
    # loopback names, its bind address and its own IP address ("*": any; DNS rebinding);
    # token logins in identity-header mode (None: on only without a header); proxies whose
    # X-Forwarded-Proto / -For it believes (IPs or CIDRs: Secure cookies and HSTS behind
    # TLS, the client address for throttling and stream caps); a token for /metrics alone;
    # live streams per process and per client address.
    ui_allowed_hosts: list[str] = Field(default_factory=list)
    ui_token_login: bool | None = None
    ui_trusted_proxies: list[str] = Field(default_factory=list)
    ui_metrics_token: SecretStr | None = None
    ui_live_streams: Annotated[int, Field(ge=1, le=100_000)] = 500
    ui_live_streams_per_client: Annotated[int, Field(ge=1, le=100_000)] = 8
    # Retention (services/monitor/retention.py): the monitor deletes executions, their
    # events, resolved alerts and DAG evaluations older than this, every
    # retention_interval_seconds, retention_batch rows per transaction. 0 keeps everything.
    retention_days: Annotated[float, Field(ge=0, le=36500)] = 30
    retention_interval_seconds: Annotated[float, Field(ge=1)] = 3600
    retention_batch: Annotated[int, Field(ge=1, le=1_000_000)] = 1000
    # `cronstream analytics`: global alert thresholds (a job's `alerts:` block overrides them).
    analytics_success_rate_percent: Annotated[float, Field(ge=0, le=100)] = 99
    analytics_min_runs: Annotated[int, Field(ge=1)] = 10
    analytics_window_seconds: Annotated[float, Field(ge=1)] = 3600
    analytics_duration_factor: Annotated[float, Field(gt=1)] = 2
    analytics_recent_runs: Annotated[int, Field(ge=1, le=10_000)] = 5
    analytics_baseline_runs: Annotated[int, Field(ge=2, le=100_000)] = 50
    analytics_late_after_seconds: Annotated[float, Field(ge=0)] = 60
    analytics_queue_window_seconds: Annotated[float, Field(gt=0)] = 60
    analytics_queue_windows: Annotated[int, Field(ge=1, le=1000)] = 3
    # How much of execution-events a (re)started analytics service replays to rebuild its
    # windows; at least analytics_window_seconds.
    analytics_lookback_seconds: Annotated[float, Field(ge=1)] = 3600

    @field_validator("ui_token", "ui_metrics_token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_TOKEN_LENGTH:
            raise ValueError(f"at least {MIN_TOKEN_LENGTH} characters: a token is a password "
                             "anyone who reaches the dashboard may guess (`openssl rand -hex 24`)")
        return value

    @field_validator("ui_allowed_hosts", "ui_trusted_proxies", "worker_allow_shell")
    @classmethod
    def _items(cls, value: list[str], info: ValidationInfo) -> list[str]:
        """Each item of a comma-separated list, stripped, checked (and normalised) by its own rule."""
        check = _ITEM_RULES[info.field_name or ""]
        return [check(item.strip()) for item in value if item.strip()]

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        value = value.upper()
        if value not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR")
        return value

    def port_for(self, service: str) -> int:
        return self.http_port if self.http_port is not None else SERVICE_PORTS.get(service, 0)

    def instance(self, given: str | None = None) -> str:
        """This instance's stable name: the flag, CRONSTREAM_INSTANCE_ID, or hostname-pid."""
        return given or self.instance_id or default_worker_id()

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix, self.topic_partitions, self.scheduler_shards)

    @classmethod
    def from_env(
        cls, overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
    ) -> Settings:
        """Read `CRONSTREAM_*` from the environment; `overrides` (CLI flags) win."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        kafka_config: dict[str, str] = {}
        for name in cls.model_fields:
            if name == "kafka_config":
                continue
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is not None and raw != "":
                values[name] = from_text(name, raw)
        for key, raw in env.items():
            if key.startswith(KAFKA_PASSTHROUGH_PREFIX) and key != "CRONSTREAM_KAFKA_BOOTSTRAP_SERVERS":
                prop = key[len(KAFKA_PASSTHROUGH_PREFIX):].lower().replace("_", ".")
                kafka_config[prop] = raw
        for key, value in (overrides or {}).items():
            if value is None:
                continue
            if key == "kafka_config":
                kafka_config.update(value)
            else:
                values[key] = value
        values["kafka_config"] = kafka_config
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            problems = "; ".join(
                f"{ENV_PREFIX}{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
                for e in exc.errors()
            )
            raise SettingsError(f"invalid settings: {problems}",
                                dict.fromkeys(str(e["loc"][0]) for e in exc.errors() if e["loc"])) from None

    def redacted(self) -> dict[str, Any]:
        """The settings as a dict that is safe to log."""
        data = self.model_dump()
        data["database_url"] = redact_url(self.database_url)
        for secret in ("ui_token", "ui_session_key", "ui_metrics_token"):
            data[secret] = None if data[secret] is None else MASK
        # A librdkafka property named for a secret is never shown (sasl.password,
        # ssl.key.pem, sasl.oauthbearer.config, sasl.oauthbearer.client.secret, ...).
        data["kafka_config"] = {k: (MASK if is_secret_name(k) else v)
                                for k, v in self.kafka_config.items()}
        return data

