"""Fixtures of the Python client's tests: a small Unirecord dataset and a real local cluster
(`sluice local`: a sluice-dispatcher and two sluice-worker processes from build/bin).

    PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python

SLUICE_BUILD_DIR selects another build folder (default: build/ at the repository root).
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("SLUICE_BUILD_DIR", ROOT / "build"))
BIN = BUILD / "bin"
sys.path.insert(0, str(BUILD / "python"))

NUM_IMAGES = 96  # 6 splits of 16, 2 batches of 8 per split
SPLIT_SIZE = 16
BATCH = 8


def run(*argv, **kwargs):
    return subprocess.run([str(a) for a in argv], check=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, **kwargs)


def small_pipeline(random_ops=False):
    """Decode → (random crop + flip | resize + center crop) to 32x32 → normalize → CHW, batch 8."""
    import sluice
    ops = sluice.ops
    crop = ([ops.random_resized_crop(32), ops.random_horizontal_flip()] if random_ops
            else [ops.resize(36), ops.center_crop(32)])
    return (sluice.Pipeline()
            .dataset("/unused")  # replaced by data=
            .columns(["image", "label"])
            .map(["image"], [ops.decode(), *crop,
                             ops.normalize(sluice.IMAGENET_MEAN, sluice.IMAGENET_STD),
                             ops.hwc2chw()])
            .batch(BATCH))


@pytest.fixture(scope="session")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("sluice-python")


@pytest.fixture(scope="session")
def dataset(work):
    """A Unirecord dataset of NUM_IMAGES synthetic JPEGs (absolute path)."""
    for binary in ("sluice", "sluice-dispatcher", "sluice-worker"):
        if not (BIN / binary).exists():
            pytest.fail("%s missing: build first (cmake --build build)" % (BIN / binary))
    run(BIN / "sluice", "datagen", "--output", work / "images", "--images", NUM_IMAGES,
        "--seed", 1)
    run(BIN / "sluice", "record", "convert", "--input", work / "images", "--output",
        work / "ds", "--format", "imagefolder")
    return str(work / "ds")


def start_cluster(work, name, *extra):
    """Starts `sluice local --workers 2 [extra...]` reading `work`; returns (process, address,
    log)."""
    address_file = work / (name + ".address")
    log = open(work / (name + ".log"), "w")
    proc = subprocess.Popen(
        [str(BIN / "sluice"), "local", "--workers", "2", "--data-root", str(work),
         "--address-file", str(address_file), "--work-dir", str(work / name),
         "--log-level", "warn", *extra], stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)  # its own process group, so that stop_cluster can end it all
    deadline = time.monotonic() + 60
    while not address_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("sluice local did not start: " + (work / (name + ".log")).read_text())
        time.sleep(0.05)
    return proc, address_file.read_text().strip(), log


def stop_cluster(proc, log):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # sluice local, its dispatcher and workers
        proc.wait()
    log.close()


@pytest.fixture(scope="session")
def cluster(work, dataset):
    """host:port of a `sluice local --workers 2` cluster that may read `work`."""
    proc, address, log = start_cluster(work, "cluster")
    yield address
    stop_cluster(proc, log)


@pytest.fixture
def own_cluster(work, dataset, request):
    """A cluster of the test's own (for tests that leave a job unfinished on purpose)."""
    proc, address, log = start_cluster(work, "cluster-" + request.node.name)
    yield address
    stop_cluster(proc, log)


@pytest.fixture(scope="session")
def spec_file(work):
    """The small deterministic-op pipeline as a JSON file."""
    path = work / "small.json"
    path.write_text(small_pipeline().to_json())
    return str(path)


_job_counter = [0]


@pytest.fixture
def job(request):
    """A job name of its own for each test (jobs are shared by name)."""
    _job_counter[0] += 1
    return "%s-%d-%d" % (request.node.name, os.getpid(), _job_counter[0])


def python_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(BUILD / "python"), str(Path(__file__).parent)] +
        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def run_python(code, *args):
    """Runs `code` in a new /usr/bin/python3 process; returns its stdout parsed as JSON."""
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=python_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError("child failed (%d): %s" % (out.returncode, out.stderr))
    return json.loads(out.stdout.strip().splitlines()[-1])
