#!/usr/bin/env bash
# build_llama_server.sh CACHE_DIR
#
# Builds llama.cpp's `llama-server` (CPU only, no web UI, no HTTPS/CURL) from the
# llama.cpp sources vendored in the llama-cpp-python sdist on PyPI, and leaves
# the binary at CACHE_DIR/bin/llama-server.
#
# Idempotent: if CACHE_DIR/bin/llama-server exists and runs (`--version`), it
# does nothing. Only PyPI is contacted (pip download of the sdist).
# Also leaves CACHE_DIR/vocab/ggml-vocab-{llama-spm,gpt-2,llama-bpe,qwen2}.gguf
# (vocabulary-only GGUFs from the same sources) and CACHE_DIR/BUILD_INFO.txt.
#
# Needs: bash, python3 + pip, cmake >= 3.18, g++ (C++17), make, git (optional,
# only for the commit id in --version), libgomp (ships with gcc). Debian:
#   apt-get install -y cmake g++ make git
# NOT needed: libcurl*-dev, libssl-dev, nodejs/npm, ccache.
#
# Environment knobs:
#   LLAMA_CPP_PYTHON_VERSION  sdist version to use            (default 0.3.36)
#   LLAMA_NATIVE=1            build with -march=native         (default 0: portable
#                             AVX2/FMA/F16C/BMI2 build that runs on any x86-64-v3 CPU)
#   LLAMA_JOBS                parallel compile jobs            (default 2)
#   LLAMA_KEEP_BUILD=1        keep CACHE_DIR/work (sources + build tree, ~170 MB)
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 CACHE_DIR" >&2
    exit 2
fi

CACHE_DIR=$(mkdir -p "$1" && cd "$1" && pwd)
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
JOBS=${LLAMA_JOBS:-2}
NATIVE=${LLAMA_NATIVE:-0}
BIN="$CACHE_DIR/bin/llama-server"
WORK="$CACHE_DIR/work"

log() { echo "[build_llama_server $(date +%H:%M:%S)] $*"; }

if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
    log "already built: $BIN"
    "$BIN" --version 2>&1 | sed 's/^/    /'
    exit 0
fi

for tool in cmake g++ make python3; do
    command -v "$tool" >/dev/null 2>&1 || { log "missing tool: $tool (apt-get install -y cmake g++ make)"; exit 1; }
done

T0=$(date +%s)
mkdir -p "$WORK" "$CACHE_DIR/bin"

SDIST="$WORK/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
    log "step 1/4: downloading llama-cpp-python==$VERSION sdist from PyPI"
    python3 -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$VERSION" -d "$WORK/dl"
    mv "$WORK/dl/llama_cpp_python-$VERSION.tar.gz" "$SDIST"
    rm -rf "$WORK/dl"
else
    log "step 1/4: sdist already present: $SDIST"
fi

SRC_ROOT="$WORK/llama_cpp_python-$VERSION"
SRC="$SRC_ROOT/vendor/llama.cpp"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    log "step 2/4: extracting sources"
    tar xzf "$SDIST" -C "$WORK"
else
    log "step 2/4: sources already extracted"
fi

# keep a few vocab-only GGUFs (tokenizer metadata, no weights) for write_tiny_gguf.py --vocab
mkdir -p "$CACHE_DIR/vocab"
for v in llama-spm gpt-2 llama-bpe qwen2; do
    cp -f "$SRC/models/ggml-vocab-$v.gguf" "$CACHE_DIR/vocab/" 2>/dev/null || true
done

if [ "$NATIVE" = "1" ]; then
    CPU_FLAGS=(-DGGML_NATIVE=ON)
else
    CPU_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
fi

CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF          # static libllama/libggml: one self-contained binary
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_TOOLS=ON           # llama-server lives under tools/
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_UI=OFF             # no npm build of the web UI
    -DLLAMA_USE_PREBUILT_UI=OFF      # no download of prebuilt UI assets
    -DLLAMA_OPENSSL=OFF              # no HTTPS (not needed on 127.0.0.1)
    -DLLAMA_CURL=OFF                 # deprecated/ignored in this version; kept for older trees
    -DGGML_CCACHE=OFF
    -DGGML_OPENMP=ON
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF -DGGML_RPC=OFF
    "${CPU_FLAGS[@]}"
)

log "step 3/4: configuring (cmake ${CMAKE_FLAGS[*]})"
cmake -S "$SRC" -B "$WORK/build" "${CMAKE_FLAGS[@]}" > "$WORK/cmake-configure.log" 2>&1 || {
    tail -40 "$WORK/cmake-configure.log"; log "cmake configure failed"; exit 1; }

log "step 4/4: compiling target llama-server with -j$JOBS (about 11 min on 2 cores)"
# full log to a file; a progress line every 20 compiled files (plain bash: mawk buffers its input)
set +e
cmake --build "$WORK/build" --target llama-server -j"$JOBS" 2>&1 | tee "$WORK/cmake-build.log" | {
    n=0
    while IFS= read -r line; do
        case "$line" in
            "["*"%]"*) n=$((n + 1)); [ $((n % 20)) -eq 0 ] && echo "    ${line%% Building*} ($n files, $(( $(date +%s) - T0 ))s)" ;;
            *error:*) echo "    $line" ;;
        esac
    done
}
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
    tail -40 "$WORK/cmake-build.log"; log "build failed"; exit 1
fi

install -m 0755 "$WORK/build/bin/llama-server" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
{
    echo "llama-cpp-python sdist: $VERSION"
    "$BIN" --version 2>&1
    echo "cmake flags: ${CMAKE_FLAGS[*]}"
    echo "build seconds: $(( $(date +%s) - T0 ))"
} > "$CACHE_DIR/BUILD_INFO.txt"

if [ "${LLAMA_KEEP_BUILD:-0}" != "1" ]; then
    rm -rf "$WORK"
fi

log "done in $(( $(date +%s) - T0 ))s: $BIN"
"$BIN" --version 2>&1 | sed 's/^/    /'
