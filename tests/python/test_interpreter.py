"""The package refuses, clearly, an interpreter of another ABI; accepts another installation of
the same Python (a virtualenv, a Docker image's own python3.X)."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import python_env


def _other_python():
    """The first python3 on PATH of another ABI (cache tag) than this interpreter."""
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(directory, "python3")
        if not os.access(candidate, os.X_OK):
            continue
        tag = subprocess.run([candidate, "-c", "import sys; print(sys.implementation.cache_tag)"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if tag.returncode == 0 and tag.stdout.strip() != sys.implementation.cache_tag:
            return candidate
    return None


def test_other_interpreter_is_refused():
    other = _other_python()
    if other is None:
        pytest.skip("no python3 of another version on PATH")
    out = subprocess.run([other, "-c", "import sluice"], env=python_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert out.returncode != 0
    assert "ImportError: sluice was built for /usr/bin/python3" in out.stderr, out.stderr
    assert "Run it with a Python 3.11" in out.stderr


def test_check_refuses_another_abi(monkeypatch):
    from sluice import _build_info, _interpreter
    monkeypatch.setattr(_build_info, "CACHE_TAG", "cpython-310")
    monkeypatch.setattr(_build_info, "PYTHON_VERSION", "3.10.13")
    with pytest.raises(ImportError, match=r"sluice was built for .*\(Python 3.10.13, cpython-310\)"):
        _interpreter.check_interpreter()


def test_check_accepts_another_installation_of_the_same_python(monkeypatch):
    from sluice import _build_info, _interpreter
    monkeypatch.setattr(_build_info, "BASE_PREFIX", "/opt/elsewhere")
    _interpreter.check_interpreter()


def test_this_interpreter_is_accepted():
    from sluice import _interpreter
    _interpreter.check_interpreter()
