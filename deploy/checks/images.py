#!/usr/bin/python3
"""Every overlay's images resolve: what a cluster would pull is what the overlay says.

    deploy/checks/images.py KUBECTL DEPLOY_KUBERNETES_DIR OVERLAY...

For each overlay (a folder under overlays/):
  1. rendered as it is, every container and init container of the sluice image runs
     REGISTRY/sluice:TAG: a registry host (a first path part with a dot or a port), not
     localhost/, and a tag or digest. Only `dev` may use localhost/sluice:dev (a locally built
     image loaded into kind/minikube);
  2. `kustomize edit set image sluice=REGISTRY/sluice:TAG` works: in a copy of the tree, the
     overlay's kustomization gets exactly the entry that command writes
     ({name: sluice, newName: ..., newTag: ...}, replacing any entry named sluice), and then every
     such container runs that image: no earlier `images:` (in the base or a component) renamed
     `sluice` before the overlay's entry could match it.
Prints one line per problem; exit 1 if there is any.
"""
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

IMAGE_NAME = "sluice"
PROBE_IMAGE = ("registry.invalid:5000/team/sluice", "check-0")


def containers(docs):
    for d in docs:
        spec = (d.get("spec") or {})
        tpl = spec.get("template") or (spec.get("jobTemplate") or {}).get("spec", {}).get("template")
        if not tpl:
            continue
        pod = tpl.get("spec") or {}
        for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
            yield f"{d['kind']}/{d['metadata']['name']} container {c['name']}", c.get("image", "")


def render(kubectl, folder):
    out = subprocess.run([kubectl, "kustomize", str(folder)], check=True, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def repository(image):
    """registry.example.com:5000/team/sluice:1.0@sha256:... -> registry.example.com:5000/team/sluice"""
    name = image.partition("@")[0]
    head, _, last = name.rpartition("/")
    return (head + "/" if head else "") + last.partition(":")[0]


def is_sluice(image):
    return repository(image).rsplit("/", 1)[-1] == IMAGE_NAME


def registry_problem(image):
    """Why `image` would not resolve from a registry, or None."""
    name, _, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    tag = last.partition(":")[2]
    first = name.split("/", 1)[0]
    if name.startswith("localhost/") or first.startswith("localhost:"):
        return "is a localhost/ image (only the dev overlay may use one)"
    if "/" not in name or not ("." in first or ":" in first):
        return "names no registry (REGISTRY/sluice:TAG)"
    if not tag and not digest:
        return "has no tag (REGISTRY/sluice:TAG)"
    return None


def check(kubectl, root, overlay):
    problems = []
    where = f"overlays/{overlay}"
    docs = render(kubectl, root / "overlays" / overlay)
    found = [(w, i) for w, i in containers(docs) if is_sluice(i)]
    if not found:
        problems.append(f"{where}: no container runs the sluice image")
    if overlay != "dev":
        for w, image in found:
            why = registry_problem(image)
            if why:
                problems.append(f"{where}: {w}: image {image} {why}")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "kubernetes"
        shutil.copytree(root, copy)
        shutil.copytree(root.parent / "monitoring", Path(tmp) / "monitoring")
        kfile = copy / "overlays" / overlay / "kustomization.yaml"
        k = yaml.safe_load(kfile.read_text())
        images = [i for i in (k.get("images") or []) if i.get("name") != IMAGE_NAME]
        images.append({"name": IMAGE_NAME, "newName": PROBE_IMAGE[0], "newTag": PROBE_IMAGE[1]})
        k["images"] = images
        kfile.write_text(yaml.safe_dump(k, sort_keys=False))
        want = f"{PROBE_IMAGE[0]}:{PROBE_IMAGE[1]}"
        for w, image in containers(render(kubectl, copy / "overlays" / overlay)):
            if is_sluice(image) and image != want:
                problems.append(f"{where}: after `kustomize edit set image sluice={want}`, {w} "
                                f"still runs {image}: an `images:` entry outside the overlay "
                                f"renames sluice first")
    return problems


def main(argv):
    if len(argv) < 4:
        print(__doc__)
        return 2
    kubectl, root = argv[1], Path(argv[2]).resolve()
    problems = [p for overlay in argv[3:] for p in check(kubectl, root, overlay)]
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
