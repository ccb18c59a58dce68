#!/usr/bin/env bash
# Builds Debian's own Abseil (the source package of the installed libabsl20220623, with Debian's
# patches and options.h) with -fsanitize=thread into build-tsan/absl/lib, as shared libraries
# with Debian's sonames. The TSan build (SLUICE_TSAN=ON) runs its tests with LD_LIBRARY_PATH
# pointing there, so absl::Mutex and everything gRPC does with Abseil is instrumented: without
# it TSan cannot see absl::Mutex (Debian's libabsl is uninstrumented) and reports every access
# guarded by one as a race.
#
#   scripts/build_tsan_abseil.sh [BUILD_DIR]     (default build-tsan; idempotent)
#
# Needs root once: adds a deb-src entry for the Debian archive apt already uses and installs
# dpkg-dev. Prints the library folder on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(realpath -m "${1:-build-tsan}")/absl"
version="$(dpkg-query -W -f='${Version}' libabsl20220623)"
stamp="$out/lib/.built-$version"
if [[ -f "$stamp" ]]; then
  echo "$out/lib"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
if ! command -v dpkg-source >/dev/null; then
  apt-get install -y -qq --no-install-recommends dpkg-dev >/dev/null
fi
if ! apt-get source --print-uris -qq "abseil=$version" >/dev/null 2>&1; then
  # The archive entries apt already uses, for source packages too.
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
      >/etc/apt/sources.list.d/sluice-debian-src.sources
  else
    grep -h '^deb ' /etc/apt/sources.list | sed 's/^deb /deb-src /' \
      >/etc/apt/sources.list.d/sluice-debian-src.list
  fi
  apt-get update -qq
fi

rm -rf "$out"
mkdir -p "$out/src"
(cd "$out/src" && apt-get source -qq "abseil=$version" >/dev/null 2>&1)
source_dir="$(find "$out/src" -maxdepth 1 -mindepth 1 -type d -name 'abseil-*' | head -1)"
[[ -n "$source_dir" ]] || { echo "build_tsan_abseil: apt-get source abseil failed" >&2; exit 1; }

# Debian's configuration (debian/rules: C++17, shared) plus TSan; -O1 like our TSan build.
cmake -S "$source_dir" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
  -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF \
  -DCMAKE_INSTALL_PREFIX="$out" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
cmake --build "$out/build" >/dev/null
cmake --install "$out/build" >/dev/null
rm -rf "$out/build" "$out/src"
touch "$stamp"
echo "$out/lib"
