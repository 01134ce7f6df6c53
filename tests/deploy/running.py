"""Run rendered workloads as local processes, the way their pods would start them.

For each workload the container's command and args (after the image's ENTRYPOINT) run
with the environment the pod would get: the rendered ConfigMap, `env` values, Secret
values and the pod name from the downward API. A `Launcher` says how a command starts:
from this checkout's virtualenv (`local_launcher`), or from the built image's root
filesystem (tests/deploy/test_image.py).

The only changes, each to a value and never to a name, path or command:
- ConfigMap values that point at the cluster's Kafka (bootstrap servers, SASL_SSL, a
  replication factor of 3) point at the test's single plaintext broker, and the topic
  prefix is the test's own;
- the Secrets (not in the manifests) hold the test's database URL, as the role each one is
  for (an administrator makes the roles first with `cronstream init --roles`, as
  docs/deploy.md says), and dummy Kafka credentials (the broker is plaintext);
- each container port is mapped to a free port on this host (two pods may both listen on
  9183 in a cluster, not here): the port value in the container's env is replaced by the
  mapped one, and the probes go to the mapped port of the port they name.
So a wrong command, env name, port or probe path in a manifest fails `run_prod_end_to_end`.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from cronstream.cli.schedulers_cmd import scheduler_rows
from cronstream.shared.settings import Settings
from tests.deploy.manifests import (
    LONG_RUNNING_KINDS,
    ROOT,
    VARIANTS,
    Container,
    Workload,
    find,
    render,
    workloads,
)
from tests.support import as_role, eventually, run_now, sql

STARTUP_TIMEOUT = 120.0
# Like the kubelet (restartPolicy Always), a service container that exits is started again
# in the same pod (same name, same ports); more restarts than this fail the test.
MAX_RESTARTS = 3

# (argv prefix that stands for the image's ENTRYPOINT, base environment the image gives).
Launcher = Callable[[Path], tuple[list[str], dict[str, str]]]


def dockerfile_entrypoint() -> list[str]:
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("ENTRYPOINT "):
            return list(json.loads(line[len("ENTRYPOINT "):]))
    raise AssertionError("the Dockerfile has no ENTRYPOINT")


def local_launcher(tmp: Path) -> tuple[list[str], dict[str, str]]:
    """The Dockerfile's ENTRYPOINT as this virtualenv's console script of the same name."""
    argv = dockerfile_entrypoint()
    local = Path(sys.executable).parent / argv[0]
    assert local.exists(), f"ENTRYPOINT {argv[0]} is not installed beside {sys.executable}"
    # PYTHONPATH as the test has it: a worktree that shares another checkout's virtualenv
    # (whose editable install points at that checkout) runs its own code.
    path = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    return [str(local), *argv[1:]], {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "TMPDIR": str(tmp),
        "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", **path,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def http_request(port: int, path: str, method: str = "GET",
                 headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """One request, redirects not followed (a login redirect is an answer here)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode()
    finally:
        conn.close()


@dataclass
class Pod:
    """One container of a workload, run as a local process."""

    container: Container
    pod_name: str
    ports: dict[int, int]  # containerPort -> the free port it is mapped to here
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] = field(init=False)
    out: Any = field(init=False, repr=False)
    restarts: int = 0

    def __post_init__(self) -> None:
        self.out = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv, env=self.env, stdout=self.out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def restart(self) -> None:
        self.restarts += 1
        self.out.write(f"\n----- exit {self.proc.returncode}: restart {self.restarts} -----\n".encode())
        self.out.flush()
        self.proc = self._spawn()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def probe_port(self, probe: dict[str, Any]) -> int:
        return self.ports[self.container.port_number(probe["httpGet"]["port"])]

    def rss_mib(self) -> float:
        """Resident memory of the process (its children too: the worker's pool)."""
        try:
            proc = psutil.Process(self.proc.pid)
            procs = [proc, *proc.children(recursive=True)]
            return sum(p.memory_info().rss for p in procs) / 2**20
        except psutil.Error:
            return 0.0

    def stop(self, timeout: float) -> int | None:
        """SIGTERM, as the kubelet does; None if it is still running after `timeout`."""
        code: int | None = None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        else:
            code = self.proc.returncode
        self.out.close()
        return code


class Cluster:
    """The rendered objects, with the test's substitutions, and the processes started."""

    def __init__(self, objects: list[dict[str, Any]], config: dict[str, str],
                 secrets: dict[tuple[str, str], str], log_dir: Path, launcher: Launcher) -> None:
        self.objects = objects
        self.secrets = secrets
        self.log_dir = log_dir
        self.launcher = launcher
        self.pods: list[Pod] = []
        (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"
                         and o["metadata"]["name"].startswith("cronstream-config")]
        for key, value in config.items():
            assert key in config_map["data"], f"the ConfigMap does not set {key}"
            config_map["data"][key] = value

    def secret(self, name: str, key: str) -> str:
        assert (name, key) in self.secrets, f"unexpected Secret reference {name}/{key}"
        return self.secrets[(name, key)]

    def start(self, workload: Workload, index: int = 0) -> Pod:
        (container,) = workload.containers(init=False)
        pod_name = workload.pod_name(index)
        ports = {port: free_port() for port in container.ports().values()}
        env = container.env(self.secret, pod_name)
        if "CRONSTREAM_HTTP_PORT" in env and int(env["CRONSTREAM_HTTP_PORT"]) in ports:
            env["CRONSTREAM_HTTP_PORT"] = str(ports[int(env["CRONSTREAM_HTTP_PORT"])])
        entrypoint, base = self.launcher(self.log_dir)
        # The harness's one addition: the services stop if the test process dies.
        base["CRONSTREAM_PARENT_PID"] = str(os.getpid())
        pod = Pod(container, pod_name, ports, [*entrypoint, *container.argv], {**base, **env},
                  self.log_dir / f"{pod_name}.log")
        self.pods.append(pod)
        return pod

    def stop_all(self) -> dict[str, int | None]:
        codes = {}
        for pod in reversed(self.pods):
            grace = pod.container.workload.pod.get("terminationGracePeriodSeconds", 30)
            codes[pod.pod_name] = pod.stop(grace)
        return codes


def wait_probe(pod: Pod, kind: str, timeout: float = STARTUP_TIMEOUT) -> None:
    probe = pod.container.probes()[kind]
    path, port = probe["httpGet"]["path"], pod.probe_port(probe)

    def answers() -> bool:
        if pod.proc.poll() is not None:
            if pod.restarts >= MAX_RESTARTS:
                raise AssertionError(f"{pod.pod_name} exited ({pod.proc.returncode}) after "
                                     f"{pod.restarts} restarts:\n{pod.log()[-3000:]}")
            pod.restart()
        status, _ = http_get(port, path)
        return status == 200

    eventually(answers, timeout, 0.5, message=f"{pod.pod_name} {kind} {path} on :{port}")


SERVICES = {"scheduler", "dispatcher", "worker", "monitor", "analytics", "ui"}


def service_port(cluster: Cluster, pods: dict[str, Pod], name: str) -> tuple[Pod, int]:
    """The pod behind Service `name` and the local port of the container port it targets."""
    (service,) = find(cluster.objects, "Service", name)
    (pod,) = [p for p in pods.values() if all(
        p.container.workload.pod_labels.get(k) == v for k, v in service["spec"]["selector"].items())]
    (port,) = service["spec"]["ports"]
    return pod, pod.ports[pod.container.port_number(port["targetPort"])]


def make_roles(database_url: str, tmp: Path) -> None:
    """What an administrator does once before the first `init` (docs/deploy.md)."""
    entrypoint, base = local_launcher(tmp)
    done = subprocess.run([*entrypoint, "init", "--roles", "--no-topics"],
                          env={**base, "CRONSTREAM_DATABASE_URL": database_url},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def check_ui(cluster: Cluster, pods: dict[str, Pod], database_url: str, token: str) -> None:
    """Through the `cronstream-ui` Service's port: pages need a login (prod protects reads),
    /jobs shows the job from PostgreSQL, a trigger with the token of the Secret
    `cronstream-ui` publishes to Kafka (the UI's own settings and credentials) and runs,
    and /schedulers lists every scheduler pod from the scheduler group."""
    _, port = service_port(cluster, pods, "cronstream-ui")
    status, headers, _ = http_request(port, "/jobs")
    assert status == 303 and headers["location"].startswith("/login"), (status, headers)
    bearer = {"Authorization": f"Bearer {token}"}

    def listed() -> bool:
        # The monitor projects the definition in its own batch, which may come after the
        # execution's (seen under load: the execution COMPLETED, the Jobs page still empty).
        status, _, page = http_request(port, "/jobs", headers=bearer)
        assert status == 200, (status, page[-2000:])
        return "k8s-hello" in page

    eventually(listed, timeout=30, message="/jobs listing k8s-hello")

    def triggered() -> str | None:
        status, _, body = http_request(port, "/jobs/k8s-hello/trigger", "POST", bearer)
        if status == 404:  # the monitor has not projected the definition yet
            return None
        assert status == 200, (status, body)
        answer = json.loads(body)
        assert answer["by"] == "api-token", answer
        match = re.search(r"execution ([0-9a-f-]{36})", answer["notice"])
        assert match, answer
        return match[1]

    execution = eventually(triggered, timeout=30, message="the UI knows k8s-hello")
    eventually(lambda: sql(database_url, "SELECT 1 FROM job_executions WHERE execution_id = $1 "
                                         "AND status = 'COMPLETED'", uuid.UUID(execution)),
               timeout=90, message="the run triggered from the UI COMPLETED in PostgreSQL")
    status, _, page = http_request(port, f"/executions/{execution}", headers=bearer)
    assert status == 200 and "k8s-hello" in page and "COMPLETED" in page, (status, page[-2000:])
    # The Schedulers page reads the scheduler group as the UI's own Kafka principal.
    schedulers = sorted(p.pod_name for p in cluster.pods if p.container.argv[:1] == ["scheduler"])
    status, _, page = http_request(port, "/schedulers", headers=bearer)
    assert status == 200, (status, page[-2000:])
    assert sorted(re.findall(r'data-scheduler-id="([^"]+)"', page)) == schedulers, page[-3000:]
    assert 'class="unled"' not in page


def scrape(pod: Pod, metric: str) -> float:
    """One unlabelled gauge of a pod's /metrics (NaN when it is not there)."""
    probe = pod.container.probes()["readinessProbe"]
    status, body = http_get(pod.probe_port(probe), "/metrics")
    found = re.search(rf"^{metric} (\S+)$", body, re.MULTILINE) if status == 200 else None
    return float(found[1]) if found else float("nan")


def check_schedulers(settings: Settings, schedulers: list[Pod]) -> None:
    """Every scheduler pod is a member of the group under its own pod name, with stores of
    its own in its data directory; together they lead every shard, each once, and keep a
    standby of each (`cronstream schedulers`, and what each pod's metrics say it leads)."""
    names = sorted(pod.pod_name for pod in schedulers)
    assert len(set(names)) == len(schedulers) > 1, names

    def roles() -> list[dict[str, Any]] | None:
        rows, shards = scheduler_rows(settings)
        if sorted(r["scheduler_id"] for r in rows) != names:
            return None
        assert shards == settings.scheduler_shards, shards
        led = sorted(s for r in rows for s in r["leads"])
        standing_by = sorted(s for r in rows for s in r["standby"])
        assert led == standing_by == list(range(shards)), rows
        assert all(set(r["leads"]).isdisjoint(r["standby"]) for r in rows), rows
        return rows

    rows = eventually(roles, timeout=60, interval=1.0, message=f"{names} members of the scheduler group")

    def taken_over() -> bool:
        led = [scrape(pod, "cronstream_scheduler_shards_led") for pod in schedulers]
        return sum(led) == settings.scheduler_shards and all(n > 0 for n in led)

    eventually(taken_over, timeout=90, interval=1.0, message="every shard led, by every scheduler")
    assert {scrape(pod, "cronstream_scheduler_shards") for pod in schedulers} == {settings.scheduler_shards}
    for pod in schedulers:
        stores = Path(pod.env["CRONSTREAM_SCHEDULER_DATA_DIR"]) / settings.topic_prefix.rstrip(".") / pod.pod_name
        (row,) = [r for r in rows if r["scheduler_id"] == pod.pod_name]
        kept = {int(p.stem.removeprefix("shard-")) for p in stores.glob("shard-*.sqlite")}
        assert set(row["leads"]) | set(row["standby"]) <= kept, (pod.pod_name, sorted(kept), row)


def start_ready(cluster: Cluster, services: list[Workload]) -> tuple[dict[str, Pod], list[Pod]]:
    """A pod of each service (by workload name), and the schedulers: as many as the
    Deployment's replicas, each a pod of its own name (the downward API), sharing the
    shards. Every one alive, then ready, on its own probes."""
    pods = {w.name: cluster.start(w) for w in services}
    first = pods["cronstream-scheduler"]
    schedulers = [first, *(cluster.start(first.container.workload, i)
                           for i in range(1, first.container.workload.replicas or 1))]
    for pod in [*pods.values(), *schedulers[1:]]:
        probes = pod.container.probes()
        wait_probe(pod, "startupProbe" if "startupProbe" in probes else "livenessProbe")
        wait_probe(pod, "livenessProbe")
    for pod in [*pods.values(), *schedulers[1:]]:
        wait_probe(pod, "readinessProbe")
    return pods, schedulers


def run_prod_end_to_end(kafka: str, database_url: str, tmp_path: Path, launcher: Launcher) -> None:
    """Init, then every service and the UI ready on their own probes (the schedulers as
    many as their replicas, sharing the shards), /metrics where each Service points, a
    ONE_TIME job COMPLETED in PostgreSQL on the worker named after its pod, the UI showing
    it and running it again, and every process stopped by SIGTERM with exit code 0 within
    its terminationGracePeriodSeconds."""
    prefix = f"k8s{uuid.uuid4().hex[:10]}."
    ui_token, scrape_token = uuid.uuid4().hex, uuid.uuid4().hex
    make_roles(database_url, tmp_path)
    kafka_users = {(f"cronstream-kafka-{part}", key): "unused-over-plaintext" if key == "password"
                   else f"cronstream-{part}"
                   for part in ("scheduler", "dispatcher", "worker", "monitor", "analytics", "ui", "init")
                   for key in ("username", "password")}
    cluster = Cluster(
        render(*VARIANTS["prod"]),
        config={
            "CRONSTREAM_KAFKA_BOOTSTRAP_SERVERS": kafka,
            "CRONSTREAM_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT",
            "CRONSTREAM_TOPIC_PREFIX": prefix,
            "CRONSTREAM_TOPIC_REPLICATION_FACTOR": "1",
            "CRONSTREAM_TOPIC_MIN_INSYNC_REPLICAS": "1",
        },
        secrets={
            **{(f"cronstream-database-{role}", "url"): as_role(database_url, f"cronstream_{role}")
               for role in ("owner", "writer", "reader")},
            **kafka_users,
            ("cronstream-ui", "token"): ui_token,
            ("cronstream-ui", "session-key"): uuid.uuid4().hex,
            ("cronstream-ui", "metrics-token"): scrape_token,
        },
        log_dir=tmp_path,
        launcher=launcher,
    )
    all_workloads = workloads(cluster.objects)
    jobs = [w for w in all_workloads if w.kind == "Job"]
    services = [w for w in all_workloads if w.kind in LONG_RUNNING_KINDS]
    commands = {c.argv[0] for w in services for c in w.containers(init=False) if c.is_cronstream}
    assert jobs and commands == SERVICES, [str(w) for w in all_workloads]
    codes: dict[str, int | None] = {}
    try:
        for job in jobs:
            pod = cluster.start(job)
            deadline = min(job.obj["spec"].get("activeDeadlineSeconds", 120), 120)
            code = pod.proc.wait(deadline)
            assert code == 0, f"{job} failed ({code}):\n{pod.log()[-3000:]}"
        tables = sql(database_url, "SELECT count(*) AS n FROM information_schema.tables "
                                   "WHERE table_name = 'job_executions'")
        assert tables[0]["n"] == 1, "init did not apply the migrations"

        pods, schedulers = start_ready(cluster, services)

        # What Prometheus scrapes: /metrics on the port each Service targets (the UI's with
        # its scrape token: its reads are protected).
        for service in find(cluster.objects, "Service"):
            pod, port = service_port(cluster, pods, service["metadata"]["name"])
            ui = pod.container.argv[0] == "ui"
            scrape = {"Authorization": f"Bearer {scrape_token}"} if ui else {}
            status, _, body = http_request(port, "/metrics", headers=scrape)
            assert status == 200 and f'cronstream_build_info{{service="{pod.container.argv[0]}"' in body, \
                (service["metadata"], status)
            if ui:
                assert http_request(port, "/metrics")[0] == 401, "the UI's /metrics without its token"

        settings = Settings(kafka_bootstrap_servers=kafka, database_url=database_url,
                            topic_prefix=prefix)
        check_schedulers(settings, schedulers)
        run_now(settings, "k8s-hello", "noop", params={"from": "the manifests"})
        rows = eventually(
            lambda: sql(database_url, "SELECT status, worker_id, result FROM job_executions "
                                      "WHERE job_id = 'k8s-hello' AND status = 'COMPLETED'"),
            timeout=90, message="k8s-hello COMPLETED in PostgreSQL")
        worker = pods["cronstream-worker"]
        assert rows[0]["worker_id"] == worker.pod_name == "cronstream-worker-0"
        assert json.loads(rows[0]["result"]) == {"from": "the manifests"}
        check_ui(cluster, pods, database_url, ui_token)
        print("\nRSS MiB: " + ", ".join(f"{p.pod_name} {p.rss_mib():.0f}" for p in cluster.pods
                                        if p.proc.poll() is None))
    finally:
        started = time.monotonic()
        codes = cluster.stop_all()
        for pod in cluster.pods:
            tail = "\n".join(pod.log().splitlines()[-25:])
            print(f"\n----- {pod.pod_name} (exit {codes.get(pod.pod_name)}) -----\n{tail}")
        print(f"all stopped in {time.monotonic() - started:.1f}s; restarts: "
              f"{ {p.pod_name: p.restarts for p in cluster.pods if p.restarts} or 'none'}")
        # The schedulers' stores: in a pod, on its emptyDir; here, under the host's /tmp.
        for pod in cluster.pods:
            if "CRONSTREAM_SCHEDULER_DATA_DIR" in pod.env:
                shutil.rmtree(Path(pod.env["CRONSTREAM_SCHEDULER_DATA_DIR"]) / prefix.rstrip("."),
                              ignore_errors=True)
    not_clean = {name: code for name, code in codes.items() if code != 0}
    assert not not_clean, f"not stopped cleanly within their grace: {not_clean}"
