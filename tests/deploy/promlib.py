"""A real Prometheus on loopback for tests: start, wait, query, stop. Debian's `prometheus` package.

Used by dashboard_check.py (no targets: every dashboard expression must evaluate) and
prometheus_test.py (scrapes a real local sluice cluster).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "monitoring" / "rules" / "sluice.rules.yaml"
DASHBOARD = REPO / "deploy" / "monitoring" / "dashboards" / "sluice.json"


class CheckFailed(Exception):
    """A test's assertion failed; the message says what was expected and what was found."""


def free_port() -> int:
    """Returns a loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll(what: str, probe: Callable[[], Any], timeout: float, interval: float = 0.25) -> Any:
    """Calls probe() until it returns a truthy value, and returns that value.

    Raises CheckFailed naming `what` (and the last exception probe raised) after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - retried until the deadline, then reported
            last_error = e
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out after {timeout:.0f}s waiting for {what}"
                              + (f" (last error: {last_error})" if last_error else ""))
        time.sleep(interval)


def dashboard_exprs(namespace: str = ".*", sluice_job: str = ".*") -> list[tuple[str, str]]:
    """Returns (panel title, PromQL) for every target of the dashboard, Grafana variables replaced."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$namespace", namespace).replace("$sluice_job", sluice_job)
            expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
            if "$" in expr:
                raise CheckFailed(f"panel {panel['title']!r}: unknown variable in {expr}")
            exprs.append((panel["title"], expr))
    return exprs


class Prometheus:
    """One `prometheus` process on 127.0.0.1 with its own data folder; stop() ends it."""

    def __init__(self, work_dir: pathlib.Path, scrape_configs: list[dict], rule_files: list[str]):
        binary = os.environ.get("PROMETHEUS", shutil.which("prometheus") or "/usr/bin/prometheus")
        if not os.access(binary, os.X_OK):
            raise CheckFailed("prometheus is not installed: apt-get install prometheus "
                              "(scripts/bootstrap.sh lists it)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": rule_files,
            "scrape_configs": scrape_configs,
        }
        work_dir.mkdir(parents=True, exist_ok=True)
        config_file = work_dir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        self.log = work_dir / "prometheus.log"
        self.process = subprocess.Popen(
            [binary, f"--config.file={config_file}", f"--storage.tsdb.path={work_dir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
             "--web.console.templates=/nonexistent", "--web.console.libraries=/nonexistent"],
            stdout=subprocess.DEVNULL, stderr=self.log.open("w"), stdin=subprocess.DEVNULL)
        poll("Prometheus to be ready", self._ready, timeout=60)

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise CheckFailed(f"prometheus exited with {self.process.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def api(self, path: str, **params: str) -> Any:
        """GETs /api/v1/PATH and returns `data`; raises CheckFailed on an error status."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        if body.get("status") != "success":
            raise CheckFailed(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """Evaluates an instant query; returns the vector's samples ([] if empty)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def values(self, expr: str) -> dict[str, float]:
        """An instant query as {label set as text: value}."""
        out = {}
        for sample in self.query(expr):
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample["metric"].items()))
            out[labels] = float(sample["value"][1])
        return out

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def label_set(text: str) -> dict[str, str]:
    """Parses the keys of Prometheus.values() back into a dict."""
    return dict(kv.split("=", 1) for kv in text.split(",")) if text else {}


METRICS_LINE = re.compile(r"metrics on (?:http://)?[^\s:/]+:(\d+)")
