#!/usr/bin/env python3
"""A real Prometheus scraping a real local sluice cluster, with the project's rules loaded.

    python3 tests/deploy/prometheus_test.py [--bin-dir build/bin]

Starts sluice-dispatcher and two sluice-worker processes on loopback (port 0; each prints the
metrics port it bound), Debian's `prometheus` scraping them every second as the Kubernetes
monitors would label them (job="sluice-dispatcher" / "sluice-worker", a namespace label) with
deploy/monitoring/rules/sluice.rules.yaml loaded, then a trainer (`sluice consume`) reading two
epochs of the shipped synthetic pipeline (made small). It then asserts through /api/v1/query,
polling with a deadline, that:
  - every target is up, and the workers' element counters add up to exactly what was consumed;
  - the recording rules hold plausible values: throughput > 0, 2 registered workers, desired
    workers within [1, 64], a wait fraction in [0, 1], splits done > 0, busy time per stage for
    both workers;
  - every dashboard query returns data.
Ends with "prometheus test: N passed, N failed"; exit 1 on any failure.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import yaml

import promlib
from promlib import CheckFailed, poll

NAMESPACE = "sluice-test"
EPOCHS = 2
RECORDS = 2048  # per epoch: 2 splits of 1024 records; the pipeline's batch size (64) divides it
PIPELINE = promlib.REPO / "deploy" / "kubernetes" / "base" / "pipelines" / "synthetic-train.yaml"


class Cluster:
    """The dispatcher and workers as child processes; stop() ends them (workers drain first)."""

    def __init__(self, bin_dir: pathlib.Path, work: pathlib.Path, workers: int):
        self.bin_dir, self.work = bin_dir, work
        self.children: list[tuple[str, subprocess.Popen, pathlib.Path]] = []
        address_file = work / "dispatcher.addr"
        d = self._start("dispatcher", [bin_dir / "sluice-dispatcher", "--port", "0", "--metrics-port", "0",
                                       "--address-file", address_file, "--heartbeat-interval", "200ms",
                                       "--worker-timeout", "2s"])
        self.dispatcher_metrics = self._metrics_port(*d)
        self.dispatcher = poll("the dispatcher's address file",
                               lambda: address_file.exists() and address_file.read_text().strip(), 30)
        self.worker_metrics = []
        for i in range(workers):
            w = self._start(f"worker{i}", [bin_dir / "sluice-worker", "--dispatcher", self.dispatcher,
                                          "--port", "0", "--metrics-port", "0", "--data-root", work,
                                          "--threads", "1", "--heartbeat-interval", "200ms"])
            self.worker_metrics.append(self._metrics_port(*w))

    def _start(self, name: str, argv: list) -> tuple[str, subprocess.Popen, pathlib.Path]:
        log = self.work / f"{name}.log"
        p = subprocess.Popen([str(a) for a in argv], stdout=log.open("w"), stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        self.children.append((name, p, log))
        return name, p, log

    @staticmethod
    def _metrics_port(name: str, process: subprocess.Popen, log: pathlib.Path) -> int:
        def port():
            if process.poll() is not None:
                raise CheckFailed(f"{name} exited with {process.returncode}:\n{log.read_text()[-2000:]}")
            m = promlib.METRICS_LINE.search(log.read_text(errors="replace"))
            return int(m.group(1)) if m else None
        return poll(f"{name} to print its metrics port", port, timeout=30)

    def stop(self) -> None:
        for _, p, _ in reversed(self.children):  # workers first: they drain, then the dispatcher
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for _, p, _ in reversed(self.children):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Checks:
    """Runs named checks, records pass/fail, never stops at the first failure."""

    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, name: str, fn) -> None:
        try:
            detail = fn()
            self.passed += 1
            print(f"ok    {name}" + (f": {detail}" if detail else ""))
        except CheckFailed as e:
            self.failed += 1
            print(f"FAIL  {name}: {e}")


def small_pipeline(work: pathlib.Path) -> pathlib.Path:
    """The shipped synthetic pipeline with fewer, smaller images (the same nodes and ops)."""
    spec = yaml.safe_load(PIPELINE.read_text())
    spec["source"]["synthetic"].update(num_records=RECORDS, height=64, width=64)
    for node in spec["nodes"]:
        for op in node.get("map", {}).get("ops", []):
            if "random_resized_crop" in op:
                op["random_resized_crop"]["size"] = 32
    path = work / "pipeline.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run(bin_dir: pathlib.Path, work: pathlib.Path) -> Checks:
    checks = Checks()
    cluster = Cluster(bin_dir, work, workers=2)
    prometheus = None
    try:
        labels = {"namespace": NAMESPACE}
        prometheus = promlib.Prometheus(work / "prometheus", rule_files=[str(promlib.RULES)], scrape_configs=[
            {"job_name": "sluice-dispatcher",
             "static_configs": [{"targets": [f"127.0.0.1:{cluster.dispatcher_metrics}"], "labels": labels}]},
            {"job_name": "sluice-worker",
             "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in cluster.worker_metrics],
                                 "labels": labels}]},
        ])
        # Scraped before the job starts, so that the counters' increase is seen by rate().
        poll("3 targets up with the counters at their start",
             lambda: prometheus.values('sum(up{job=~"sluice-.*"})') == {"": 3.0} and
             len(prometheus.query('sluice_worker_elements_total{job="sluice-worker"}')) == 2, timeout=60)

        consume = subprocess.run(
            [str(bin_dir / "sluice"), "consume", "--dispatcher", cluster.dispatcher, "--spec",
             str(small_pipeline(work)), "--job", "promtest", "--epochs", str(EPOCHS)],
            capture_output=True, text=True, timeout=300)
        if consume.returncode != 0:
            raise CheckFailed(f"sluice consume failed ({consume.returncode}):\n{consume.stdout}\n{consume.stderr}")
        expected = RECORDS * EPOCHS

        def elements_total():
            v = prometheus.values('sum(sluice_worker_elements_total{job="sluice-worker"})')
            return v if v.get("") == expected else None
        checks("workers' elements add up to what was consumed",
               lambda: f"{poll(f'sum(sluice_worker_elements_total) == {expected}', elements_total, 30)['']:.0f}")

        def recorded(expr: str, ok, what: str):
            def probe():
                v = prometheus.values(expr)
                return v if v and all(ok(x) for x in v.values()) else None
            try:
                v = poll(f"{expr} {what}", probe, timeout=30)
            except CheckFailed as e:
                raise CheckFailed(f"{e}; now {prometheus.values(expr)}") from None
            return ", ".join(f"{{{k}}} {x:g}" for k, x in v.items())

        ns = f'{{namespace="{NAMESPACE}"}}'
        checks("throughput per job is recorded",
               lambda: recorded(f"namespace_sluice_job:sluice_worker_elements:rate1m{ns}", lambda x: x > 0, "> 0"))
        checks("bytes per job are recorded",
               lambda: recorded(f"namespace_sluice_job:sluice_worker_bytes:rate1m{ns}", lambda x: x > 0, "> 0"))
        checks("registered workers: 2",
               lambda: recorded(f"namespace:sluice_workers_registered:max{ns}", lambda x: x == 2, "== 2"))
        checks("desired workers is plausible",
               lambda: recorded(f"namespace:sluice_workers_desired:max{ns}", lambda x: 1 <= x <= 64, "in [1, 64]"))
        checks("missing workers = desired - registered",
               lambda: recorded(f"namespace:sluice_workers_missing:max{ns} == on(namespace) "
                                f"(namespace:sluice_workers_desired:max{ns} - 2)", lambda x: True, "exists"))
        checks("trainer wait fraction is a fraction",
               lambda: recorded(f"namespace:sluice_trainer_wait:ratio{ns}", lambda x: 0 <= x <= 1, "in [0, 1]"))
        checks("splits done are recorded",
               lambda: recorded(f"namespace:sluice_splits_done:rate5m{ns}", lambda x: x > 0, "> 0"))
        checks("reassignments are recorded (none here)",
               lambda: recorded(f"namespace:sluice_splits_reassigned:rate5m{ns}", lambda x: x == 0, "== 0"))

        def busy_where_elements():
            def instances(expr):
                return {promlib.label_set(k)["instance"] for k, x in prometheus.values(expr).items() if x > 0}
            produced = instances(f'sluice_worker_elements_total{{job="sluice-worker",{ns[1:-1]}}}')
            busy = instances(f"instance_stage:sluice_pipeline_stage_busy_seconds:rate1m{ns}")
            return sorted(busy) if produced and busy == produced else None
        checks("busy time per stage on every worker that produced elements",
               lambda: ", ".join(poll("busy stages on the producing workers", busy_where_elements, 30)))

        for title, expr in promlib.dashboard_exprs(namespace=NAMESPACE):
            checks(f"dashboard {title!r} has data",
                   lambda expr=expr: f"{len(poll(expr, lambda: prometheus.query(expr), 30))} series")

        def no_alert_firing():
            firing = [a["labels"]["alertname"] for a in prometheus.api("alerts")["alerts"]
                      if a["state"] == "firing"]
            if firing:
                raise CheckFailed(f"firing: {firing}")
            return "none firing"
        checks("a healthy cluster fires no alert", no_alert_firing)
    except CheckFailed as e:
        checks.failed += 1
        print(f"FAIL  setup: {e}")
        if prometheus is not None:
            print(prometheus.log_tail())
    finally:
        if prometheus is not None:
            prometheus.stop()
        cluster.stop()
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", type=pathlib.Path,
                        default=pathlib.Path(os.environ.get("SLUICE_BIN_DIR", promlib.REPO / "build" / "bin")))
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, TSDB)")
    args = parser.parse_args()
    for b in ("sluice", "sluice-dispatcher", "sluice-worker"):
        if not os.access(args.bin_dir / b, os.X_OK):
            print(f"prometheus test: {args.bin_dir / b} is missing: build first "
                  "(cmake --build build --target sluice sluice-dispatcher sluice-worker)")
            print("prometheus test: 0 passed, 1 failed")
            return 1
    work = pathlib.Path(tempfile.mkdtemp(prefix="sluice-prometheus-test-"))
    t0 = time.monotonic()
    checks = run(args.bin_dir.resolve(), work)
    if args.keep or checks.failed:
        print(f"work folder (logs, TSDB): {work}")
    else:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    print(f"prometheus test: {checks.passed} passed, {checks.failed} failed "
          f"({time.monotonic() - t0:.0f}s)")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
