"""Builds the `sluice` wheel: the pure-Python modules of client/python/sluice plus the pybind11
extension sluice._sluice, compiled by the project's CMake (pyproject.toml says how to run it).

Environment:
    SLUICE_BUILD_DIR   a CMake build folder to build the extension in (default build/wheel, a
                       Release build of its own); a configured one is reused, so the wheel of a
                       developer build costs one link.
    CMAKE_BUILD_PARALLEL_LEVEL  jobs for the build (default 2).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def project_version() -> str:
    """The version of CMakeLists.txt's project(): the one the binaries' --version print."""
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"project\(sluice VERSION ([0-9.]+)", text)
    if not match:
        sys.exit("setup.py: no `project(sluice VERSION x.y.z` in CMakeLists.txt")
    return match.group(1)


class CMakeBuild(build_ext):
    """Builds sluice_python_ext with CMake for this interpreter and copies the module (and the
    _build_info.py CMake generates beside it) into the wheel."""

    def build_extension(self, ext: Extension) -> None:
        build_dir = Path(os.environ.get("SLUICE_BUILD_DIR", ROOT / "build" / "wheel")).resolve()
        if not (build_dir / "CMakeCache.txt").exists():
            self.spawn(["cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
                        "-DCMAKE_BUILD_TYPE=Release", "-DSLUICE_BENCH=OFF",
                        "-DPython3_EXECUTABLE=" + sys.executable])
        else:
            # A reused build folder must be for this interpreter: the extension is bound to it.
            cache = (build_dir / "CMakeCache.txt").read_text()
            match = re.search(r"^Python3_EXECUTABLE:FILEPATH=(.*)$", cache, re.M)
            built_for = match.group(1) if match else "/usr/bin/python3"
            if os.path.realpath(built_for) != os.path.realpath(sys.executable):
                sys.exit("setup.py: SLUICE_BUILD_DIR %s builds for %s, not %s: use another "
                         "folder or -DPython3_EXECUTABLE=%s" % (build_dir, built_for,
                                                                 sys.executable, sys.executable))
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")
        self.spawn(["cmake", "--build", str(build_dir), "-j", jobs, "--target", "sluice_python"])
        package = build_dir / "python" / "sluice"
        modules = sorted(package.glob("_sluice*.so"))
        if len(modules) != 1:
            sys.exit("setup.py: expected one _sluice*.so in %s, found %s" % (package, modules))
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(modules[0], target)
        shutil.copyfile(package / "_build_info.py", target.parent / "_build_info.py")


# Keep setuptools' scratch out of the source tree (build/ is CMake's and ignored); egg_info
# refuses a folder that does not exist yet, as in a fresh clone.
SCRATCH = ROOT / "build" / "setuptools"
SCRATCH.mkdir(parents=True, exist_ok=True)

setup(
    version=project_version(),
    packages=["sluice"],
    package_dir={"sluice": "client/python/sluice"},
    package_data={"sluice": ["py.typed"]},
    exclude_package_data={"sluice": ["_build_info.py.in"]},
    ext_modules=[Extension("sluice._sluice", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
    options={"build": {"build_base": str(SCRATCH)},
             "egg_info": {"egg_base": str(SCRATCH)}},
)
