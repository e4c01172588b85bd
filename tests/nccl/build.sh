#!/bin/bash
# Build the NCCL topology harness (main.cc) from an NCCL source checkout, unmodified:
# NCCL's own XML parser and system builder (src/graph/xml.cc, topo.cc and what they need)
# with the link-time stand-ins of stubs.cc.
#   build.sh NCCL_SRC OUT_BINARY [CUDA_HOME]
# Checked with NCCL v2.30.7 (5067397c) and the CUDA 13.0 headers; NCCL's internal headers
# change between releases, so another version may need the stubs adjusted.
set -euo pipefail
NCCL=$(cd "$1" && pwd); OUT=$2; CUDA=${3:-/usr/local/cuda}
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$NCCL/src
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/include"
version() { sed -n "s/^NCCL_$1 *:= *//p" "$NCCL/makefiles/version.mk"; }
MAJOR=$(version MAJOR); MINOR=$(version MINOR); PATCH=$(version PATCH)
CODE=$((MAJOR * 10000 + MINOR * 100 + PATCH))
sed -e "s/\${nccl:Major}/$MAJOR/g" -e "s/\${nccl:Minor}/$MINOR/g" -e "s/\${nccl:Patch}/$PATCH/g" \
    -e 's/\${nccl:Suffix}//g' -e "s/\${nccl:Version}/$CODE/g" "$SRC/nccl.h.in" > "$WORK/include/nccl.h"
CUDA_VERSION=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$CUDA/include/cuda.h")
FLAGS="-DCUDA_MAJOR=$((CUDA_VERSION / 1000)) -DCUDA_MINOR=$((CUDA_VERSION % 1000 / 10)) -DNCCL_OS_LINUX
       -DNCCL_GIN_PROXY_ENABLE=1 -DDOCA_VERBS_USE_CUDA_WRAPPER -DDOCA_VERBS_USE_NET_WRAPPER -std=c++17 -w -O1
       -I$SRC -I$WORK/include -I$SRC/include -I$SRC/include/plugin -I$SRC/graph -I$CUDA/include -I$CUDA/include/cccl"
for f in graph/xml.cc graph/topo.cc misc/utils.cc misc/param.cc os/linux.cc; do
  (cd "$SRC" && g++ $FLAGS -c "$f" -o "$WORK/$(basename "$f" .cc).o")
done
g++ $FLAGS -c "$HERE/main.cc" -o "$WORK/main.o"
g++ $FLAGS -c "$HERE/stubs.cc" -o "$WORK/stubs.o"
g++ -o "$OUT" "$WORK"/{main,stubs,xml,topo,utils,param,linux}.o -L"$CUDA/lib64" -lcudart_static -ldl -lpthread -lrt
