"""deploy/k8s, offline: every kustomization renders (``kubectl kustomize``), every Kubernetes
object validates against the Kubernetes schemas (kubernetes-validate, strict: an unknown field
fails), the workers' KEDA ScaledObjects against KEDA's documented ScaledObject spec and
scalers, and the pieces agree with the code: the flags exist, the probes are the ones the
services serve, the drain fits in the grace period, KEDA reads the planner's metric and the
model's real job stream.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from nightjar.cli import build_parser
from shared import keys
from shared.metrics import metric_name

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUSTOMIZATIONS = ["", "base", "overlays/nj-target", "overlays/smollm2", "overlays/external-redis"]
K8S_VERSION = "1.32"  # a version current clusters run; the validator carries its schemas


def render(path: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise RuntimeError("kubectl is not on PATH: these tests render deploy/k8s with `kubectl kustomize`")
    out = subprocess.run([kubectl, "kustomize", str(K8S / path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"kubectl kustomize {path or '.'}: {out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {path: render(path) for path in KUSTOMIZATIONS}


def _of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_every_object_validates_against_the_kubernetes_schemas(
    rendered: dict[str, list[dict[str, Any]]], path: str
) -> None:
    docs = rendered[path]
    assert docs
    for doc in docs:
        if doc["apiVersion"].startswith("keda.sh/"):
            continue  # a CRD: checked against KEDA's spec below
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_rejects_what_kubernetes_would() -> None:
    (deployment,) = [
        d for d in render("base") if d["kind"] == "Deployment" and "planner" in d["metadata"]["name"]
    ]
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


# KEDA's ScaledObject (keda.sh/v1alpha1) as its reference documents it (keda.sh/docs,
# "ScaledObject specification", and the Prometheus and Redis Streams scalers): every field
# named, with its type; trigger metadata is a map of strings.
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "labels": _STR_MAP, "annotations": _STR_MAP},
        },
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        k: {"type": "string"}
                        for k in ("apiVersion", "kind", "name", "envSourceContainerName")
                    },
                },
                **{
                    k: {"type": "integer", "minimum": 0}
                    for k in (
                        "pollingInterval",
                        "cooldownPeriod",
                        "initialCooldownPeriod",
                        "idleReplicaCount",
                        "minReplicaCount",
                        "maxReplicaCount",
                    )
                },
                "fallback": {
                    "type": "object",
                    "required": ["failureThreshold", "replicas"],
                    "additionalProperties": False,
                    "properties": {
                        "failureThreshold": {"type": "integer", "minimum": 1},
                        "replicas": {"type": "integer", "minimum": 0},
                        "behavior": {
                            "enum": [
                                "static",
                                "currentReplicas",
                                "currentReplicasIfHigher",
                                "currentReplicasIfLower",
                            ]
                        },
                    },
                },
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {"name": {"type": "string"}, "behavior": {"type": "object"}},
                        },
                        "scalingModifiers": {"type": "object"},
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metadata": _STR_MAP,
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                            "authenticationRef": {"type": "object"},
                        },
                    },
                },
            },
        },
    },
}
_SCALERS = {
    "prometheus": {
        "required": {"serverAddress", "query", "threshold"},
        "optional": {
            "activationThreshold", "namespace", "customHeaders", "ignoreNullValues",
            "queryParameters", "unsafeSsl", "timeout", "authModes",
        },
    },
    "redis-streams": {
        "required": {"stream"},
        "one_of": {"pendingEntriesCount", "streamLength", "lagCount"},
        "optional": {
            "address", "host", "port", "usernameFromEnv", "passwordFromEnv", "consumerGroup",
            "activationLagCount", "databaseIndex", "enableTLS", "unsafeSsl",
        },
    },
}  # fmt: skip


def _model_of(deployment: dict[str, Any]) -> str:
    args = build_parser().parse_args(
        ["worker", *deployment["spec"]["template"]["spec"]["containers"][0]["args"]]
    )
    return str(args.model_name)  # --served-model-name


@pytest.mark.parametrize("path", ["overlays/nj-target", "overlays/smollm2"])
def test_each_models_scaledobject_follows_kedas_spec_and_the_code(
    rendered: dict[str, list[dict[str, Any]]], path: str
) -> None:
    docs = rendered[path]
    (so,) = _of(docs, "ScaledObject")
    (deployment,) = _of(docs, "Deployment")
    jsonschema.validate(so, _SCALED_OBJECT)
    spec = so["spec"]
    assert spec["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert spec["minReplicaCount"] <= spec["fallback"]["replicas"] <= spec["maxReplicaCount"]
    model = _model_of(deployment)
    by_type = {t["type"]: t["metadata"] for t in spec["triggers"]}
    assert set(by_type) == set(_SCALERS)
    for kind, meta in by_type.items():
        rule = _SCALERS[kind]
        assert rule["required"] <= set(meta), (kind, meta)
        assert set(meta) <= rule["required"] | rule["optional"] | rule.get("one_of", set()), (kind, meta)
        if "one_of" in rule:
            assert len(rule["one_of"] & set(meta)) == 1, (kind, meta)
    # KEDA reads the gauge the planner exports, for this model; threshold 1: replicas = the count.
    assert (
        by_type["prometheus"]["query"] == f'max({metric_name("planner_desired_workers")}{{model="{model}"}})'
    )
    assert float(by_type["prometheus"]["threshold"]) == 1.0
    # ... and the lag of the model's real job stream and its workers' group.
    assert by_type["redis-streams"]["stream"] == keys.jobs_stream(model)
    assert by_type["redis-streams"]["consumerGroup"] == keys.JOBS_GROUP


def test_the_pods_match_what_the_services_serve(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered[""]
    (config,) = _of(docs, "ConfigMap")
    env = config["data"]
    drain_s = float(env["NIGHTJAR_DRAIN_TIMEOUT_S"])
    metrics_port = int(env["NIGHTJAR_METRICS_PORT"])
    workers = [d for d in _of(docs, "Deployment") if "worker" in d["metadata"]["name"]]
    assert len(workers) == 2
    planned = set(env["NIGHTJAR_PLAN_MODELS"].split(","))
    for d in workers:
        pod = d["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert pod["terminationGracePeriodSeconds"] >= drain_s + 10  # the drain ends before the kill
        assert "kill -TERM 1" in " ".join(c["lifecycle"]["preStop"]["exec"]["command"])
        assert c["ports"][0]["containerPort"] == metrics_port
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"  # worker/health.py
        assert c["livenessProbe"]["httpGet"]["path"] == c["startupProbe"]["httpGet"]["path"] == "/health/live"
        assert c["command"] == ["nightjar", "worker"]
        assert _model_of(d) in planned  # the planner plans for it even at zero workers
    gateway = next(d for d in _of(docs, "Deployment") if d["metadata"]["name"] == "nightjar-gateway")
    probes = gateway["spec"]["template"]["spec"]["containers"][0]
    assert probes["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert probes["livenessProbe"]["httpGet"]["path"] == "/health/live"
    # Every command parses with the CLI and every variable the ConfigMap sets is one it reads.
    parser = build_parser()
    for d in _of(docs, "Deployment"):
        (c,) = d["spec"]["template"]["spec"]["containers"]
        parser.parse_args([*c["command"][1:], *c.get("args", [])])
    help_text = " ".join(
        parser.format_help() + sub.format_help()
        for action in parser._subparsers._group_actions  # type: ignore[union-attr]
        for sub in action.choices.values()  # type: ignore[union-attr]
    )
    for name in env:
        assert name in help_text, f"{name} is set in the ConfigMap but no flag reads it"


def test_external_redis_has_no_redis_and_takes_the_url_from_a_secret(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["overlays/external-redis"]
    assert not _of(docs, "StatefulSet") and all(d["metadata"]["name"] != "nightjar-redis" for d in docs)
    assert "NIGHTJAR_REDIS_URL" not in _of(docs, "ConfigMap")[0]["data"]
    for d in _of(docs, "Deployment"):
        env = {e["name"]: e for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["NIGHTJAR_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
            "name": "nightjar-redis",
            "key": "url",
        }
