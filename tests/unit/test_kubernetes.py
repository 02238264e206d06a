"""The Kubernetes overlays we ship (deploy/k8s): each renders with `kubectl kustomize` and
validates against Kubernetes' own schemas (kubernetes-validate, strict: a misspelt field
fails), and holds together as Ballast needs it: the probes are the app's health routes, the
Service and the selectors find the pods, termination outlasts the drain, every variable the
config reads is given and the config loads with them, no instance count is configured; a
fleet has its Redis and PostgreSQL where its URLs point, an autoscaler that owns the replica
count and a disruption budget it can honour; one instance keeps SQLite on a volume."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from ballast.app import BallastApp
from ballast.config import load_settings
from ballast.state.db import Database

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ("single", "fleet")
KUBERNETES = "1.30.0"  # the oldest version the manifests are validated for


def _kubectl() -> str:
    found = shutil.which("kubectl")
    if found:
        return found
    message = "kubectl is not installed (Debian: kubectl or kubernetes-client)"
    if os.environ.get("CI") is not None:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@functools.cache
def _rendered(overlay: str, kubectl: str) -> tuple[dict[str, Any], ...]:
    done = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "deploy" / "k8s" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def render(overlay: str) -> list[dict[str, Any]]:
    return list(_rendered(overlay, _kubectl()))


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def gateway(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gateway's Deployment and its container."""
    deployment = one(docs, "Deployment", "ballast")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def environment(container: dict[str, Any]) -> dict[str, str]:
    """The container's variables as the kubelet sets them: stand-ins for what comes from a
    Secret or the pod, `$(VAR)` expanded from the variables before it."""
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "valueFrom" in entry:
            value = f"stand-in-{entry['name'].lower().replace('_', '-')}-0123456789"
        else:
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), entry["value"])
        env[entry["name"]] = value
    return env


def settings_of(container: dict[str, Any]) -> Any:
    return load_settings(ROOT / "deploy" / "ballast.yaml", environ=environment(container))


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_it_renders_and_validates_against_kubernetes_schemas(overlay: str) -> None:
    docs = render(overlay)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_validation_refuses_a_misspelt_field() -> None:
    deployment, _ = gateway(render("single"))
    wrong = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, KUBERNETES, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gateway_holds_together(overlay: str) -> None:
    docs = render(overlay)
    deployment, container = gateway(docs)
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert matches(deployment["spec"]["selector"]["matchLabels"], labels)
    service = one(docs, "Service", "ballast")
    assert matches(service["spec"]["selector"], labels)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    args = container["args"]
    assert int(args[args.index("--port") + 1]) in ports.values()

    routes = set(BallastApp(settings_of(container))._get)
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready" in routes
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live" in routes

    config = Path(args[args.index("--config") + 1])
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert str(config.parent) in mounts
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[mounts[str(config.parent)]]["configMap"]["name"] == "ballast-config"

    env = environment(container)
    assert "BALLAST_INSTANCES" not in env  # the instances count each other through Redis
    text = (ROOT / "deploy" / "ballast.yaml").read_text()
    required = set(re.findall(r"\$\{(\w+)\}", text))
    assert required <= set(env), required - set(env)
    settings = settings_of(container)

    # Termination outlasts the drain: the preStop pause, then the server's own grace.
    pause = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep"
    drain = float(pause[1]) + settings.server.shutdown_grace
    assert pod["spec"]["terminationGracePeriodSeconds"] > drain


def test_one_instance_keeps_sqlite_on_a_volume() -> None:
    docs = render("single")
    deployment, container = gateway(docs)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # SQLite has one writer
    settings = settings_of(container)
    assert settings.state.redis_url is None
    assert settings.state.database_url.startswith("sqlite")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    claim = volumes["data"]["persistentVolumeClaim"]["claimName"]
    one(docs, "PersistentVolumeClaim", claim)
    assert mounts["data"] == "/var/lib/ballast"  # the image's working directory


def test_a_fleet_has_its_state_an_autoscaler_and_a_disruption_budget() -> None:
    docs = render("fleet")
    deployment, container = gateway(docs)
    settings = settings_of(container)
    services = {
        s["metadata"]["name"]: {p["port"] for p in s["spec"]["ports"]}
        for s in docs
        if s["kind"] == "Service"
    }
    redis = urlsplit(settings.state.redis_url)
    database = urlsplit(settings.state.database_url)
    assert database.scheme == "postgresql+asyncpg"
    for url in (redis, database):
        assert url.hostname in services and url.port in services[url.hostname], url
    postgres = one(docs, "StatefulSet", "ballast-postgres")
    (pg,) = postgres["spec"]["template"]["spec"]["containers"]
    pg_env = {e["name"]: e for e in pg["env"]}
    mine = {e["name"]: e for e in container["env"]}
    assert pg_env["POSTGRES_PASSWORD"]["valueFrom"] == mine["POSTGRES_PASSWORD"]["valueFrom"]
    assert database.username == pg_env["POSTGRES_USER"]["value"]
    assert database.path.lstrip("/") == pg_env["POSTGRES_DB"]["value"]

    assert "replicas" not in deployment["spec"]  # the autoscaler's to set
    hpa = one(docs, "HorizontalPodAutoscaler", "ballast")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "ballast"
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert hpa["spec"]["minReplicas"] >= 2
    assert container["resources"]["requests"]["cpu"]  # what CPU utilisation is measured on
    # Every worker of the most pods the autoscaler may run gets its database pool.
    args = container["args"]
    workers = int(args[args.index("--workers") + 1]) if "--workers" in args else 1
    pool = Database(settings.state.database_url).engine.pool
    per_worker = pool.size() + pool._max_overflow  # type: ignore[attr-defined]
    pg_args = pg.get("args", [])
    limit = int(pg_args[pg_args.index("-c") + 1].removeprefix("max_connections="))
    assert hpa["spec"]["maxReplicas"] * workers * per_worker < limit
    budget = one(docs, "PodDisruptionBudget", "ballast")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert matches(budget["spec"]["selector"]["matchLabels"], labels)
    assert budget["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]  # a drain can proceed
