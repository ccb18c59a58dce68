#!/usr/bin/python3
"""The worker autoscaler's replica bounds equal the dispatcher's --min-workers/--max-workers.

    deploy/checks/scale_bounds.py RENDERED.yaml...   # kubectl kustomize output of an overlay

In each rendered overlay that has a KEDA ScaledObject or an HPA for sluice-worker, its min/max
replicas must be the SLUICE_MIN_WORKERS/SLUICE_MAX_WORKERS of the sluice-dispatcher-flags
ConfigMap: otherwise sluice_desired_workers asks for workers the autoscaler never starts (or the
autoscaler allows more than the dispatcher ever asks for). Exit 1 with the differences.
"""
import sys

import yaml


def check(path: str) -> list[str]:
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    flags = next((d["data"] for d in docs if d["kind"] == "ConfigMap"
                  and d["metadata"]["name"].startswith("sluice-dispatcher-flags")), None)
    if flags is None:
        return [f"{path}: no sluice-dispatcher-flags ConfigMap"]
    bounds = {"min": int(flags.get("SLUICE_MIN_WORKERS", 1)), "max": int(flags.get("SLUICE_MAX_WORKERS", 64))}
    errors = []
    for d in docs:
        if d["kind"] == "ScaledObject":
            got = {"min": d["spec"].get("minReplicaCount"), "max": d["spec"].get("maxReplicaCount")}
        elif d["kind"] == "HorizontalPodAutoscaler":
            got = {"min": d["spec"].get("minReplicas"), "max": d["spec"].get("maxReplicas")}
        else:
            continue
        for k in ("min", "max"):
            if got[k] != bounds[k]:
                errors.append(f"{path}: {d['kind']} {d['metadata']['name']}: {k} replicas {got[k]} but the "
                              f"dispatcher's SLUICE_{k.upper()}_WORKERS is {bounds[k]}: set both to the same")
    return errors


def main() -> int:
    errors = [e for path in sys.argv[1:] for e in check(path)]
    for e in errors:
        print(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
