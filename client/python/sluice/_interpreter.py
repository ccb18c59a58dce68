"""Refuses, with a message that says what to do, to load the extension in another Python.

The extension sluice._sluice is compiled against one Python ABI (its cache tag, e.g.
cpython-311). Another ABI might even load it and then fail in obscure ways, so the package
checks first. Another installation of the same Python (a virtualenv, a Docker image's
/usr/local/bin/python3.11) is accepted: the extension finds numpy through the Python API at run
time, and pip installs the wheel only where its cp3XX tag fits.
"""
import sys

from sluice import _build_info


def check_interpreter() -> None:
    """Raises ImportError unless this interpreter has the ABI sluice was built for."""
    version = "%d.%d" % sys.version_info[:2]
    built_version = ".".join(_build_info.PYTHON_VERSION.split(".")[:2])
    if sys.implementation.cache_tag == _build_info.CACHE_TAG and version == built_version:
        return
    raise ImportError(
        "sluice was built for %s (Python %s, %s), but this is %s (Python %s, %s). "
        "Run it with a Python %s, or rebuild for this interpreter: "
        "cmake -S . -B build -DPython3_EXECUTABLE=%s && cmake --build build --target sluice_python "
        "(or build a wheel with it: %s -m build --wheel --no-isolation)"
        % (_build_info.PYTHON_EXECUTABLE, _build_info.PYTHON_VERSION, _build_info.CACHE_TAG,
           sys.executable, sys.version.split()[0], sys.implementation.cache_tag,
           built_version, sys.executable, sys.executable))
