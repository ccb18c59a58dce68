"""The package refuses, clearly, an interpreter it was not built for."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import python_env


def _other_python():
    """The first python3 on PATH that is not this interpreter's installation."""
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(directory, "python3")
        if not os.access(candidate, os.X_OK):
            continue
        prefix = subprocess.run([candidate, "-c", "import sys; print(sys.base_prefix)"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if prefix.returncode == 0 and prefix.stdout.strip() != sys.base_prefix:
            return candidate
    return None


def test_other_interpreter_is_refused():
    other = _other_python()
    if other is None:
        pytest.skip("no other python3 on PATH")
    out = subprocess.run([other, "-c", "import sluice"], env=python_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert out.returncode != 0
    assert "ImportError: sluice was built for /usr/bin/python3" in out.stderr, out.stderr
    assert "Run it with /usr/bin/python3" in out.stderr


def test_check_refuses_another_prefix(monkeypatch):
    from sluice import _build_info, _interpreter
    monkeypatch.setattr(_build_info, "BASE_PREFIX", "/opt/elsewhere")
    with pytest.raises(ImportError, match="sluice was built for .*prefix /opt/elsewhere"):
        _interpreter.check_interpreter()


def test_this_interpreter_is_accepted():
    from sluice import _interpreter
    _interpreter.check_interpreter()
