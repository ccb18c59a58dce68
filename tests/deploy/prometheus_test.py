#!/usr/bin/python3
"""A real Prometheus scraping a real local sluice cluster, with the project's rules loaded.

    tests/deploy/prometheus_test.py [--bin-dir build/bin]

Starts sluice-dispatcher and two sluice-worker processes on loopback configured as the pods are
(every flag from the SLUICE_* variables of deploy/kubernetes/base/*.env, ports 0: each prints the
metrics port it bound; gRPC health must answer SERVING, logs must be JSON lines), Debian's `prometheus` scraping them every second as the Kubernetes
monitors would label them (job="sluice-dispatcher" / "sluice-worker", a namespace label) with
deploy/monitoring/rules/sluice.rules.yaml loaded, then two trainers of one job (`sluice consume
--num-consumers 2`, one after the other) reading two epochs of the shipped synthetic pipeline (made
small). It then asserts through /api/v1/query,
polling with a deadline, that:
  - every target is up, and the workers' element counters add up to exactly what was consumed;
  - the dispatcher's per-job series carry sluice_job="promtest": batches returned add up to the
    batches consumed (half after the first trainer, with 1 consumer unfinished, then all with 0),
    trainer wait seconds within the test's duration, no split reassigned;
  - the recording rules hold plausible values: throughput of the job > 0, worker output > 0, 2
    registered workers, desired workers within the manifests' [min, max], the job's and the
    namespace's wait fraction in [0, 1], splits done > 0, busy time per stage for both workers;
  - every dashboard query returns data.
Ends with "prometheus test: N passed, N failed"; exit 1 on any failure.
"""
from __future__ import annotations

import argparse
import json
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
# Dashboard panels with no data in this test: cluster metrics from the kubelet's cAdvisor and
# kube-state-metrics (no Kubernetes here), and errors (a healthy run answers none).
NO_DATA_HERE = {
    "CPU per pod": "cAdvisor and kube-state-metrics series",
    "Memory per pod": "cAdvisor and kube-state-metrics series",
    "Errors by code": "a healthy run may answer none; tests/common/service checks the counters",
}
EPOCHS = 2
RECORDS = 2048  # per epoch: 2 splits of 1024 records; the pipeline's batch size (64) divides it
BATCH = 64
JOB = "promtest"
PIPELINE = promlib.REPO / "deploy" / "kubernetes" / "base" / "pipelines" / "synthetic-train.yaml"


BASE = promlib.REPO / "deploy" / "kubernetes" / "base"


def env_file(name: str) -> dict[str, str]:
    """The SLUICE_* variables of a base/*.env file (the pods' flag ConfigMaps)."""
    out = {}
    for line in (BASE / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = line.split("=", 1)
            out[key] = value
    return out


def flag_of(variable: str) -> str:
    """SLUICE_DRAIN_TIMEOUT -> --drain-timeout."""
    return "--" + variable.removeprefix("SLUICE_").lower().replace("_", "-")


class Cluster:
    """The dispatcher and workers as child processes configured as the pods are: every flag from
    the SLUICE_* variables of base/dispatcher.env and base/worker.env, with loopback addresses and
    free ports instead of the pods' (and the pod IP of SLUICE_ADVERTISE_ADDRESS played by
    127.0.0.1). stop() ends them, workers first (they drain)."""

    def __init__(self, bin_dir: pathlib.Path, work: pathlib.Path, workers: int):
        self.bin_dir, self.work = bin_dir, work
        self.children: list[tuple[str, subprocess.Popen, pathlib.Path]] = []
        address_file = work / "dispatcher.addr"
        d = self._start("dispatcher", [bin_dir / "sluice-dispatcher", "--address-file", address_file],
                        env_file("dispatcher.env") | {
                            "SLUICE_HOST": "127.0.0.1", "SLUICE_PORT": "0", "SLUICE_METRICS_PORT": "0",
                            "SLUICE_METRICS_ADDRESS": "127.0.0.1", "SLUICE_WORK_DIR": str(work / "journal"),
                            "SLUICE_WORKER_TIMEOUT": "2s", "SLUICE_HEARTBEAT_INTERVAL": "200ms",
                            # A finished job is collected a quarter of this after its last
                            # heartbeat, and its series with it: not while the checks read them.
                            "SLUICE_CONSUMER_TIMEOUT": "20m"})
        self.dispatcher_metrics = self._metrics_port(*d)
        self.dispatcher = poll("the dispatcher's address file",
                               lambda: address_file.exists() and address_file.read_text().strip(), 30)
        self.worker_metrics, self.workers = [], []
        for i in range(workers):
            worker_file = work / f"worker{i}.addr"
            w = self._start(f"worker{i}", [bin_dir / "sluice-worker", "--address-file", worker_file],
                            env_file("worker.env") | {
                                "SLUICE_DISPATCHER": self.dispatcher, "SLUICE_HOST": "127.0.0.1",
                                "SLUICE_PORT": "0", "SLUICE_ADVERTISE_ADDRESS": "127.0.0.1",
                                "SLUICE_METRICS_PORT": "0", "SLUICE_METRICS_ADDRESS": "127.0.0.1",
                                "SLUICE_DATA_ROOT": str(work), "SLUICE_THREADS": "1", "SLUICE_MEMORY_MB": "256",
                                "SLUICE_HEARTBEAT_INTERVAL": "200ms"})
            self.worker_metrics.append(self._metrics_port(*w))
            self.workers.append(poll(f"worker{i}'s address file",
                                     lambda f=worker_file: f.exists() and f.read_text().strip(), 30))

    def _start(self, name: str, argv: list, env: dict[str, str]) -> tuple[str, subprocess.Popen, pathlib.Path]:
        out = self.work / f"{name}.out"
        log = self.work / f"{name}.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        p = subprocess.Popen([str(a) for a in argv], stdout=out.open("w"), stderr=log.open("w"),
                             stdin=subprocess.DEVNULL, env=base | env)
        self.children.append((name, p, log))
        return name, p, log

    @staticmethod
    def _metrics_port(name: str, process: subprocess.Popen, log: pathlib.Path) -> int:
        def port():
            if process.poll() is not None:
                raise CheckFailed(f"{name} exited with {process.returncode}:\n{log.read_text()[-2000:]}")
            text = log.read_text(errors="replace") + log.with_suffix(".out").read_text(errors="replace")
            m = promlib.METRICS_LINE.search(text)
            return int(m.group(1)) if m else None
        return poll(f"{name} to print its metrics port", port, timeout=30)

    def logs(self) -> dict[str, str]:
        return {name: log.read_text(errors="replace") for name, _, log in self.children}

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


def health(address: str) -> str:
    """grpc.health.v1.Health/Check for the server as a whole, as the kubelet's grpc probe asks it."""
    import grpc  # Debian's python3-grpcio; the messages are encoded by hand (no generated stubs)

    statuses = {b"": "UNKNOWN", b"\x08\x01": "SERVING", b"\x08\x02": "NOT_SERVING",
                b"\x08\x03": "SERVICE_UNKNOWN"}
    with grpc.insecure_channel(address) as channel:
        response = channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=5)
    return statuses.get(response, f"undecoded {response!r}")


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


def flags_exist(bin_dir: pathlib.Path) -> str:
    """Every SLUICE_* variable the manifests set names a flag of its binary."""
    variables = {"sluice-dispatcher": set(env_file("dispatcher.env")),
                 "sluice-worker": set(env_file("worker.env")) | {"SLUICE_ADVERTISE_ADDRESS"}}
    missing = []
    for binary, names in variables.items():
        text = subprocess.run([str(bin_dir / binary), "--help"], capture_output=True, text=True).stdout
        missing += [f"{binary}: {v} ({flag_of(v)})" for v in sorted(names) if flag_of(v) not in text]
    if missing:
        raise CheckFailed("no such flag: " + "; ".join(missing))
    return f"{sum(len(v) for v in variables.values())} variables"


def json_logs(cluster: Cluster) -> str:
    """SLUICE_LOG_FORMAT=json: every line each process wrote to stderr is one JSON object."""
    lines = 0
    for name, text in cluster.logs().items():
        for line in text.splitlines():
            try:
                if not isinstance(json.loads(line), dict):
                    raise ValueError("not an object")
            except ValueError as e:
                raise CheckFailed(f"{name}: not a JSON log line ({e}): {line[:200]}") from None
            lines += 1
    if not lines:
        raise CheckFailed("no log line at all")
    return f"{lines} lines"


def run(bin_dir: pathlib.Path, work: pathlib.Path) -> Checks:
    checks = Checks()
    checks("every SLUICE_* variable of the manifests is a flag", lambda: flags_exist(bin_dir))
    try:
        cluster = Cluster(bin_dir, work, workers=2)
    except CheckFailed as e:
        checks.failed += 1
        print(f"FAIL  start the cluster from the manifests' variables: {e}")
        return checks
    prometheus = None
    try:
        for name, address in [("dispatcher", cluster.dispatcher)] + [
                (f"worker{i}", a) for i, a in enumerate(cluster.workers)]:
            checks(f"gRPC health of {name} is SERVING",
                   lambda a=address: poll(f"{a} to answer SERVING", lambda: health(a) == "SERVING" and a, 30))
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

        # Two trainers of one job, one after the other: Prometheus sees the job's counters after
        # the first (a counter's first sample shows no increase) and rising during the second.
        job = f'{{job="sluice-dispatcher",namespace="{NAMESPACE}",sluice_job="{JOB}"}}'
        share = RECORDS * EPOCHS // BATCH // 2  # each consumer reads one of the 2 splits per epoch
        started = time.monotonic()
        for consumer in range(2):
            consume = subprocess.run(
                [str(bin_dir / "sluice"), "consume", "--dispatcher", cluster.dispatcher, "--spec",
                 str(small_pipeline(work)), "--job", JOB, "--epochs", str(EPOCHS), "--num-consumers", "2",
                 "--consumer-index", str(consumer)],
                capture_output=True, text=True, timeout=300)
            if consume.returncode != 0:
                raise CheckFailed(f"sluice consume (consumer {consumer}) failed ({consume.returncode}):\n"
                                  f"{consume.stdout}\n{consume.stderr}")
            if consumer == 0:
                def first_trainer_seen():
                    batches = list(prometheus.values(f"sluice_dispatcher_job_batches_returned_total{job}").values())
                    consumers = list(prometheus.values(f"sluice_dispatcher_consumers{job}").values())
                    return batches == [share] and consumers == [1] and f"{share} batches, 1 consumer unfinished"
                checks(f"after the first trainer: {share} batches returned, 1 consumer unfinished",
                       lambda: poll("the first trainer's batches and consumers in Prometheus", first_trainer_seen, 30))
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
        elapsed = time.monotonic() - started
        checks("throughput per job is recorded",
               lambda: recorded(f'namespace_sluice_job:sluice_batches_returned:rate1m{{namespace="{NAMESPACE}",'
                                f'sluice_job="{JOB}"}}', lambda x: 0 < x <= expected // BATCH, "in (0, batches]"))
        checks(f"per-job batches returned add up to the {expected // BATCH} consumed",
               lambda: recorded(f"sluice_dispatcher_job_batches_returned_total{job}",
                                lambda x: x == expected // BATCH, f"== {expected // BATCH}"))
        checks("per-job trainer wait is within the test's duration",
               lambda: recorded(f"sluice_dispatcher_job_consumer_wait_seconds_total{job}",
                                lambda x: 0 <= x <= elapsed, f"in [0, {elapsed:.0f}]"))
        checks("per-job unfinished consumers: 0 once both trainers finished",
               lambda: recorded(f"sluice_dispatcher_consumers{job}", lambda x: x == 0, "== 0"))
        checks("per-job splits reassigned: none",
               lambda: recorded(f"sluice_dispatcher_job_splits_reassigned_total{job}", lambda x: x == 0, "== 0"))
        checks("trainer wait fraction per job is a fraction",
               lambda: recorded(f'namespace_sluice_job:sluice_trainer_wait:ratio{{namespace="{NAMESPACE}",'
                                f'sluice_job="{JOB}"}}', lambda x: 0 <= x <= 1, "in [0, 1]"))
        checks("worker elements and bytes are recorded",
               lambda: recorded(f"namespace:sluice_worker_elements:rate1m{ns} "
                                f"and namespace:sluice_worker_bytes:rate1m{ns} > 0", lambda x: x > 0, "> 0"))
        checks("registered workers: 2",
               lambda: recorded(f"namespace:sluice_workers_registered:max{ns}", lambda x: x == 2, "== 2"))
        lo, hi = (int(env_file("dispatcher.env")[f"SLUICE_{b}_WORKERS"]) for b in ("MIN", "MAX"))
        checks("desired workers is within the manifests' --min/--max-workers",
               lambda: recorded(f"namespace:sluice_workers_desired:max{ns}", lambda x: lo <= x <= hi,
                                f"in [{lo}, {hi}]"))
        checks("missing workers = desired - registered",
               lambda: recorded(f"namespace:sluice_workers_missing:max{ns} == on(namespace) "
                                f"(namespace:sluice_workers_desired:max{ns} - 2)", lambda x: True, "exists"))
        checks("trainer wait fraction is a fraction",
               lambda: recorded(f"namespace:sluice_trainer_wait:ratio{ns}", lambda x: 0 <= x <= 1, "in [0, 1]"))
        checks("splits done are recorded",
               lambda: recorded(f"namespace:sluice_splits_done:rate5m{ns}", lambda x: x > 0, "> 0"))
        checks("the journal (SLUICE_WORK_DIR) reports no write error",
               lambda: recorded(f'sluice_dispatcher_journal_errors_total{{job="sluice-dispatcher",{ns[1:-1]}}}',
                                lambda x: x == 0, "== 0"))
        checks("reassignments are recorded (none here)",
               lambda: recorded(f"namespace:sluice_splits_reassigned:rate5m{ns}", lambda x: x == 0, "== 0"))

        def busy_where_elements():
            def instances(expr, ok):
                return {promlib.label_set(k)["instance"] for k, x in prometheus.values(expr).items() if ok(x)}
            produced = instances(f'sluice_worker_elements_total{{job="sluice-worker",{ns[1:-1]}}}', lambda x: x > 0)
            # A stage's counters appear with its pipeline, possibly after the job's few busy
            # seconds: the raw counter is > 0 and the recorded rate exists on those workers.
            busy = instances(f'sluice_pipeline_stage_busy_seconds_total{{job="sluice-worker",{ns[1:-1]}}}',
                             lambda x: x > 0)
            recorded_rate = instances(f"instance_stage:sluice_pipeline_stage_busy_seconds:rate1m{ns}",
                                      lambda x: x >= 0)
            return sorted(busy) if produced and busy == produced and produced <= recorded_rate else None
        checks("busy time per stage on every worker that produced elements",
               lambda: ", ".join(poll("busy stages on the producing workers", busy_where_elements, 30)))

        for title, expr in promlib.dashboard_exprs(namespace=NAMESPACE):
            if title in NO_DATA_HERE:
                # Evaluates (dashboard_check.py too); its data is not made by this cluster.
                checks(f"dashboard {title!r} evaluates ({NO_DATA_HERE[title]})",
                       lambda expr=expr: "; ".join(sorted(prometheus.values(expr))) or "no series")
                continue
            checks(f"dashboard {title!r} has data",
                   lambda expr=expr: f"{len(poll(expr, lambda: prometheus.query(expr), 30))} series")

        def no_alert_firing():
            firing = [a["labels"]["alertname"] for a in prometheus.api("alerts")["alerts"]
                      if a["state"] == "firing"]
            if firing:
                raise CheckFailed(f"firing: {firing}")
            return "none firing"
        checks("a healthy cluster fires no alert", no_alert_firing)
        checks("logs are JSON lines", lambda: json_logs(cluster))
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
