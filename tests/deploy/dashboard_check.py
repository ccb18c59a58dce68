#!/usr/bin/python3
"""Every expression of the Grafana dashboard, and every rule, evaluated by a real Prometheus.

    tests/deploy/dashboard_check.py

Starts Debian's `prometheus` on loopback with deploy/monitoring/rules/sluice.rules.yaml loaded and
no target, checks that it loaded every rule group without error, and evaluates each dashboard
query (Grafana variables replaced): a query Prometheus cannot parse or evaluate fails. With data
behind them the same queries are checked by prometheus_test.py.
"""
import sys
import tempfile
import pathlib

import promlib


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="sluice-dashboard-") as tmp:
        prometheus = promlib.Prometheus(pathlib.Path(tmp), scrape_configs=[],
                                        rule_files=[str(promlib.RULES)])
        passed = failed = 0
        try:
            groups = promlib.poll("the rule groups to load",
                                  lambda: prometheus.api("rules")["groups"], timeout=30)
            names = sorted(g["name"] for g in groups)
            if names != ["sluice.alerts", "sluice.recording"]:
                print(f"FAIL rules: loaded groups {names}")
                failed += 1
            else:
                passed += 1
            for title, expr in promlib.dashboard_exprs():
                try:
                    prometheus.query(expr)
                    passed += 1
                except promlib.CheckFailed as e:
                    print(f"FAIL panel {title!r}: {e}")
                    failed += 1
        finally:
            prometheus.stop()
    print(f"dashboard: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
