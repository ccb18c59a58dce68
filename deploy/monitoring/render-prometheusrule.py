#!/usr/bin/python3
"""Writes prometheusrule.yaml (the Prometheus operator's PrometheusRule) from rules/sluice.rules.yaml.

The plain rules file is the one source: promtool and the Prometheus test read it, this wraps it.

    deploy/monitoring/render-prometheusrule.py           # rewrite prometheusrule.yaml
    deploy/monitoring/render-prometheusrule.py --check   # exit 1 if prometheusrule.yaml is stale
"""
import pathlib
import sys

import yaml

HERE = pathlib.Path(__file__).resolve().parent
HEADER = """\
# GENERATED from rules/sluice.rules.yaml by render-prometheusrule.py: edit that file, then run
# deploy/monitoring/render-prometheusrule.py (deploy/check.sh fails while this file is stale).
"""


def _block_strings(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    """Multi-line strings (PromQL) as literal blocks, as written in the rules file."""
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


yaml.SafeDumper.add_representer(str, _block_strings)


def render() -> str:
    """Returns the PrometheusRule manifest text for the current rules file."""
    groups = yaml.safe_load((HERE / "rules" / "sluice.rules.yaml").read_text())["groups"]
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "sluice",
            "labels": {
                "app.kubernetes.io/name": "sluice",
                "app.kubernetes.io/instance": "sluice",
                "app.kubernetes.io/component": "monitoring",
            },
        },
        "spec": {"groups": groups},
    }
    return HEADER + yaml.safe_dump(rule, sort_keys=False, width=100)


def main() -> int:
    """Writes or checks prometheusrule.yaml; returns the exit code."""
    target = HERE / "prometheusrule.yaml"
    text = render()
    if sys.argv[1:] == ["--check"]:
        if not target.exists() or target.read_text() != text:
            print(f"{target} is stale: run deploy/monitoring/render-prometheusrule.py", file=sys.stderr)
            return 1
        return 0
    target.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
