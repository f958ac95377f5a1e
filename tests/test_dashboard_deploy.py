"""The dashboard's deployment: a compose profile on 127.0.0.1, a k8s ClusterIP Service."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "k8s"


def test_compose_dashboard_is_a_profile_on_loopback_with_a_token() -> None:
    svc = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["dashboard"]
    assert svc["profiles"] == ["dashboard"]
    assert svc["ports"] == ["127.0.0.1:9420:9420"]
    assert svc["command"] == ["crawlq", "dashboard"]
    assert svc["environment"]["CRAWLQ_DASHBOARD_TOKEN"] == "${CRAWLQ_DASHBOARD_TOKEN:-}"


def test_k8s_dashboard_deployment_and_clusterip_service() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert {"dashboard-deployment.yaml", "dashboard-service.yaml"} <= set(kust["resources"])
    dep = yaml.safe_load((K8S / "dashboard-deployment.yaml").read_text())
    svc = yaml.safe_load((K8S / "dashboard-service.yaml").read_text())
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["CRAWLQ_DASHBOARD_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == \
        "crawlq-dashboard"
    port = int(env["CRAWLQ_DASHBOARD_PORT"]["value"])
    assert svc["spec"]["ports"][0]["targetPort"] == port == c["ports"][0]["containerPort"]
    assert c["readinessProbe"]["httpGet"]["port"] == port
