"""compose/: Prometheus and Grafana beside Kafka, checked without a Docker engine.

What can be checked statically: Prometheus scrapes exactly the compose services that
serve /metrics, at the port and address their commands give; Grafana's datasource is
that Prometheus under the uid the dashboard names, and its provisioning finds the
dashboard where compose mounts it; the dashboard JSON parses, every PromQL metric name
it uses is one Torpor exports, and every metric Torpor exports is on it. The exported
names come from the exposition text of the processor's and the connector's registries
here, and from a real scrape in tests/processors/test_metrics.py and
tests/connectors/test_connector_metrics.py (`exported_names`, `dashboard_metric_names`).
`compose/check` (Go, compose-go) validates the compose file itself and its bind mounts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Final

import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from torpor.connectors.metrics import ConnectorMetrics
from torpor.processors.metrics import ProcessorMetrics
from torpor.processors.store.tables import HistoryCache

COMPOSE: Final = Path(__file__).resolve().parent.parent / "compose"
DASHBOARD: Final = COMPOSE / "grafana" / "dashboards" / "torpor.json"
CONNECTOR_PREFIX: Final = "torpor_connector_"
# The sample names each metric type exposes, by suffix.
_SUFFIXES: Final = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}


def exported_names(text: str) -> set[str]:
    """Every sample name a /metrics text can carry, from its families (a labelled family
    with no sample yet is declared all the same)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
    return {n for n in names if n.startswith("torpor_")}


def dashboard_metric_names() -> set[str]:
    """The metric names the dashboard's PromQL uses."""
    return {name for expr in _exprs(_dashboard()) for name in re.findall(r"\btorpor_[a-z0-9_]+", expr)}


def _dashboard() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return found


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", ())]


def _yaml(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load(path.read_text())
    return found


def _services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _yaml(COMPOSE / "docker-compose.yml")["services"]
    return services


def _flag(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def _mounts(service: dict[str, Any]) -> dict[Path, str]:
    """A service's bind mounts of files under compose/: host path -> path in the container."""
    found: dict[Path, str] = {}
    for volume in service.get("volumes", ()):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            found[(COMPOSE / source).resolve()] = target
    return found


def test_prometheus_scrapes_exactly_the_services_that_serve_metrics() -> None:
    services = _services()
    serving = {}
    for name, service in services.items():
        command = service.get("command", [])
        port = _flag(command, "--metrics-port")
        if port is not None:
            assert _flag(command, "--metrics-host") == "0.0.0.0", f"{name}: reachable from the network"
            serving[f"{name}:{port}"] = command[1]  # processor or connector
    config = _yaml(COMPOSE / "prometheus" / "prometheus.yml")
    scraped = {target: job["job_name"] for job in config["scrape_configs"]
               for static in job["static_configs"] for target in static["targets"]}
    assert set(scraped) == set(serving) and {"processor:9464", "echo:9464", "timers:9464"} <= set(serving)
    for target, job in scraped.items():
        assert job == {"processor": "torpor-processor", "connector": "torpor-connectors"}[serving[target]]
    prometheus = services["prometheus"]
    (config_file,) = [a.split("=", 1)[1] for a in prometheus["command"] if a.startswith("--config.file=")]
    assert _mounts(prometheus)[(COMPOSE / "prometheus" / "prometheus.yml").resolve()] == config_file


def test_grafana_reads_that_prometheus_and_finds_the_dashboard_where_compose_mounts_it() -> None:
    services = _services()
    grafana = services["grafana"]
    mounted = _mounts(grafana)
    assert mounted[(COMPOSE / "grafana" / "provisioning").resolve()] == "/etc/grafana/provisioning"
    (source,) = _yaml(COMPOSE / "grafana" / "provisioning" / "datasources" / "prometheus.yml")["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "9090" in services["prometheus"]["ports"][0].split(":")[-1]
    (provider,) = _yaml(COMPOSE / "grafana" / "provisioning" / "dashboards" / "torpor.yml")["providers"]
    assert mounted[DASHBOARD.parent.resolve()] == provider["options"]["path"]
    panels = [p for p in _dashboard()["panels"] if p["type"] != "row"]
    assert panels
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": source["uid"]}, panel["title"]
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]


def test_the_dashboard_shows_every_metric_torpor_exports_and_nothing_else() -> None:
    processor = ProcessorMetrics()
    processor.track_histories(HistoryCache(1))  # as `torpor processor` does: its gauge is served
    exported = (exported_names(generate_latest(processor.registry).decode())
                | exported_names(generate_latest(ConnectorMetrics().registry).decode()))
    used = dashboard_metric_names()
    assert used <= exported, used - exported
    families = {re.sub(r"_(total|bucket|count|sum)$", "", name) for name in used}
    declared = {re.sub(r"_(total|bucket|count|sum|created)$", "", name) for name in exported}
    assert families == declared, declared - families


def test_the_dashboard_json_is_what_grafana_provisions() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "torpor" and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for expr in _exprs(dashboard):
        assert expr.count("(") == expr.count(")"), expr
