"""`python3 -m build --wheel --no-isolation` gives a wheel that pip installs into a fresh virtual
environment and that imports from any directory, without build/python on the path.

The wheel's extension is built in SLUICE_BUILD_DIR (the build the other tests use), so this
costs a link at most; the wheel is built from the repository itself (pyproject.toml, setup.py).
"""
import json
import os
import subprocess
import sys
import zipfile

import pytest

from conftest import BUILD, ROOT


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    dist = tmp_path_factory.mktemp("dist")
    out = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist),
         str(ROOT)], env=_clean_env(SLUICE_BUILD_DIR=str(BUILD)), cwd=str(ROOT),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:]
    wheels = sorted(dist.glob("*.whl"))
    assert [w.name for w in wheels] == [
        "sluice-0.1.0-%s-%s-linux_x86_64.whl" % ((sys.implementation.cache_tag.replace("cpython-", "cp"),) * 2)]
    return wheels[0]


def test_wheel_holds_the_package_and_its_extension(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("__init__.py", "_build_info.py", "_interpreter.py", "client.py", "errors.py",
                   "pipeline.py", "torch.py", "py.typed"):
        assert "sluice/" + module in names
    assert [n for n in names if n.startswith("sluice/_sluice.") and n.endswith(".so")]
    assert "sluice/_build_info.py.in" not in names


def test_wheel_installs_into_a_fresh_venv_and_imports_from_anywhere(wheel, tmp_path):
    venv = tmp_path / "venv"
    # --system-site-packages: numpy and torch come from Debian's packages.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, env=_clean_env())
    python = venv / "bin" / "python"
    out = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "--no-deps",
                          "--disable-pip-version-check", str(wheel)], env=_clean_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert out.returncode == 0, out.stdout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Imports the installed copy (not the source tree, not build/python), builds a pipeline
    # and calls into the extension: a dispatcher that is not there is sluice.Unavailable.
    code = """
import json, sluice, sluice.torch
p = sluice.Pipeline().synthetic(num_records=8, height=4, width=4).batch(2)
try:
    sluice.Client("127.0.0.1:1", timeout=0.5)
    error = None
except sluice.Unavailable as e:
    error = type(e).__name__
print(json.dumps({"file": sluice.__file__, "error": error,
                  "dataset": sluice.torch.DataServiceDataset.__name__}))
"""
    out = subprocess.run([str(python), "-c", code], cwd=str(elsewhere), env=_clean_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["file"] == str(venv / "lib" / ("python%d.%d" % sys.version_info[:2]) /
                                 "site-packages" / "sluice" / "__init__.py")
    assert result["error"] == "Unavailable"
    assert result["dataset"] == "DataServiceDataset"
