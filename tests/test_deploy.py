"""Deployment files, checked without a Docker engine or a cluster.

- ``docker-compose.yml`` (and the CI override ``deploy/compose.ci.yml``) validate against
  the Compose Specification schema in ``tests/data/schemas/compose-spec.json``, and
  keep the rules of a scalable service: no container_name or host port on the consumer,
  stop_grace_period longer than the drain, Redis with AOF and noeviction and no port.
- ``Dockerfile``: base image as an ARG, non-root, exec-form CMD, HEALTHCHECK crawlq check.
- ``deploy/k8s/*.yaml``: every manifest validates against the Kubernetes 1.37 schemas
  (``kubernetes-validate``, strict: an unknown field is an error, as ``kubectl apply``
  makes it), the KEDA ``ScaledObject`` and ``TriggerAuthentication`` against the
  openAPIV3Schema of KEDA's CRDs (``tests/data/schemas/keda/``, see `KEDA_CRDS`); probes,
  grace, Forbid, and a KEDA listName that is the crawl's set of due hosts as
  ``common.keys`` builds it.
- Every ``CRAWLQ_*`` variable set anywhere here is one that a crawlq command reads.

The real container test (image build, compose up --scale consumer=3, a crawl) is
``tests/container/run.sh``, run by CI as its own step.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from shared_data import DATA, require

from common.config import duration
from common.keys import PartitionKeys

REPO = Path(__file__).resolve().parents[1]
COMPOSE_SCHEMA = DATA / "schemas" / "compose-spec.json"
K8S = REPO / "deploy" / "k8s"
DEFAULT_GRACE_S = 20.0  # consumer --grace default (consumer/config.py)
# The newest Kubernetes release whose schemas kubernetes-validate ships (pyproject pins it).
K8S_VERSION = "1.37"
# KEDA's CRDs, config/crd/bases/<file> of github.com/kedacore/keda (Apache License 2.0):
# public data, in the repository beside compose-spec.json (tests/data/README.md).
KEDA_CRDS = DATA / "schemas" / "keda"
KEDA_KINDS = {
    "ScaledObject": "keda.sh_scaledobjects.yaml",
    "TriggerAuthentication": "keda.sh_triggerauthentications.yaml",
}
NOT_API_OBJECTS = {"Kustomization"}  # kustomize's own input, never sent to the API server
#: The images the manifests name, each rewritten by kustomization.yaml's `images`.
IMAGES = ("crawlq", "crawlq-browser")


class _ComposeLoader(yaml.SafeLoader):
    """SafeLoader that reads compose's merge tags ``!reset`` and ``!override`` as values."""


def _tagged(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    return loader.construct_scalar(node)


for _tag in ("!reset", "!override"):
    _ComposeLoader.add_constructor(_tag, _tagged)


def _load_compose(name: str) -> dict[str, Any]:
    data = yaml.load((REPO / name).read_text(), Loader=_ComposeLoader)
    assert isinstance(data, dict)
    return data


def _compose_duration(text: str) -> float:
    """Seconds from a compose duration: ``30s``, ``1m30s``, ``1h``, ``500ms``."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", str(text))
    assert parts and "".join(n + u for n, u in parts) == str(text), f"bad duration {text!r}"
    unit = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}
    return sum(float(n) * unit[u] for n, u in parts)


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def _k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                doc["__file__"] = path.name
                docs.append(doc)
    return docs


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d.get("kind") == kind
             and name in (None, d.get("metadata", {}).get("name"))]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _k8s_env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _known_env_vars() -> set[str]:
    """Every environment variable any crawlq command reads (from the --help texts)."""
    from console.cli import build_parser as cli_parser  # noqa: PLC0415
    from consumer.config import build_parser as consumer_parser  # noqa: PLC0415
    from producer.cli import build_parser as producer_parser  # noqa: PLC0415

    found: set[str] = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            found.update(re.findall(r"\(env ([A-Z0-9_]+);", action.help or ""))
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)

    for build in (cli_parser, consumer_parser, producer_parser):
        walk(build())
    return found


# -- docker-compose.yml -----------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _load_compose("docker-compose.yml")


@pytest.fixture(scope="module")
def compose_ci() -> dict[str, Any]:
    return _load_compose("deploy/compose.ci.yml")


@pytest.mark.parametrize("name", ["docker-compose.yml", "deploy/compose.ci.yml"])
def test_compose_files_match_the_compose_spec(name: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(require(COMPOSE_SCHEMA, "the Compose Specification schema").read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(_load_compose(name)), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_consumer_is_a_scalable_service(compose: dict[str, Any]) -> None:
    consumer = compose["services"]["consumer"]
    assert "container_name" not in consumer, "a scaled service can't have a fixed name"
    assert not consumer.get("ports"), "a scaled service can't publish a fixed host port"
    assert consumer["depends_on"]["redis"]["condition"] == "service_healthy"
    env = _env(consumer)
    assert env["CRAWLQ_HTTP_HOST"] == "0.0.0.0", "probes must reach the side server"
    grace_s = duration(env.get("CRAWLQ_GRACE", str(DEFAULT_GRACE_S)))
    stop_s = _compose_duration(consumer["stop_grace_period"])
    assert stop_s > grace_s, f"stop_grace_period {stop_s}s must exceed the drain {grace_s}s"
    # Exec form: no shell between the engine and Python.
    assert consumer.get("command", ["crawlq-consumer"]) == ["crawlq-consumer"]
    mounts = [str(v) for v in consumer["volumes"]]
    assert any(m.startswith("results:") and m.split(":")[1] == env["CRAWLQ_OUTPUT"]
               for m in mounts), "results go to a named volume at CRAWLQ_OUTPUT"
    assert "results" in compose["volumes"]
    assert consumer["read_only"] is True


def test_redis_is_durable_and_private(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    assert not redis.get("ports"), "Redis must not be published on the host"
    cmd = [str(c) for c in redis["command"]]
    flags = dict(zip(cmd[1::2], cmd[2::2], strict=False))
    assert cmd[0] == "redis-server"
    assert flags["--appendonly"] == "yes"
    assert flags["--appendfsync"] == "everysec"
    assert flags["--maxmemory-policy"] == "noeviction"
    assert any(str(v).startswith("redis-data:/data") for v in redis["volumes"])
    assert "redis-data" in compose["volumes"]
    assert redis["healthcheck"]["test"][:2] == ["CMD", "redis-cli"]


def test_producer_runs_on_demand(compose: dict[str, Any]) -> None:
    producer = compose["services"]["producer"]
    assert producer["profiles"] == ["producer"], "`up` must not start the producer"
    assert producer["entrypoint"] == ["crawlq-producer"]
    assert "./data:/data:ro" in producer["volumes"]
    assert producer["image"] == compose["services"]["consumer"]["image"], "one image"
    assert producer["depends_on"]["redis"]["condition"] == "service_healthy"


def test_postgres_runs_on_demand_for_the_postgres_sink(compose: dict[str, Any]) -> None:
    postgres = compose["services"]["postgres"]
    assert postgres["profiles"] == ["postgres"], "`up` must not start the database"
    assert not postgres.get("ports"), "the database must not be published on the host"
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    assert any(str(v).startswith("postgres-data:") for v in postgres["volumes"])
    assert "postgres-data" in compose["volumes"]
    env, db_env = _env(compose["services"]["consumer"]), _env(postgres)
    # The consumers' password is the database's, given by PGPASSWORD (never in a URL).
    assert env["PGPASSWORD"] == db_env["POSTGRES_PASSWORD"]
    header = (REPO / "docker-compose.yml").read_text().split("\nservices:")[0]
    sink = re.search(r"CRAWLQ_SINK=(postgres://\S+)", header)
    assert sink is not None and f"@postgres:5432/{db_env['POSTGRES_DB']}" in sink.group(1)
    assert ":" not in sink.group(1).split("//")[1].split("@")[0], "no password in the URL"


def test_ci_override_uses_host_networking(compose_ci: dict[str, Any]) -> None:
    services = compose_ci["services"]
    for name, svc in services.items():
        assert svc["network_mode"] == "host", name
        if "build" in svc:
            assert svc["build"]["network"] == "host", name
    consumer = services["consumer"]
    env = _env(consumer)
    assert env["CRAWLQ_HTTP_PORT"] == "0", "replicas share the host's ports"
    assert env["CRAWLQ_ALLOW_PRIVATE"] == "true", "the test site is on loopback"
    assert env["REDIS_URL"].startswith("redis://127.0.0.1:")
    assert consumer["ports"] == []
    assert consumer["build"]["args"]["BASE_IMAGE"] == "debian:bookworm-slim"
    assert _compose_duration(consumer["stop_grace_period"]) > duration(env["CRAWLQ_GRACE"])
    cmd = [str(c) for c in services["redis"]["command"]]
    assert "noeviction" in cmd and "--appendonly" in cmd


# -- Dockerfile -----------------------------------------------------------------------------


def test_dockerfile_facts() -> None:
    text = (REPO / "Dockerfile").read_text()
    # Instructions, one per entry: comments dropped, continuation lines joined.
    joined = re.sub(r"\\\n\s*", " ", re.sub(r"(?m)^\s*#.*\n", "", text))
    lines = [ln.strip() for ln in joined.splitlines() if ln.strip()]
    assert lines[0] == "ARG BASE_IMAGE=python:3.12-slim"
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert froms == ["FROM ${BASE_IMAGE} AS build", "FROM ${BASE_IMAGE}"], "two stages"
    final = joined[joined.rindex("\nFROM "):]
    assert "COPY --from=build /opt/crawlq /opt/crawlq" in final
    assert not re.search(r"\b(gcc|g\+\+|build-essential|python3-dev)\b", final)
    assert re.search(r"^USER 10001(:10001)?$", final, re.M)
    assert re.search(r'^HEALTHCHECK .*CMD \["crawlq", "check"\]$', final, re.M)
    cmd = [ln for ln in lines if ln.startswith(("CMD ", "ENTRYPOINT "))]
    assert cmd == ['CMD ["crawlq-consumer"]'], "exec form, so SIGTERM reaches Python"


def test_dockerignore_keeps_the_context_small() -> None:
    rules = (REPO / ".dockerignore").read_text().split()
    assert rules[rules.index("*")] == "*", "ignore everything, then allow the sources"
    for needed in ("pyproject.toml", "README.md"):
        assert f"!{needed}" in rules


def test_the_image_gets_every_package_the_project_installs() -> None:
    """Every top-level package of pyproject.toml's package list is let through
    .dockerignore and copied into the build stage (a package added to one and not the
    others builds an image whose commands can't import it)."""
    packages = [p.rstrip("*") for p in
                tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
                ["packages"]["find"]["include"]]
    assert "console" in packages
    rules = (REPO / ".dockerignore").read_text().split()
    dockerfile = (REPO / "Dockerfile").read_text()
    for package in packages:
        assert f"!{package}/" in rules, f".dockerignore keeps {package}/ out of the build"
        assert re.search(rf"^COPY {package} \./{package}$", dockerfile, re.M), \
            f"the Dockerfile does not copy {package}/"


# -- Kubernetes -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def k8s() -> list[dict[str, Any]]:
    return _k8s_docs()


def test_kustomization_lists_every_manifest(k8s: list[dict[str, Any]]) -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files
    kinds = {d["kind"] for d in k8s}
    assert {"Deployment", "ScaledObject", "TriggerAuthentication", "CronJob", "Secret",
            "ConfigMap"} <= kinds


def _crawl(k8s: list[dict[str, Any]]) -> str:
    config = next(d for d in k8s if d["kind"] == "ConfigMap"
                  and d["metadata"]["name"] == "crawlq-config")
    return str(config["data"]["CRAWLQ_CRAWL"])


def _secret_ref_ok(k8s: list[dict[str, Any]], ref: dict[str, Any]) -> None:
    secret = _one(k8s, "Secret")
    assert ref["name"] == secret["metadata"]["name"]
    assert ref["key"] in secret["stringData"]


def test_consumer_deployment(k8s: list[dict[str, Any]]) -> None:
    dep = _one(k8s, "Deployment", "crawlq-consumer")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = _k8s_env(c)
    assert env["CRAWLQ_HTTP_HOST"] == "0.0.0.0"
    port = int(env["CRAWLQ_HTTP_PORT"])
    assert port == 9410
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert {"containerPort": port, "name": "http"} in c["ports"]
    grace_s = duration(env.get("CRAWLQ_GRACE", str(DEFAULT_GRACE_S)))
    assert pod["terminationGracePeriodSeconds"] > grace_s
    assert c["resources"]["requests"] and c["resources"]["limits"]
    _secret_ref_ok(k8s, env["REDIS_URL"]["secretKeyRef"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert dep["spec"]["selector"]["matchLabels"].items() <= \
        dep["spec"]["template"]["metadata"]["labels"].items()


def test_keda_scales_on_the_hosts_with_work(k8s: list[dict[str, Any]]) -> None:
    so = _one(k8s, "ScaledObject")
    consumer = _one(k8s, "Deployment", "crawlq-consumer")
    assert so["spec"]["scaleTargetRef"]["name"] == consumer["metadata"]["name"]
    assert so["spec"]["minReplicaCount"] >= 1, "someone must promote retries and reap"
    crawl = _crawl(k8s)
    triggers = so["spec"]["triggers"]
    assert triggers
    for partition, trigger in enumerate(triggers):
        assert trigger["type"] == "redis"
        assert trigger["metadata"]["listName"] == PartitionKeys.build(crawl, partition).due
        assert int(trigger["metadata"]["listLength"]) > 0
        auth = trigger["authenticationRef"]["name"]
        assert auth == _one(k8s, "TriggerAuthentication")["metadata"]["name"]
    for ref in _one(k8s, "TriggerAuthentication")["spec"]["secretTargetRef"]:
        _secret_ref_ok(k8s, ref)


def test_producer_cronjob(k8s: list[dict[str, Any]]) -> None:
    cron = _one(k8s, "CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert len(cron["spec"]["schedule"].split()) == 5
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in {"Never", "OnFailure"}
    (c,) = pod["containers"]
    assert c["command"] == ["crawlq-producer"]
    _secret_ref_ok(k8s, _k8s_env(c)["REDIS_URL"]["secretKeyRef"])


def test_secret_is_a_marked_placeholder(k8s: list[dict[str, Any]]) -> None:
    secret = _one(k8s, "Secret")
    url = secret["stringData"]["REDIS_URL"]
    assert url.startswith(("redis://", "rediss://"))
    assert "PLACEHOLDER" in (K8S / secret["__file__"]).read_text()


def test_every_image_is_the_crawlq_image(k8s: list[dict[str, Any]]) -> None:
    for doc in k8s:
        spec = doc.get("spec", {})
        pod = (spec.get("template") or spec.get("jobTemplate", {}).get("spec", {})
               .get("template") or {}).get("spec", {})
        for c in pod.get("containers", []):
            assert c["image"] in IMAGES, f"{doc['__file__']}: kustomize rewrites {IMAGES}"


# -- schemas ---------------------------------------------------------------------------------


def _manifest(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "__file__"}


def k8s_error(doc: dict[str, Any]) -> str | None:
    """Why the Kubernetes schema (strict: no unknown fields) rejects `doc`, or None."""
    try:
        kubernetes_validate.validate(_manifest(doc), K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"{'.'.join(map(str, exc.absolute_path)) or '<root>'}: {exc.message}"
    return None


def _closed(schema: Any) -> Any:
    """An openAPIV3Schema where an object with `properties` takes no other field (unless it
    says x-kubernetes-preserve-unknown-fields): kubectl's field validation, for jsonschema."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in schema:
        out["properties"] = {k: _closed(v) for k, v in schema["properties"].items()}
        if ("additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            out[key] = _closed(schema[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            out[key] = [_closed(s) for s in schema[key]]
    return out


@functools.cache
def _keda_validator(kind: str, api_version: str) -> jsonschema.Draft7Validator:
    path = require(KEDA_CRDS / KEDA_KINDS[kind], f"KEDA's {kind} CRD")
    crd = yaml.safe_load(path.read_text())
    assert crd["spec"]["names"]["kind"] == kind
    group, version = api_version.split("/")
    assert group == crd["spec"]["group"], f"{kind}: {api_version} is not KEDA's group"
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    return jsonschema.Draft7Validator(_closed(served["schema"]["openAPIV3Schema"]))


def keda_error(doc: dict[str, Any]) -> str | None:
    """Why KEDA's CRD schema for `doc`'s kind rejects `doc`, or None."""
    validator = _keda_validator(doc["kind"], doc["apiVersion"])
    errors = sorted(validator.iter_errors(_manifest(doc)), key=lambda e: list(e.path))
    return "; ".join(f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}"
                     for e in errors) or None


def test_every_manifest_matches_the_kubernetes_schema(k8s: list[dict[str, Any]]) -> None:
    checked = {d["kind"] for d in k8s} - set(KEDA_KINDS) - NOT_API_OBJECTS
    assert {"Deployment", "CronJob", "ConfigMap", "Secret", "PersistentVolumeClaim"} <= checked
    errors = {f"{d['__file__']} {d['kind']} {d['metadata']['name']}": k8s_error(d)
              for d in k8s if d["kind"] in checked}
    assert {k: e for k, e in errors.items() if e} == {}


def test_keda_objects_match_kedas_crds(k8s: list[dict[str, Any]]) -> None:
    errors = {d["kind"]: keda_error(d) for d in k8s if d["kind"] in KEDA_KINDS}
    assert set(errors) == set(KEDA_KINDS)
    assert {k: e for k, e in errors.items() if e} == {}


def test_a_broken_manifest_fails_the_kubernetes_schema(k8s: list[dict[str, Any]]) -> None:
    deployment = _one(k8s, "Deployment", "crawlq-consumer")
    assert k8s_error(deployment) is None
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 45
    assert "terminationGracePeriodSecond" in (k8s_error(typo) or "")
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "x"
    assert "containerPort" in (k8s_error(wrong_type) or "")


def test_a_broken_keda_object_fails_kedas_crd(k8s: list[dict[str, Any]]) -> None:
    scaled = _one(k8s, "ScaledObject")
    assert keda_error(scaled) is None
    typo = copy.deepcopy(scaled)
    typo["spec"]["trigers"] = typo["spec"].pop("triggers")
    assert "'trigers' was unexpected" in (keda_error(typo) or "")
    wrong_type = copy.deepcopy(scaled)
    wrong_type["spec"]["minReplicaCount"] = "1"
    assert "spec.minReplicaCount" in (keda_error(wrong_type) or "")
    no_target = copy.deepcopy(scaled)
    del no_target["spec"]["scaleTargetRef"]
    assert "'scaleTargetRef' is a required property" in (keda_error(no_target) or "")
    auth = copy.deepcopy(_one(k8s, "TriggerAuthentication"))
    auth["spec"]["secretTargetRef"][0]["secret"] = auth["spec"]["secretTargetRef"][0].pop("name")
    assert keda_error(auth)


# -- settings -------------------------------------------------------------------------------


def test_every_crawlq_variable_is_one_crawlq_reads(
        compose: dict[str, Any], compose_ci: dict[str, Any], k8s: list[dict[str, Any]]) -> None:
    used: dict[str, str] = {}
    for label, data in (("docker-compose.yml", compose), ("compose.ci.yml", compose_ci)):
        for name, svc in data["services"].items():
            for key in _env(svc):
                used[key] = f"{label} {name}"
    for doc in k8s:
        if doc["kind"] == "ConfigMap":
            for key in doc.get("data", {}):
                used[key] = f"{doc['__file__']}"
        spec = doc.get("spec", {})
        pod = (spec.get("template") or spec.get("jobTemplate", {}).get("spec", {})
               .get("template") or {}).get("spec", {})
        for c in pod.get("containers", []):
            for key in _k8s_env(c):
                used[key] = f"{doc['__file__']} {c['name']}"
    known = _known_env_vars()
    assert {"REDIS_URL", "CRAWLQ_GRACE", "CRAWLQ_CHECK_HTTP_URL"} <= known
    unknown = {k: where for k, where in used.items()
               if (k.startswith("CRAWLQ_") or k == "REDIS_URL") and k not in known}
    assert not unknown, f"variables no crawlq command reads: {unknown}"


# -- what the docs name -----------------------------------------------------------------------

#: Where operators read about crawlq (the README, deploy/, docs/, the compose files).
DOCS = sorted({REPO / "README.md", REPO / "docker-compose.yml",
               *(p for p in (REPO / "deploy").rglob("*") if p.suffix in (".md", ".yml", ".yaml")),
               *(REPO / "docs").rglob("*.md")})
_KEY = re.compile(r"crawlq:\{[^}\s`]*\}:([A-Za-z_:<>.\-]*[A-Za-z_>])")
#: A CRAWLQ_* name, not a compose file's own ${VAR} substitution (read by compose).
_VAR = re.compile(r"(?<!\$\{)\bCRAWLQ_[A-Z0-9_]*[A-Z0-9]\b(?!_)")
_POLICY_LINE = re.compile(r"crawlq crawl (?:set|create)\b(.*)")
_ASSIGNMENT = re.compile(r"(?<![-\w])([a-z][a-z_]*)=")


def _key_names() -> tuple[set[str], set[str]]:
    """The names of crawlq's keys after their hash tag, and the prefixes of the families
    (``hq:<host>``, ``robots:<origin>``, ...), from common/keys.py itself."""
    from common.keys import _PARTITION_NAMES, CrawlKeys  # noqa: PLC0415

    part, crawl = PartitionKeys.build("x", 0), CrawlKeys.build("x")
    names = set(_PARTITION_NAMES) | {
        getattr(crawl, f).removeprefix("crawlq:{x}:") for f in crawl.__dataclass_fields__
        if f != "crawl"}
    samples = (part.host_queue("H"), part.host_prio("H"), part.seen(1), part.bloom_layer(1),
               part.history(1),
               part.lease_op("H"), part.proxy_op("H"),
               crawl.worker("H"), crawl.robots("H"), crawl.proxy_op("H"),
               crawl.session("H"), crawl.session_pool("H"))
    prefixes = {s.split("}:", 1)[1].split(":", 1)[0] + ":" for s in samples}
    return names, prefixes


def test_the_docs_name_only_keys_variables_and_policy_keys_that_exist() -> None:
    """A Redis key, a CRAWLQ_* variable or a `crawlq crawl set` key in the README, deploy/
    or docs/ that crawlq does not have fails here (the docs once described a removed
    ':ready' list for months)."""
    from common.policy import OPTIONS  # noqa: PLC0415

    names, prefixes = _key_names()
    known_vars = _known_env_vars() | {"CRAWLQ_SOME_FLAG"}  # the naming rule's example
    known_vars |= set(_VAR.findall((REPO / "tests/container/run.sh").read_text()))
    problems = []
    for doc in DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            where = f"{doc.relative_to(REPO)}:{n}"
            for name in _KEY.findall(line):
                if name not in names and not any(name.startswith(p) for p in prefixes):
                    problems.append(f"{where}: no key {name!r}")
            problems += [f"{where}: no variable {v}" for v in _VAR.findall(line)
                         if v not in known_vars]
            if m := _POLICY_LINE.search(line):
                problems += [f"{where}: no policy key {k!r}"
                             for k in _ASSIGNMENT.findall(m.group(1)) if k not in OPTIONS]
    assert len(DOCS) > 5 and problems == []


# -- consumers that render (docs/rendering.md) ---------------------------------------------


def test_the_browser_image_adds_chromium_and_an_init_and_downloads_no_browser() -> None:
    text = (REPO / "deploy" / "browser.Dockerfile").read_text()
    joined = re.sub(r"\\\n\s*", " ", re.sub(r"(?m)^\s*#.*\n", "", text))
    lines = [ln.strip() for ln in joined.splitlines() if ln.strip()]
    assert lines[0] == "ARG BASE_IMAGE=python:3.12-slim"
    assert [ln for ln in lines if ln.startswith("FROM ")] == [
        "FROM ${BASE_IMAGE} AS build", "FROM ${BASE_IMAGE}"]
    final = joined[joined.rindex("\nFROM "):]
    assert re.search(r"apt-get install .*\bchromium\b.*\btini\b", final)
    assert '"browser"' in joined, "the build installs pyproject's browser extra"
    assert "playwright install" not in text, "no browser is downloaded: Debian's is used"
    assert re.search(r"^USER 10001(:10001)?$", final, re.M)
    assert re.search(r"CRAWLQ_BROWSER=auto", final)
    assert [ln for ln in lines if ln.startswith(("CMD ", "ENTRYPOINT "))] == [
        'ENTRYPOINT ["/usr/bin/tini", "--"]', 'CMD ["crawlq-consumer"]']
    for package in ("common", "consumer", "crawlq"):
        assert re.search(rf"^COPY {package} \./{package}$", text, re.M)


def test_browser_consumers_run_beside_plain_ones_in_compose(compose: dict[str, Any]) -> None:
    svc = compose["services"]["browser-consumer"]
    assert svc["profiles"] == ["browser"], "started on demand, beside the consumers"
    assert "container_name" not in svc and "ports" not in svc, "scalable"
    assert (REPO / svc["build"]["dockerfile"]).is_file()
    env = svc["environment"]
    assert env["CRAWLQ_BROWSER"] == "auto" and env["CRAWLQ_BROWSER_MEMORY"]
    assert svc["init"] is True and svc["shm_size"]
    assert duration(svc["stop_grace_period"]) > duration(env["CRAWLQ_GRACE"])
    assert svc["read_only"] is True and "/tmp" in svc["tmpfs"]


def test_browser_consumer_deployment(k8s: list[dict[str, Any]]) -> None:
    dep = _one(k8s, "Deployment", "crawlq-browser-consumer")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = _k8s_env(c)
    assert c["image"] == "crawlq-browser" and env["CRAWLQ_BROWSER"] == "auto"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["terminationGracePeriodSeconds"] > duration(env["CRAWLQ_GRACE"])
    limit = c["resources"]["limits"]["memory"]
    assert limit.endswith("Gi") and int(limit[:-2]) * 2**30 > \
        int(env["CRAWLQ_BROWSER_MEMORY"].removesuffix("GiB")) * 2**30
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert {i["name"] for i in kust["images"]} == set(IMAGES)
