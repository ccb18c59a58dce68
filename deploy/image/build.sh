#!/usr/bin/env bash
# Builds the sluice image on a machine without an image registry, then checks it without running a
# container (this VM cannot: no cgroup setup for an OCI runtime):
#
#   1. base   a Debian 12 root made with debootstrap from the machine's own apt mirror, imported
#             as localhost/sluice-base:debian12 (skipped when that image already exists);
#   2. build  podman build --isolation chroot --storage-driver vfs of deploy/image/Dockerfile
#             with BASE_IMAGE set to that base;
#   3. check  podman image mount (an overlay on top keeps it unmodified), then under chroot as uid
#             10001: every binary's --help and a short
#             local cluster (`sluice demo`: synthetic JPEGs -> dataset -> dispatcher + 2 workers ->
#             one epoch consumed through the client library); then the image's Python wheel
#             pip-installed into a fresh venv here, reading one epoch from a `sluice local`
#             running inside the image.
#   4. python-ops  deploy/image/python-ops.Dockerfile built on that image (Python, numpy, PIL and
#             the example transforms), then checked under chroot as uid 10001: in the sluice
#             image a worker with --allow-python-ops refuses to start (no Python); in the
#             python-ops image a dispatcher and a worker configured as the kustomize component
#             components/python-ops configures them serve examples/python_transforms/train.yaml
#             (its numpy augmentation as a python op) to `sluice consume`.
#
#   deploy/image/build.sh                      # all four, prints how long each took
#   SLUICE_IMAGE=localhost/sluice:dev          # the tag to build (default)
#   SLUICE_PYTHON_OPS_IMAGE=localhost/sluice-python-ops:dev   # step 4's tag (default)
#   SLUICE_IMAGE_STEPS="check"                 # only some steps (base build check python-ops)
#   DEBIAN_MIRROR=URL                          # default: the first Debian URI in /etc/apt
#   SLUICE_IMAGE_CCACHE=DIR                    # compiler cache kept between builds
#                                              #   (default ~/.cache/sluice-image-ccache)
#
# Root only (debootstrap, chroot, podman's vfs storage). Too slow for CI: see docs/deploy.md.
set -euo pipefail
cd "$(dirname "$0")/../.."

image="${SLUICE_IMAGE:-localhost/sluice:dev}"
python_image="${SLUICE_PYTHON_OPS_IMAGE:-localhost/sluice-python-ops:dev}"
base="${SLUICE_BASE_IMAGE:-localhost/sluice-base:debian12}"
steps="${SLUICE_IMAGE_STEPS:-base build check python-ops}"
ccache_dir="${SLUICE_IMAGE_CCACHE:-${HOME:-/root}/.cache/sluice-image-ccache}"

die() { echo "build.sh: $*" >&2; exit 1; }
pm() { podman --storage-driver vfs "$@"; }
step() { [[ " $steps " == *" $1 "* ]]; }
elapsed() { echo "$(( $(date +%s) - $1 ))s"; }

[[ $(id -u) == 0 ]] || die "run as root (debootstrap, chroot and podman's vfs storage need it)"
# podman and debootstrap are Debian's packages, installed here on first use (not by
# scripts/bootstrap.sh: only this script needs them).
if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null; then
  echo "== apt-get install podman debootstrap (Debian's packages; not installed yet)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman debootstrap ||
    die "apt-get install podman debootstrap failed (output above)"
fi
for tool in podman debootstrap chroot; do
  command -v "$tool" >/dev/null || die "$tool is missing: apt-get install podman debootstrap coreutils"
done

debian_mirror() {
  if [[ -n "${DEBIAN_MIRROR:-}" ]]; then echo "$DEBIAN_MIRROR"; return; fi
  local uri
  uri=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk '{print $2}' | grep -E '/debian/?$' | head -1 || true)
  [[ -n "$uri" ]] || uri=$(grep -hE '^deb [^ ]+/debian/? ' /etc/apt/sources.list 2>/dev/null |
                           awk '{print $2}' | head -1 || true)
  [[ -n "$uri" ]] || die "no Debian mirror in /etc/apt: set DEBIAN_MIRROR"
  echo "$uri"
}

if step base; then
  if pm image exists "$base"; then
    echo "== base: $base exists (podman --storage-driver vfs rmi $base to remake it)"
  else
    t0=$(date +%s)
    mirror=$(debian_mirror)
    root=$(mktemp -d /tmp/sluice-base-XXXXXX)
    trap 'rm -rf "$root"' EXIT
    echo "== base: debootstrap bookworm (minbase) from the machine's apt mirror"
    debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 ||
      { tail -20 "$root.log"; die "debootstrap failed (log: $root.log)"; }
    # The same suites as the machine (updates, security) when it uses deb822 sources.
    if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
      cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
      rm -f "$root/etc/apt/sources.list"
    fi
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/tmp/*
    tar -C "$root" -c . | pm import --quiet - "$base" >/dev/null
    rm -rf "$root" "$root.log"
    trap - EXIT
    echo "   base took $(elapsed "$t0")"
  fi
fi

if step build; then
  t0=$(date +%s)
  mkdir -p "$ccache_dir"
  echo "== build: podman build --isolation chroot --storage-driver vfs -> $image"
  pm build --isolation chroot --pull=never --layers \
    --build-arg "BASE_IMAGE=$base" \
    --build-arg "SLUICE_REVISION=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)" \
    --ignorefile deploy/image/Dockerfile.dockerignore \
    --volume "$ccache_dir:/ccache" \
    -f deploy/image/Dockerfile -t "$image" .
  echo "   build took $(elapsed "$t0")"
  pm image inspect --format '   size {{.Size}} bytes, {{len .RootFS.Layers}} layers' "$image"
fi

# mount_image IMAGE: $root is IMAGE's root, writable, as a container runtime would give it;
# run CMD... runs there as uid 10001; cleanup undoes it.
mount_image() {
  mounted="$1"
  mnt=$(pm image mount "$mounted")
  # The image's layer folder is root-only (0700) and must stay unmodified: an overlay on top of it
  # gives a root that uid 10001 can enter and write (/tmp), as a container runtime would.
  ovl=$(mktemp -d /tmp/sluice-image-check-XXXXXX)
  mkdir -p "$ovl/upper" "$ovl/work" "$ovl/root"
  chmod 755 "$ovl/upper"
  trap cleanup EXIT
  root="$ovl/root"
  mount -t overlay overlay -o "lowerdir=$mnt,upperdir=$ovl/upper,workdir=$ovl/work" "$root"
  # /proc: the CLI finds its sibling binaries through /proc/self/exe; /dev: /dev/null, urandom.
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"
  chmod 1777 "$root/tmp"
}
cleanup() {
  umount -R -l "$ovl/root" 2>/dev/null || true
  pm image unmount "$mounted" >/dev/null || true
  rm -rf "$ovl"
}
run() { chroot --userspec=10001:10001 "$root" /usr/bin/env -i HOME=/tmp PATH=/usr/local/bin:/usr/bin:/bin "$@"; }

if step check; then
  t0=$(date +%s)
  echo "== check: podman image mount $image, then chroot as uid 10001"
  mount_image "$image"

  for b in sluice sluice-dispatcher sluice-worker; do
    run "/usr/local/bin/$b" --help >/dev/null || die "$b --help failed inside the image"
    echo "   $b --help as uid 10001: ok"
  done
  [[ $(chroot "$root" id -u sluice) == 10001 ]] || die "user sluice is not uid 10001"
  for tool in gcc g++ cc cmake ninja protoc; do
    [[ ! -e "$root/usr/bin/$tool" ]] || die "the runtime image carries /usr/bin/$tool"
  done
  echo "   short local cluster: sluice demo --images 64 --epochs 1 --workers 2"
  if ! run /usr/local/bin/sluice demo --images 64 --classes 4 --epochs 1 --workers 2 --threads 2 \
      --work-dir /tmp/demo >/tmp/sluice-image-demo.log 2>&1; then
    tail -30 /tmp/sluice-image-demo.log
    die "sluice demo failed inside the image (log: /tmp/sluice-image-demo.log)"
  fi
  tail -5 /tmp/sluice-image-demo.log | sed 's/^/   | /'

  # The image's wheel, as a trainer image installs it: pip into a fresh venv of this machine's
  # Debian python3 (the interpreter the wheel is for), imported from another folder, reading one
  # epoch from a `sluice local` cluster running inside the image.
  echo "   the image's wheel: pip install into a fresh venv, read an epoch from the image's cluster"
  wheel=$(ls "$root"/usr/local/share/sluice/python/sluice-*.whl 2>/dev/null | head -1)
  [[ -n "$wheel" ]] || die "no wheel in /usr/local/share/sluice/python of the image"
  /usr/bin/python3 -m venv --system-site-packages "$ovl/venv"
  "$ovl/venv/bin/python" -m pip install --quiet --no-index --no-deps \
    --disable-pip-version-check "$wheel" || die "pip install $(basename "$wheel") failed"
  run /bin/sh -c 'mkdir -p /tmp/wheel && cd /tmp/wheel &&
    sluice datagen --output jpegs --images 40 --classes 4 >/dev/null 2>&1 &&
    sluice record convert --input jpegs --output ds >/dev/null 2>&1' ||
    die "making the wheel check's dataset inside the image failed"
  # Started without `run`: $! must be sluice local itself (chroot and env exec it) for the TERM.
  chroot --userspec=10001:10001 "$root" /usr/bin/env -i HOME=/tmp PATH=/usr/local/bin:/usr/bin:/bin \
    /usr/local/bin/sluice local --workers 1 --data-root /tmp/wheel \
    --address-file /tmp/wheel/address --work-dir /tmp/wheel/cluster \
    >/tmp/sluice-image-local.log 2>&1 &
  local_pid=$!
  for _ in $(seq 100); do [[ -s "$root/tmp/wheel/address" ]] && break; sleep 0.1; done
  [[ -s "$root/tmp/wheel/address" ]] || die "sluice local did not start in the image (log: /tmp/sluice-image-local.log)"
  read_out=$(cd "$ovl" && env -i PATH=/usr/bin:/bin HOME=/tmp "$ovl/venv/bin/python" - \
      "$(cat "$root/tmp/wheel/address")" <<'PY'
import sys, sluice
spec = {"source": {"dataset": {"path": "/tmp/wheel/ds"}, "columns": ["image", "label"]},
        "nodes": [{"map": {"input_columns": ["image"],
                           "ops": [{"decode": {}}, {"resize": {"height": 8, "width": 8}}]}},
                  {"batch": {"size": 8}}]}
ids = sorted(int(i) for b in sluice.Client(sys.argv[1]).open(spec, job="wheel", epochs=1)
             for i in b["index"])
print(sluice.__file__, "records", len(ids), "exactly once" if ids == list(range(40)) else ids)
PY
  ) || { kill "$local_pid" 2>/dev/null; die "the wheel could not read from the image's cluster"; }
  kill -TERM "$local_pid" 2>/dev/null; wait "$local_pid" 2>/dev/null || true
  echo "   | $read_out"
  [[ "$read_out" == "$ovl/venv/"*"records 40 exactly once" ]] ||
    die "the wheel's read was not every record once from the venv: $read_out"
  cleanup
  trap - EXIT
  echo "   check took $(elapsed "$t0")"
fi

if step python-ops; then
  t0=$(date +%s)
  echo "== python-ops: $python_image from deploy/image/python-ops.Dockerfile on $image, then checked"
  pm build --isolation chroot --pull=never --layers --build-arg "SLUICE_IMAGE=$image" \
    --ignorefile deploy/image/python-ops.Dockerfile.dockerignore \
    -f deploy/image/python-ops.Dockerfile -t "$python_image" . >/tmp/sluice-image-python-ops.log 2>&1 ||
    { tail -30 /tmp/sluice-image-python-ops.log; die "podman build of python-ops.Dockerfile failed"; }
  # The sluice image has no Python: a worker there refuses python ops at start-up.
  mount_image "$image"
  if run /usr/local/bin/sluice-worker --allow-python-ops --dispatcher 127.0.0.1:1 --data-root /tmp \
      >/tmp/sluice-image-python-refused.log 2>&1; then
    die "a worker with --allow-python-ops started in $image, which has no Python"
  fi
  grep -q -- "--allow-python-ops: /usr/bin/python3 cannot run python ops" \
    /tmp/sluice-image-python-refused.log ||
    { cat /tmp/sluice-image-python-refused.log; die "the worker's refusal did not say why"; }
  echo "   $image: a worker with --allow-python-ops refuses to start: ok"
  cleanup
  # In the python-ops image, a dispatcher and a worker configured as components/python-ops
  # configures them (environment only) serve the example pipeline, python op included, to
  # `sluice consume`.
  mount_image "$python_image"
  mkdir -p "$root/tmp/py"
  sed "s#/data/train#/tmp/py/ds#" examples/python_transforms/train.yaml >"$root/tmp/py/spec.yaml"
  chown -R 10001:10001 "$root/tmp/py"
  run /bin/sh -c '
    set -e
    mkdir -p /tmp/py && cd /tmp/py
    sluice datagen --output jpegs --images 128 --classes 4 >/dev/null 2>&1
    sluice record convert --input jpegs --output /tmp/py/ds >/dev/null 2>&1
    sluice-dispatcher --port 0 --address-file d.addr >d.log 2>&1 & d=$!
    for _ in $(seq 100); do [ -s d.addr ] && break; sleep 0.1; done
    SLUICE_ALLOW_PYTHON_OPS=1 SLUICE_PYTHON_PATH=/opt/sluice/python \
      SLUICE_PYTHON_MODULES=augment_numpy,augment_pil,augment_lut \
      sluice-worker --dispatcher "$(cat d.addr)" --port 0 --data-root /tmp/py >w.log 2>&1 & w=$!
    status=0
    sluice consume --dispatcher "$(cat d.addr)" --spec spec.yaml --job python-ops --epochs 1 \
      >consume.log 2>&1 || status=$?
    kill $w $d; wait $w $d 2>/dev/null || true
    tail -3 consume.log
    exit $status' >/tmp/sluice-image-python-ops-run.log 2>&1 ||
    { cat /tmp/sluice-image-python-ops-run.log "$root/tmp/py/w.log"; die "the python-ops image did not serve the python op"; }
  grep -q "images/s" /tmp/sluice-image-python-ops-run.log ||
    { cat /tmp/sluice-image-python-ops-run.log; die "sluice consume printed no throughput"; }
  sed 's/^/   | /' /tmp/sluice-image-python-ops-run.log
  cleanup
  trap - EXIT
  echo "   python-ops took $(elapsed "$t0")"
fi
echo "build.sh: ok ($image)"
