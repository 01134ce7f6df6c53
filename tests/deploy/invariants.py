"""What every rendered cronstream manifest must satisfy; each check returns its problems.

Kept apart from the tests so that the tests can also feed each check a broken copy of a
manifest and see it complain (a check that cannot fail proves nothing).
"""

from __future__ import annotations

import ipaddress
import re
import ssl
from functools import cache
from typing import Any

from cronstream.services.scheduler.service import SchedulerService
from cronstream.shared.lifecycle import DEFAULT_SHUTDOWN_SECONDS
from cronstream.shared.settings import ENV_PREFIX, SERVICE_PORTS, Settings, SettingsError
from tests.deploy.manifests import (
    LONG_RUNNING_KINDS,
    Container,
    Workload,
    find,
    is_kafka_passthrough,
    kafka_config_error,
    known_env_names,
    matches,
    selects,
    workloads,
)

# The worker needs this much time after its drain grace to re-queue what still runs and
# close its Kafka clients before Kubernetes' SIGKILL (issue 12).
SHUTDOWN_MARGIN_SECONDS = 15
# Variables a cronstream container may set that are not cronstream's own.
FOREIGN_ENV_PREFIXES = ("OTEL_",)
# Containers that are not cronstream's and need a writable root filesystem (dev only):
# the Kafka image writes its generated server.properties under /opt/kafka, the
# PostgreSQL image its socket and lock files.
WRITABLE_ROOT = {"StatefulSet/kafka/kafka", "StatefulSet/postgres/postgres"}
# A PEM bundle standing in for a mounted CA file when librdkafka checks a configuration.
STAND_IN_CA = ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
# Services whose Kafka transactional.id is named after the instance, and the variable that
# names it (shared/settings.py; docs/decisions/0030): they must be StatefulSets named by
# their pod, so that a replacement fences its predecessor and no two pods share a name.
STABLE_IDENTITY = {"dispatcher": "CRONSTREAM_INSTANCE_ID", "worker": "CRONSTREAM_WORKER_ID"}
INSTANCE_NAMED = {"scheduler": "CRONSTREAM_INSTANCE_ID", "monitor": "CRONSTREAM_INSTANCE_ID",
                  "analytics": "CRONSTREAM_INSTANCE_ID"}
# Services that must never run twice at once (docs/decisions/0032): the analytics
# service's queue trends and fire ledger are global, a second instance would raise every
# alert again under its own alert_id. One replica, never autoscaled, and a Deployment
# must replace its pod with `Recreate` (a RollingUpdate runs old and new side by side).
SINGLE_INSTANCE = {"analytics"}
# Services no autoscaler may scale: analytics runs once; the clock's work is bounded by
# its shards and their jobs, not by a queue, and every process added or removed moves
# shards (docs/deploy.md, "Why no autoscaler scales the clock").
NOT_AUTOSCALED = {"analytics", "scheduler"}
# After SIGTERM a scheduler hands its shards over and stops within its own shutdown
# deadline (shared/lifecycle.py); the grace leaves this much more for the stack dump of a
# stop that overran, before Kubernetes' SIGKILL.
HANDOVER_MARGIN_SECONDS = 5
# Volumes a pod has to itself: a scheduler's stores on one of them are its own.
PER_POD_VOLUMES = ("emptyDir", "ephemeral")
# The commands that read PostgreSQL: only their containers get the database URL (it
# carries the database password).
DATABASE_READERS = {"init", "monitor", "ui"}
# Each connects as its own role (shared/db_roles.py), from the Secret of that role; only
# `init --roles` (an administrator's one-off, the dev overlay's init) uses another URL.
DATABASE_ROLE_SECRETS = {"init": "cronstream-database-owner", "monitor": "cronstream-database-writer",
                         "ui": "cronstream-database-reader"}
# Where Kafka credentials are given, each part has its own: the Secret
# `cronstream-kafka-<part>` (shared/acls.py names the parts after the commands).
KAFKA_PRINCIPAL_SECRET = "cronstream-kafka-{}"
# Where a command's HTTP server binds: (its CLI option, the Settings field behind it).
# The UI binds loopback by default, the services 0.0.0.0 (shared/settings.py).
HTTP_BIND = {"ui": ("--bind", "ui_bind")}
DEFAULT_HTTP_BIND = ("--http-bind", "http_bind")


def _pod_security(container: Container) -> list[str]:
    """Pod Security Standards, `restricted` profile, plus a read-only root filesystem."""
    problems = []
    pod_ctx = container.workload.pod.get("securityContext", {})
    ctx = container.spec.get("securityContext", {})

    def effective(key: str) -> Any:
        return ctx.get(key, pod_ctx.get(key))

    if effective("runAsNonRoot") is not True:
        problems.append(f"{container}: runAsNonRoot is not true")
    if effective("runAsUser") == 0:
        problems.append(f"{container}: runAsUser is 0 (root)")
    if ctx.get("allowPrivilegeEscalation") is not False:
        problems.append(f"{container}: allowPrivilegeEscalation is not false")
    if "ALL" not in ctx.get("capabilities", {}).get("drop", []):
        problems.append(f"{container}: capabilities do not drop ALL")
    if ctx.get("capabilities", {}).get("add"):
        problems.append(f"{container}: adds capabilities")
    if ctx.get("privileged"):
        problems.append(f"{container}: privileged")
    seccomp = (ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}).get("type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        problems.append(f"{container}: seccompProfile is {seccomp!r}, not RuntimeDefault")
    if ctx.get("readOnlyRootFilesystem") is not True and str(container) not in WRITABLE_ROOT:
        problems.append(f"{container}: readOnlyRootFilesystem is not true")
    return problems


def _resources(container: Container) -> list[str]:
    resources = container.spec.get("resources", {})
    return [f"{container}: no {kind}.{what}"
            for kind in ("requests", "limits") for what in ("cpu", "memory")
            if what not in resources.get(kind, {})]


def _probes(container: Container) -> list[str]:
    """Long-running containers are probed; cronstream's on /healthz (liveness, startup) and
    /readyz (readiness), on the port the container serves them on (CRONSTREAM_HTTP_PORT)."""
    if container.workload.kind not in LONG_RUNNING_KINDS or \
            container.spec in container.workload.pod.get("initContainers", []):
        return []
    probes = container.probes()
    problems = [f"{container}: no {kind}" for kind in ("livenessProbe", "readinessProbe")
                if kind not in probes]
    if not container.is_cronstream:
        return problems
    expected = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    env = container.env(lambda _name, _key: "", container.workload.pod_name())
    service = container.argv[0] if container.argv else "?"
    serving = int(env.get("CRONSTREAM_HTTP_PORT", SERVICE_PORTS.get(service, -1)))
    for kind, probe in probes.items():
        http = probe.get("httpGet")
        if http is None:
            problems.append(f"{container}: {kind} is not an httpGet probe")
            continue
        if http.get("path") != expected[kind]:
            problems.append(f"{container}: {kind} path {http.get('path')!r}, expected {expected[kind]!r}")
        port = container.port_number(http["port"])
        if port != serving:
            problems.append(f"{container}: {kind} port {port} but the service listens on {serving}")
    return problems


def _env(container: Container) -> list[str]:
    """Every variable is one `cronstream <command>` reads; pass-through ones are real
    librdkafka properties (with values librdkafka accepts)."""
    if not container.is_cronstream:
        return []
    known = known_env_names(container.argv)
    problems = []
    env = container.env(lambda _name, _key: "placeholder", container.workload.pod_name())
    passthrough = {}
    for name, source in sorted(container.env_names().items()):
        if name in known or name.startswith(FOREIGN_ENV_PREFIXES):
            continue
        if is_kafka_passthrough(name):
            passthrough[name] = env.get(name, "")
            continue
        problems.append(f"{container}: sets {name} (from {source}), which "
                        f"`cronstream {' '.join(container.argv)}` does not read")
    if passthrough.get("CRONSTREAM_KAFKA_SSL_CA_LOCATION"):
        # The CA comes from a mounted Secret (_ca_mounted checks the mount): librdkafka
        # loads it when the client is built, so give it a real PEM bundle in its place.
        passthrough["CRONSTREAM_KAFKA_SSL_CA_LOCATION"] = STAND_IN_CA
    error = kafka_config_error(passthrough)
    if error:
        problems.append(f"{container}: {error} (from {', '.join(sorted(passthrough))})")
    return problems


def _service_links(container: Container) -> list[str]:
    # Service links inject <SERVICE>_PORT=tcp://... for every Service in the namespace; a
    # Service named cronstream-kafka would set CRONSTREAM_KAFKA_PORT, read as librdkafka
    # property `port` (docs/decisions/0030).
    if container.is_cronstream and container.workload.pod.get("enableServiceLinks") is not False:
        return [f"{container}: enableServiceLinks is not false"]
    return []


def _drain_grace(container: Container) -> list[str]:
    if not container.is_cronstream or not container.argv or container.argv[0] != "worker":
        return []
    env = container.env(lambda _name, _key: "", container.workload.pod_name())
    drain = float(env.get("CRONSTREAM_WORKER_DRAIN_GRACE_SECONDS",
                          Settings.model_fields["worker_drain_grace_seconds"].default))
    grace = container.workload.pod.get("terminationGracePeriodSeconds", 30)
    if grace < drain + SHUTDOWN_MARGIN_SECONDS:
        return [f"{container}: terminationGracePeriodSeconds {grace} < drain grace {drain:g} "
                f"+ {SHUTDOWN_MARGIN_SECONDS} s"]
    return []


def _identity(container: Container) -> list[str]:
    if not container.is_cronstream or not container.argv:
        return []
    service = container.argv[0]
    variable = STABLE_IDENTITY.get(service) or INSTANCE_NAMED.get(service)
    if variable is None:
        return []
    problems = []
    if service in STABLE_IDENTITY and container.workload.kind != "StatefulSet":
        problems.append(f"{container}: {service} names its transactional.id after its instance "
                        f"and must be a StatefulSet, not a {container.workload.kind}")
    source = next((e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                   for e in container.spec.get("env", []) if e["name"] == variable), None)
    if source != "metadata.name":
        problems.append(f"{container}: {variable} does not come from the pod name (metadata.name)")
    return problems


def _ca_mounted(container: Container) -> list[str]:
    """A CA file librdkafka is told to load must be in a volume mounted in the container."""
    if not container.is_cronstream:
        return []
    env = container.env(lambda _name, _key: "", container.workload.pod_name())
    problems = []
    for name in ("CRONSTREAM_KAFKA_SSL_CA_LOCATION", "CRONSTREAM_KAFKA_SSL_CERTIFICATE_LOCATION",
                 "CRONSTREAM_KAFKA_SSL_KEY_LOCATION"):
        path = env.get(name)
        if not path:
            continue
        mounts = {m["mountPath"].rstrip("/"): m["name"] for m in container.spec.get("volumeMounts", [])}
        mount = next((m for m in mounts if path.startswith(m + "/")), None)
        if mount is None:
            problems.append(f"{container}: {name}={path} is in no mounted volume")
            continue
        volume = next(v for v in container.workload.pod.get("volumes", []) if v["name"] == mounts[mount])
        items = volume.get("secret", volume.get("configMap", {})).get("items")
        if items is not None and path[len(mount) + 1:] not in {i["path"] for i in items}:
            problems.append(f"{container}: {name}={path}: volume {volume['name']} has no such file")
    return problems


@cache
def is_secret(name: str) -> bool:
    """Whether cronstream keeps this variable's value out of its logs: the code's own word
    on what is secret (Settings.redacted() masks it with `***`), so a new secret setting
    is covered without listing it here."""
    probe = "postgresql://cronstream:probe-password@db.example:5432/cronstream"
    try:
        redacted = Settings.from_env(environ={name: probe}).redacted()
    except SettingsError:
        return False  # not a value this variable takes (a number, a pattern...)
    if is_kafka_passthrough(name):
        prop = name[len(ENV_PREFIX) + len("KAFKA_"):].lower().replace("_", ".")
        value = redacted["kafka_config"].get(prop)
    else:
        value = redacted.get(name[len(ENV_PREFIX):].lower())
    return isinstance(value, str) and "***" in value


def _secrets_from_secrets(container: Container) -> list[str]:
    """A secret (database URL, Kafka password, UI token and session key...) comes from a
    Secret by `secretKeyRef`, never from a literal in the manifest or a ConfigMap."""
    if not container.is_cronstream:
        return []
    problems = []
    from_secret = {e["name"] for e in container.spec.get("env", [])
                   if "secretKeyRef" in e.get("valueFrom", {})}
    for name, source in sorted(container.env_names().items()):
        if name.startswith(ENV_PREFIX) and is_secret(name) and name not in from_secret:
            where = "a literal value" if source == "env" else source
            problems.append(f"{container}: the secret {name} comes from {where}, not a Secret")
    return problems


def _database_url_only_where_read(container: Container) -> list[str]:
    if not container.is_cronstream or not container.argv:
        return []
    if "CRONSTREAM_DATABASE_URL" in container.env_names() and container.argv[0] not in DATABASE_READERS:
        return [f"{container}: gets CRONSTREAM_DATABASE_URL, but `cronstream {container.argv[0]}` "
                "does not read PostgreSQL (the URL carries its password)"]
    return []


def _secret_of(container: Container, variable: str) -> str | None:
    """The name of the Secret a variable comes from (without a generator's hash suffix)."""
    for env in container.spec.get("env", []):
        ref = env.get("valueFrom", {}).get("secretKeyRef") if env["name"] == variable else None
        if ref:
            name = str(ref["name"])
            # A Secret the overlay generates is named with a hash of its content.
            return re.sub(r"-[a-z0-9]{10}$", "", name) if container.workload.secret(name) is not None \
                else name
    return None


def _database_role(container: Container) -> list[str]:
    """The monitor writes as cronstream_writer, the UI reads as cronstream_reader, init
    migrates as cronstream_owner: never one URL for all (issue 49)."""
    if not container.is_cronstream or not container.argv or container.argv[0] not in DATABASE_ROLE_SECRETS:
        return []
    command = container.argv[0]
    source = _secret_of(container, "CRONSTREAM_DATABASE_URL")
    if source is None or source == DATABASE_ROLE_SECRETS[command]:
        return []
    if command == "init" and "--roles" in container.argv and source not in DATABASE_ROLE_SECRETS.values():
        return []  # an administrator's URL, to make the roles
    return [f"{container}: its database URL comes from the Secret {source}, not "
            f"{DATABASE_ROLE_SECRETS[command]} (its role's)"]


def _ui_token_beside_header(container: Container) -> list[str]:
    """Behind an SSO proxy the header names who acts: a shared token in the same pod would
    let whoever learns it act under any name."""
    if not container.is_cronstream or container.argv[:1] != ["ui"]:
        return []
    names = container.env_names()
    if "CRONSTREAM_UI_IDENTITY_HEADER" in names and "CRONSTREAM_UI_TOKEN" in names:
        return [f"{container}: sets both CRONSTREAM_UI_IDENTITY_HEADER and CRONSTREAM_UI_TOKEN"]
    return []


def _reachable_bind(container: Container) -> list[str]:
    """A service in a pod must listen on the pod's address: the kubelet probes it there, and
    the Service and Prometheus reach it there. Loopback passes a local test, not a cluster."""
    if not container.is_cronstream or not container.argv or \
            container.workload.kind not in LONG_RUNNING_KINDS:
        return []
    option, field = HTTP_BIND.get(container.argv[0], DEFAULT_HTTP_BIND)
    env = container.env(lambda _name, _key: "", container.workload.pod_name())
    given = next((arg.split("=", 1)[1] for arg in container.argv if arg.startswith(option + "=")),
                 None)
    if given is None and option in container.argv[:-1]:
        given = container.argv[container.argv.index(option) + 1]
    bind = given or env.get(ENV_PREFIX + field.upper()) or str(Settings.model_fields[field].default)
    try:
        loopback = ipaddress.ip_address(bind).is_loopback
    except ValueError:
        loopback = bind == "localhost"
    if loopback:
        return [f"{container}: serves HTTP on {bind} ({ENV_PREFIX}{field.upper()}): unreachable "
                "from the kubelet's probes, the Service and Prometheus"]
    return []


def _single_instance(container: Container) -> list[str]:
    if not container.is_cronstream or not container.argv or container.argv[0] not in SINGLE_INSTANCE:
        return []
    workload = container.workload
    problems = []
    if workload.replicas != 1:
        problems.append(f"{container}: {container.argv[0]} runs as one instance, but replicas is "
                        f"{workload.replicas}")
    strategy = workload.obj["spec"].get("strategy", {}).get("type", "RollingUpdate")
    if workload.kind == "Deployment" and strategy != "Recreate":
        problems.append(f"{container}: {container.argv[0]} must never run twice: strategy "
                        f"{strategy} starts the new pod before the old one stops (use Recreate)")
    return problems


def _mount_of(container: Container, path: str) -> dict[str, Any] | None:
    """The volume mount `path` is in (the deepest one), or None: on the root filesystem."""
    mounts = [m for m in container.spec.get("volumeMounts", [])
              if path == m["mountPath"].rstrip("/") or path.startswith(m["mountPath"].rstrip("/") + "/")]
    return max(mounts, key=lambda m: len(m["mountPath"]), default=None)


def _scheduler_shards(container: Container) -> list[str]:
    """A scheduler keeps its shards' stores in a data directory of its own, on a writable
    volume of its pod (a cache of Kafka: an emptyDir will do); it hands its shards over on
    SIGTERM within its grace; there are two of them at least, or no shard has a standby."""
    if not container.is_cronstream or container.argv[:1] != ["scheduler"]:
        return []
    workload = container.workload
    problems = []
    env = container.env(lambda _name, _key: "", workload.pod_name())
    data_dir = env.get("CRONSTREAM_SCHEDULER_DATA_DIR")
    mount = _mount_of(container, data_dir) if data_dir else None
    volume: dict[str, Any] = next((v for v in workload.pod.get("volumes", [])
                                   if mount and v["name"] == mount["name"]), {})
    if not data_dir:
        problems.append(f"{container}: CRONSTREAM_SCHEDULER_DATA_DIR is not set (the shards' stores "
                        "would go to a default under /tmp, sized for temporary files)")
    elif mount is None:
        problems.append(f"{container}: CRONSTREAM_SCHEDULER_DATA_DIR={data_dir} is in no mounted volume "
                        "(the root filesystem is read-only)")
    elif mount.get("readOnly") or not any(kind in volume for kind in PER_POD_VOLUMES):
        problems.append(f"{container}: CRONSTREAM_SCHEDULER_DATA_DIR={data_dir} is on volume "
                        f"{mount['name']}, which is not a writable volume of the pod's own "
                        f"({' or '.join(PER_POD_VOLUMES)})")
    deadline = getattr(SchedulerService, "shutdown_seconds", DEFAULT_SHUTDOWN_SECONDS)
    grace = workload.pod.get("terminationGracePeriodSeconds", 30)
    if grace < deadline + HANDOVER_MARGIN_SECONDS:
        problems.append(f"{container}: terminationGracePeriodSeconds {grace} < the scheduler's shutdown "
                        f"deadline {deadline:g} + {HANDOVER_MARGIN_SECONDS} s (its shards' handover)")
    if workload.replicas is not None and workload.replicas < 2:
        problems.append(f"{container}: {workload.replicas} scheduler(s): no shard has a standby")
    zones = [c for c in workload.pod.get("topologySpreadConstraints", [])
             if c.get("topologyKey") == "topology.kubernetes.io/zone"
             and matches(c.get("labelSelector", {}), workload.pod_labels)]
    if not zones:
        problems.append(f"{container}: no topology spread over topology.kubernetes.io/zone (a zone lost "
                        "would take a shard's leader and its standby together)")
    return problems


CONTAINER_CHECKS = (_pod_security, _resources, _probes, _env, _service_links, _drain_grace,
                    _identity, _ca_mounted, _secrets_from_secrets, _database_url_only_where_read,
                    _database_role, _ui_token_beside_header, _reachable_bind, _single_instance,
                    _scheduler_shards)


def _kafka_principals(objects: list[dict[str, Any]]) -> list[str]:
    """Where one cronstream container authenticates to Kafka, each does, as its own part:
    the Secret `cronstream-kafka-<command>`, so that the cluster's ACLs can tell a worker
    from the UI (shared/acls.py)."""
    containers = [c for w in workloads(objects) for c in w.containers(init=False)
                  if c.is_cronstream and c.argv]
    if not any("CRONSTREAM_KAFKA_SASL_USERNAME" in c.env_names() for c in containers):
        return []
    problems = []
    for container in containers:
        expected = KAFKA_PRINCIPAL_SECRET.format(container.argv[0])
        for variable in ("CRONSTREAM_KAFKA_SASL_USERNAME", "CRONSTREAM_KAFKA_SASL_PASSWORD"):
            source = _secret_of(container, variable)
            if source != expected:
                problems.append(f"{container}: {variable} comes from {source or 'no Secret'}, "
                                f"not {expected}: every part authenticates as its own principal")
    return problems


def _references(objects: list[dict[str, Any]]) -> list[str]:
    """Selectors select something; scale targets and ConfigMaps exist."""
    problems = []
    pods = [w.pod_labels for w in workloads(objects)]
    for kind in ("Service", "PodDisruptionBudget", "NetworkPolicy", "PodMonitor"):
        for obj in find(objects, kind):
            spec = obj["spec"]
            if kind == "Service":
                selector = spec.get("selector", {})
                found = any(selects(selector, labels) for labels in pods)
            else:
                selector = spec.get("podSelector", spec.get("selector", {}))
                found = bool(selector) and any(matches(selector, labels) for labels in pods)
            if not found:
                problems.append(f"{kind}/{obj['metadata']['name']}: selector {selector} selects no pod")
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for kind, path in (("HorizontalPodAutoscaler", "scaleTargetRef"), ("ScaledObject", "scaleTargetRef")):
        for obj in find(objects, kind):
            ref = obj["spec"][path]
            if (ref.get("kind", "Deployment"), ref["name"]) not in names:
                problems.append(f"{kind}/{obj['metadata']['name']}: scale target "
                                f"{ref.get('kind')}/{ref['name']} is not rendered")
    for workload in workloads(objects):
        for container in workload.containers():
            for source in container.spec.get("envFrom", []):
                ref = source.get("configMapRef", {}).get("name")
                if ref and workload.config_map(ref) is None and not source["configMapRef"].get("optional"):
                    problems.append(f"{container}: ConfigMap {ref} is not rendered")
    return problems


def _keda_matches_settings(objects: list[dict[str, Any]]) -> list[str]:
    """The lag trigger watches the brokers and the group the workers really use."""
    problems = []
    config = {k: v for cm in find(objects, "ConfigMap", None) for k, v in cm.get("data", {}).items()
              if k.startswith("CRONSTREAM_")}
    for obj in find(objects, "ScaledObject"):
        partitions = int(config.get("CRONSTREAM_TOPIC_PARTITIONS",
                                    Settings.model_fields["topic_partitions"].default))
        prefix = config.get("CRONSTREAM_TOPIC_PREFIX", Settings.model_fields["topic_prefix"].default)
        if obj["spec"].get("maxReplicaCount", 100) > partitions:
            problems.append(f"ScaledObject/{obj['metadata']['name']}: maxReplicaCount above the "
                            f"{partitions} partitions of the work topics (idle workers)")
        for trigger in obj["spec"]["triggers"]:
            if trigger["type"] != "kafka":
                continue
            meta = trigger["metadata"]
            if meta.get("bootstrapServers") != config.get("CRONSTREAM_KAFKA_BOOTSTRAP_SERVERS"):
                problems.append(f"ScaledObject/{obj['metadata']['name']}: bootstrapServers "
                                f"{meta.get('bootstrapServers')!r} differs from the services'")
            if meta.get("consumerGroup") != f"{prefix}workers":
                problems.append(f"ScaledObject/{obj['metadata']['name']}: consumerGroup "
                                f"{meta.get('consumerGroup')!r}, the workers' group is {prefix}workers")
    return problems


def _replicated(workload: Workload) -> bool:
    """Runs (or may be scaled to) more than one pod: an autoscaled one has no replicas."""
    return workload.kind in ("Deployment", "StatefulSet") and \
        (workload.replicas is None or workload.replicas > 1)


def _spread(objects: list[dict[str, Any]]) -> list[str]:
    """Replicated workloads spread their pods over nodes: one node lost takes one pod."""
    problems = []
    for workload in workloads(objects):
        if not _replicated(workload):
            continue
        spread = [c for c in workload.pod.get("topologySpreadConstraints", [])
                  if c.get("topologyKey") == "kubernetes.io/hostname"
                  and matches(c.get("labelSelector", {}), workload.pod_labels)]
        if not spread:
            problems.append(f"{workload}: {workload.replicas or 'autoscaled'} replicas and no "
                            "topology spread over kubernetes.io/hostname that selects its pods")
    return problems


def _disruption_budgets(objects: list[dict[str, Any]]) -> list[str]:
    """A replicated workload has a PodDisruptionBudget (a node drain takes one pod at a
    time); no budget blocks drains for good (minAvailable >= the replicas of one pod)."""
    problems = []
    budgets = find(objects, "PodDisruptionBudget")
    for workload in workloads(objects):
        if workload.kind not in LONG_RUNNING_KINDS:
            continue
        covering = [b for b in budgets if matches(b["spec"].get("selector", {}), workload.pod_labels)]
        if _replicated(workload) and not covering:
            problems.append(f"{workload}: replicated, but no PodDisruptionBudget selects its pods")
        for budget in covering:
            spec, replicas = budget["spec"], workload.replicas
            if replicas is None or isinstance(spec.get("minAvailable"), str):
                continue
            if spec.get("minAvailable", 0) >= replicas or spec.get("maxUnavailable") == 0:
                problems.append(f"PodDisruptionBudget/{budget['metadata']['name']}: blocks every "
                                f"node drain of {workload} ({replicas} replica(s))")
    return problems


def _network_policies(objects: list[dict[str, Any]]) -> list[str]:
    """Every cronstream pod is selected by a NetworkPolicy that admits its `http` port (the
    probes, the scrapes, the UI's users); every port a policy admits exists on a pod it
    selects (a misnamed port admits nothing)."""
    problems = []
    policies = find(objects, "NetworkPolicy")
    for workload in workloads(objects):
        if workload.kind not in LONG_RUNNING_KINDS:
            continue
        for container in workload.containers(init=False):
            if not container.is_cronstream or "http" not in container.ports():
                continue
            selecting = [p for p in policies if matches(p["spec"]["podSelector"], workload.pod_labels)]
            if not selecting:
                problems.append(f"{container}: no NetworkPolicy selects it (open to everything)")
                continue
            admitted = {port.get("port") for p in selecting for rule in p["spec"].get("ingress", [])
                        for port in rule.get("ports", [])}
            if not admitted & {"http", container.ports()["http"]}:
                problems.append(f"{container}: no NetworkPolicy admits its http port "
                                f"(admitted: {sorted(map(str, admitted))})")
    for policy in policies:
        selected = [w for w in workloads(objects) if matches(policy["spec"]["podSelector"], w.pod_labels)]
        named = {name for w in selected for c in w.containers() for name in c.ports()}
        for rule in policy["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                if isinstance(port.get("port"), str) and port["port"] not in named:
                    problems.append(f"NetworkPolicy/{policy['metadata']['name']}: admits port "
                                    f"{port['port']!r}, which no pod it selects has")
    return problems


def _not_autoscaled(objects: list[dict[str, Any]]) -> list[str]:
    commands = {w.name: c.argv[0] for w in workloads(objects) for c in w.containers()
                if c.is_cronstream and c.argv and c.argv[0] in NOT_AUTOSCALED}
    why = {"analytics": "which must run as one instance",
           "scheduler": "the clock, whose work its shards bound, not a queue"}
    return [f"{obj['kind']}/{obj['metadata']['name']}: scales {target}, {why[commands[target]]}"
            for kind in ("HorizontalPodAutoscaler", "ScaledObject") for obj in find(objects, kind)
            if (target := obj["spec"]["scaleTargetRef"]["name"]) in commands]


def _scheduler_budget(objects: list[dict[str, Any]]) -> list[str]:
    """A drain takes one scheduler at a time: two at once could take a shard's leader and
    its standby together (a cold takeover, read from Kafka)."""
    problems = []
    for workload in workloads(objects):
        if not any(c.is_cronstream and c.argv[:1] == ["scheduler"] for c in workload.containers()):
            continue
        for budget in find(objects, "PodDisruptionBudget"):
            spec = budget["spec"]
            if not matches(spec.get("selector", {}), workload.pod_labels):
                continue
            down = spec.get("maxUnavailable")
            if down is None and isinstance(spec.get("minAvailable"), int) and workload.replicas:
                down = workload.replicas - spec["minAvailable"]
            if isinstance(down, str) or (down is not None and down > 1):
                problems.append(f"PodDisruptionBudget/{budget['metadata']['name']}: lets {down} schedulers "
                                "go at once (maxUnavailable: 1)")
    return problems


def problems(objects: list[dict[str, Any]]) -> list[str]:
    found: list[str] = []
    for workload in workloads(objects):
        for container in workload.containers():
            for check in CONTAINER_CHECKS:
                found.extend(check(container))
    found.extend(_references(objects))
    found.extend(_keda_matches_settings(objects))
    found.extend(_spread(objects))
    found.extend(_disruption_budgets(objects))
    found.extend(_network_policies(objects))
    found.extend(_not_autoscaled(objects))
    found.extend(_scheduler_budget(objects))
    found.extend(_kafka_principals(objects))
    return found


__all__ = ["Workload", "problems"]
