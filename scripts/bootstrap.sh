#!/usr/bin/env bash
# Installs every Debian package sluice needs to build, test and benchmark, then configures and
# builds into build/. Idempotent: packages already present are skipped, the build is incremental.
#
#   scripts/bootstrap.sh            install + configure + build (Release, gcc)
#   SLUICE_SKIP_BUILD=1 scripts/bootstrap.sh   install only
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config git ca-certificates
  clang libclang-rt-14-dev clang-format
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev prometheus-cpp-dev
  libopencv-dev libjpeg62-turbo-dev libwebp-dev
  libgtest-dev libgmock-dev
  libsqlite3-dev libxxhash-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libarchive-dev zlib1g-dev
  pybind11-dev python3-dev python3-numpy python3-pil python3-torch python3-torchvision python3-matplotlib python3-pytest
  prometheus python3-yaml python3-grpcio
  python3-build python3-wheel python3-setuptools python3-venv python3-pip
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[[ "${SLUICE_SKIP_BUILD:-0}" == 1 ]] && exit 0
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build
