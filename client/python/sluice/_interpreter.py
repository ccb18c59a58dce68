"""Refuses, with a message that says what to do, to load the extension in another interpreter.

The extension sluice._sluice is compiled against one Python (its ABI, and the numpy and torch
of that installation). Another interpreter of the same minor version might even load it and then
fail in obscure ways, so the package checks first: same installation (sys.base_prefix, which a
virtualenv of that interpreter shares) and same major.minor version.
"""
import sys

from sluice import _build_info


def check_interpreter() -> None:
    """Raises ImportError unless this interpreter is the one sluice was built for."""
    version = "%d.%d" % sys.version_info[:2]
    built_version = ".".join(_build_info.PYTHON_VERSION.split(".")[:2])
    if sys.base_prefix == _build_info.BASE_PREFIX and version == built_version:
        return
    raise ImportError(
        "sluice was built for %s (Python %s, prefix %s), but this is %s (Python %s, prefix %s). "
        "Run it with %s, or rebuild for this interpreter: "
        "cmake -S . -B build -DPython3_EXECUTABLE=%s && cmake --build build --target sluice_python"
        % (_build_info.PYTHON_EXECUTABLE, _build_info.PYTHON_VERSION, _build_info.BASE_PREFIX,
           sys.executable, sys.version.split()[0], sys.base_prefix,
           _build_info.PYTHON_EXECUTABLE, sys.executable))
