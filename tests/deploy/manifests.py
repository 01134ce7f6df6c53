"""Rendered Kubernetes manifests as data: render an overlay, resolve what a container gets.

`render()` runs `kubectl kustomize` (the same renderer `kubectl apply -k` uses) on an
overlay, or on an overlay plus components. `Workload` and `Container` answer the
questions the tests ask of a pod template: its env once ConfigMaps, Secrets and the
downward API are resolved, the port a probe hits, the command it runs.

The environment variable names cronstream reads are derived from the code
(`known_env_names()`): every field of `Settings`, every `envvar` of the CLI's options, and
librdkafka properties through `CRONSTREAM_KAFKA_<PROPERTY>` (checked by librdkafka itself,
`kafka_property_error()`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from cronstream.cli import cli
from cronstream.shared.settings import ENV_PREFIX, KAFKA_PASSTHROUGH_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SCHEMAS = K8S / "schemas"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job", "DaemonSet", "CronJob")
LONG_RUNNING_KINDS = ("Deployment", "StatefulSet", "DaemonSet")

# What the tests render: each overlay, and each optional component on top of one.
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "dev": ("overlays/dev", ()),
    "prod": ("overlays/prod", ()),
    "prod+podmonitors": ("overlays/prod", ("components/podmonitors",)),
    "dev+worker-hpa": ("overlays/dev", ("components/worker-hpa",)),
    "prod+ui-oauth2-proxy": ("overlays/prod", ("components/ui-oauth2-proxy",)),
}


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        message = "kubectl (with its built-in Kustomize) is not installed"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def render(overlay: str, components: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """`kubectl kustomize` of deploy/k8s/<overlay> (plus components), as a list of objects."""
    target = K8S / overlay
    with tempfile.TemporaryDirectory() as tmp:
        if components:
            # A throwaway kustomization: the overlay plus the components, as a user would
            # write it in their own overlay.
            kustomization = {
                "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                "resources": [os.path.relpath(target, tmp)],
                "components": [os.path.relpath(K8S / c, tmp) for c in components],
            }
            Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
            target = Path(tmp)
        result = subprocess.run([kubectl(), "kustomize", str(target)], capture_output=True,
                                text=True, timeout=60, check=False)
    assert result.returncode == 0, f"kubectl kustomize {overlay} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def only(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


# -- what cronstream reads -----------------------------------------------------------------


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in group.commands.items():
        yield (*prefix, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))


def _envvars(command: click.Command) -> set[str]:
    names: set[str] = set()
    for param in command.params:
        envvar = getattr(param, "envvar", None)
        if isinstance(envvar, str):
            names.add(envvar)
        elif envvar:
            names.update(envvar)
    return names


def known_env_names(argv: list[str]) -> set[str]:
    """The `CRONSTREAM_*` names `cronstream <argv>` reads (besides the librdkafka pass-through):
    every Settings field (Settings.from_env reads them all) and the envvars of the options
    of the top-level group and of the command in argv."""
    names = {ENV_PREFIX + field.upper() for field in Settings.model_fields if field != "kafka_config"}
    names |= _envvars(cli)
    commands = dict(_commands(cli))
    words = [a for a in argv if not a.startswith("-")]
    for length in range(len(words), 0, -1):
        command = commands.get(tuple(words[:length]))
        if command is not None:
            names |= _envvars(command)
            break
    else:
        raise AssertionError(f"`cronstream {' '.join(argv)}` is not a cronstream command")
    return names


def is_kafka_passthrough(name: str) -> bool:
    """`CRONSTREAM_KAFKA_<PROPERTY>`, except the Settings fields that share the prefix
    (CRONSTREAM_KAFKA_BOOTSTRAP_SERVERS), as Settings.from_env reads it."""
    fields = {ENV_PREFIX + field.upper() for field in Settings.model_fields}
    return name.startswith(KAFKA_PASSTHROUGH_PREFIX) and name not in fields


def kafka_config_error(variables: Mapping[str, str]) -> str | None:
    """Why librdkafka refuses the client configuration these `CRONSTREAM_KAFKA_<PROPERTY>`
    variables make, or None if it accepts it. All at once, as a service builds its
    clients: `security.protocol=SASL_SSL` alone is refused (its default mechanism, GSSAPI,
    is not built in), with `sasl.mechanism=SCRAM-SHA-512` it is fine."""
    from confluent_kafka import KafkaException, Producer

    config = {name[len(KAFKA_PASSTHROUGH_PREFIX):].lower().replace("_", "."): value
              for name, value in variables.items()}
    try:
        # Building a client validates names and values; with no bootstrap servers it
        # connects nowhere, and log_level 0 keeps librdkafka's advice off the test output.
        Producer({"log_level": 0, **config}).flush(0)
    except (KafkaException, ValueError, TypeError) as exc:
        return f"librdkafka refuses {config}: {exc}"
    return None


# -- a pod template, resolved ----------------------------------------------------------------


@dataclass
class Container:
    workload: Workload
    spec: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def image(self) -> str:
        return str(self.spec.get("image", ""))

    @property
    def is_cronstream(self) -> bool:
        return self.image.rsplit("/", 1)[-1].split(":")[0].split("@")[0] == "cronstream"

    @property
    def argv(self) -> list[str]:
        return [*self.spec.get("command", []), *self.spec.get("args", [])]

    def ports(self) -> dict[str, int]:
        return {p["name"]: int(p["containerPort"]) for p in self.spec.get("ports", []) if "name" in p}

    def port_number(self, port: int | str) -> int:
        """A probe's or Service's port: a number, or the name of one of this container's ports."""
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        ports = self.ports()
        assert port in ports, f"{self}: no containerPort named {port!r} (has {sorted(ports)})"
        return ports[str(port)]

    def env_names(self) -> dict[str, str]:
        """Every variable this container sets, with where it comes from."""
        names: dict[str, str] = {}
        for source in self.spec.get("envFrom", []):
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                ref = source["configMapRef"]["name"]
                data = self.workload.config_map(ref) or {}
                names.update({prefix + k: f"ConfigMap {ref}" for k in data})
            if "secretRef" in source:
                ref = source["secretRef"]["name"]
                secret = self.workload.secret(ref) or {}
                names.update({prefix + k: f"Secret {ref}" for k in secret})
        for item in self.spec.get("env", []):
            names[item["name"]] = "env"
        return names

    def env(self, secret_values: Callable[[str, str], str], pod_name: str) -> dict[str, str]:
        """The environment the container gets. Secret values come from `secret_values(name,
        key)` (Secrets are not in the manifests); the downward API resolves metadata.name
        to `pod_name`."""
        env: dict[str, str] = {}
        for source in self.spec.get("envFrom", []):
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                ref = source["configMapRef"]["name"]
                data = self.workload.config_map(ref)
                assert data is not None, f"{self}: envFrom ConfigMap {ref} is not rendered"
                env.update({prefix + k: str(v) for k, v in data.items()})
            if "secretRef" in source:
                raise AssertionError(f"{self}: envFrom a Secret hides which variables it sets")
        for item in self.spec.get("env", []):
            if "value" in item:
                env[item["name"]] = str(item["value"])
                continue
            source = item.get("valueFrom", {})
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                env[item["name"]] = secret_values(ref["name"], ref["key"])
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                data = self.workload.config_map(ref["name"]) or {}
                assert ref["key"] in data, f"{self}: ConfigMap {ref['name']} has no key {ref['key']}"
                env[item["name"]] = str(data[ref["key"]])
            elif "fieldRef" in source:
                path = source["fieldRef"]["fieldPath"]
                assert path == "metadata.name", f"{self}: unsupported fieldRef {path}"
                env[item["name"]] = pod_name
            else:
                env[item["name"]] = ""
        return env

    def probes(self) -> dict[str, dict[str, Any]]:
        return {kind: self.spec[kind] for kind in ("startupProbe", "livenessProbe", "readinessProbe")
                if kind in self.spec}

    def __str__(self) -> str:
        return f"{self.workload}/{self.name}"


@dataclass
class Workload:
    obj: dict[str, Any]
    objects: list[dict[str, Any]]

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def pod(self) -> dict[str, Any]:
        template = self.obj["spec"]["jobTemplate"]["spec"]["template"] if self.kind == "CronJob" \
            else self.obj["spec"]["template"]
        return dict(template["spec"])

    @property
    def pod_labels(self) -> dict[str, str]:
        template = self.obj["spec"]["jobTemplate"]["spec"]["template"] if self.kind == "CronJob" \
            else self.obj["spec"]["template"]
        return dict(template.get("metadata", {}).get("labels", {}))

    @property
    def replicas(self) -> int | None:
        """The replicas the manifest asks for; None when an autoscaler owns the count."""
        if self.kind in ("Job", "CronJob", "DaemonSet"):
            return None
        value = self.obj["spec"].get("replicas")
        return None if value is None else int(value)

    def containers(self, init: bool = True) -> list[Container]:
        specs = [*(self.pod.get("initContainers", []) if init else []), *self.pod["containers"]]
        return [Container(self, spec) for spec in specs]

    def pod_name(self, index: int = 0) -> str:
        """What the pod would be called: StatefulSets number their pods."""
        return f"{self.name}-{index}" if self.kind == "StatefulSet" else f"{self.name}-local{index}"

    def config_map(self, name: str) -> dict[str, Any] | None:
        found = find(self.objects, "ConfigMap", name)
        return dict(found[0].get("data", {})) if found else None

    def secret(self, name: str) -> dict[str, Any] | None:
        found = find(self.objects, "Secret", name)
        if not found:
            return None
        return {**found[0].get("data", {}), **found[0].get("stringData", {})}

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


def workloads(objects: list[dict[str, Any]]) -> list[Workload]:
    return [Workload(o, objects) for o in objects if o["kind"] in WORKLOAD_KINDS]


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector (`matchLabels` and `matchExpressions`) against a pod's labels, as
    Kubernetes evaluates it; an empty selector matches every pod."""
    if not all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


# -- custom resources --------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """An upstream CRD's openAPIV3Schema made strict the way the API server prunes: an
    object with `properties` accepts no other field unless it preserves unknown fields."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) → JSON Schema, from deploy/k8s/schemas (ours, or an upstream CRD)."""
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(SCHEMAS.glob("*.json")):
        schema = json.loads(path.read_text())
        props = schema["properties"]
        schemas[(props["apiVersion"]["const"], props["kind"]["const"])] = schema
    for path in sorted(SCHEMAS.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schema = _strict(version["schema"]["openAPIV3Schema"])
                schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas
