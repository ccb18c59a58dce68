#!/usr/bin/python3
"""Writes prometheusrule.yaml (the Prometheus operator's PrometheusRule) from rules/sluice.rules.yaml.

The plain rules file is the one source: promtool and the Prometheus test read it, this wraps it.

    deploy/monitoring/render-prometheusrule.py           # rewrite prometheusrule.yaml
    deploy/monitoring/render-prometheusrule.py --check   # exit 1 if prometheusrule.yaml is stale,
                                                         # or a runbook_url is not absolute or
                                                         # names no heading of docs/deploy.md
    deploy/monitoring/render-prometheusrule.py --runbook-base URL [--output FILE]
        # the PrometheusRule with every runbook_url under URL (where your copy of
        # docs/deploy.md is served), e.g. https://git.example.com/ml/sluice/-/blob/main/docs/deploy.md
"""
import argparse
import pathlib
import re
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


# The base every runbook_url of rules/sluice.rules.yaml starts with.
DEFAULT_RUNBOOK_BASE = "https://sluice.example.com/docs/deploy.md"


def runbook_problems(groups) -> list:
    """runbook_urls that are not absolute or whose anchor is no heading of docs/deploy.md."""
    doc = (HERE.parent.parent / "docs" / "deploy.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.*)$", doc, re.M)}
    problems = []
    for group in groups:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            url = rule.get("annotations", {}).get("runbook_url", "")
            base, _, anchor = url.partition("#")
            if base != DEFAULT_RUNBOOK_BASE:
                problems.append(f"{rule['alert']}: runbook_url {url!r} does not start with "
                                f"{DEFAULT_RUNBOOK_BASE}#")
            elif anchor not in anchors:
                problems.append(f"{rule['alert']}: runbook_url anchor #{anchor} is no heading "
                                f"of docs/deploy.md")
    return problems


def load_groups():
    return yaml.safe_load((HERE / "rules" / "sluice.rules.yaml").read_text())["groups"]


def render(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> str:
    """Returns the PrometheusRule manifest text for the current rules file."""
    groups = load_groups()
    for group in groups:
        for rule in group["rules"]:
            annotations = rule.get("annotations", {})
            if "runbook_url" in annotations:
                annotations["runbook_url"] = annotations["runbook_url"].replace(
                    DEFAULT_RUNBOOK_BASE, runbook_base.rstrip("/"), 1)
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--runbook-base", default=DEFAULT_RUNBOOK_BASE)
    parser.add_argument("--output", type=pathlib.Path, default=HERE / "prometheusrule.yaml")
    args = parser.parse_args()
    if not re.match(r"^https?://", args.runbook_base):
        print(f"--runbook-base {args.runbook_base!r}: not an absolute http(s) URL", file=sys.stderr)
        return 2
    text = render(args.runbook_base)
    if args.check:
        problems = runbook_problems(load_groups())
        for p in problems:
            print(p, file=sys.stderr)
        if not args.output.exists() or args.output.read_text() != text:
            print(f"{args.output} is stale: run deploy/monitoring/render-prometheusrule.py",
                  file=sys.stderr)
            return 1
        return 1 if problems else 0
    args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
