#!/usr/bin/python3
"""deploy/checks/images.py catches what it claims: each case breaks one thing in a copy of
deploy/ and expects exactly that problem.

    deploy/checks/test/images_test.py KUBECTL
"""
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import images  # noqa: E402

DEPLOY = HERE.parent.parent


def problems_after(kubectl, overlay, change):
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "deploy"
        shutil.copytree(DEPLOY / "kubernetes", copy / "kubernetes")
        shutil.copytree(DEPLOY / "monitoring", copy / "monitoring")
        change(copy / "kubernetes")
        return images.check(kubectl, copy / "kubernetes", overlay)


def edit(path, fn):
    k = yaml.safe_load(path.read_text())
    fn(k)
    path.write_text(yaml.safe_dump(k, sort_keys=False))


def main(argv):
    kubectl = argv[1] if len(argv) > 1 else "kubectl"
    where = "Deployment/sluice-worker container worker"
    cases = [
        ("the tree as it is passes", "production", lambda root: None, []),
        ("an unset tag outside dev fails", "hpa",
         lambda root: edit(root / "overlays/hpa/kustomization.yaml",
                           lambda k: k["images"][0].pop("newTag")),
         "has no tag"),
        ("a localhost/ image outside dev fails", "production",
         lambda root: edit(root / "overlays/production/kustomization.yaml",
                           lambda k: k["images"][0].update(newName="localhost/sluice")),
         "is a localhost/ image"),
        ("an image without a registry fails", "production",
         lambda root: edit(root / "overlays/production/kustomization.yaml",
                           lambda k: k["images"][0].update(newName="sluice")),
         "names no registry"),
        ("an images: entry in the base breaks `kustomize edit set image`", "dev",
         lambda root: edit(root / "base/kustomization.yaml",
                           lambda k: k.update(images=[{"name": "sluice", "newName": "localhost/sluice",
                                                       "newTag": "dev"}])),
         "an `images:` entry outside the overlay renames sluice first"),
    ]
    failed = 0
    for name, overlay, change, want in cases:
        got = problems_after(kubectl, overlay, change)
        ok = got == [] if want == [] else (got and all(want in p for p in got if where in p)
                                           and any(where in p and want in p for p in got))
        print(f"{'ok  ' if ok else 'FAIL'}  {name}" + ("" if ok else f": got {got}"))
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
