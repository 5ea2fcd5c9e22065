#!/usr/bin/env bash
# Build the host-emulated CANN: bash tests/npu_emulator/build.sh OUT_DIR
#
# Builds against the python on PATH (or $PYTHON) that has torch and torch_npu installed; torch_npu is
# located with importlib.util.find_spec and never imported (it cannot import without CANN). Writes
#   OUT_DIR/lib/                        the stand-in libraries torch_npu loads
#   OUT_DIR/lib-without-loss-apis/      the same, but libopapi.so lacks the loss APIs (an older CANN)
#   OUT_DIR/harness/libc10_keys.so      c10_keys.py's helper (torch_npu on a CUDA build of torch; README.md)
# Nothing here is installed by `pip install .` of the project.
set -euo pipefail

OUT="${1:?usage: build.sh OUT_DIR}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python}"
JOBS="${MAX_JOBS:-2}"
CXX="${CXX:-g++}"
CC="${CC:-gcc}"
# The operator files only glue ATen calls together: -O0 halves their compile time at no real cost.
OPT="${NPU_EMU_OPT:--O0}"
start=$(date +%s.%N)

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
OBJ="$OUT/obj"
GEN="$OUT/gen"
LIB="$OUT/lib"
VAR="$OUT/lib-without-loss-apis"
HARNESS="$OUT/harness"
rm -rf "$OBJ" "$GEN" "$LIB" "$VAR" "$HARNESS"
mkdir -p "$OBJ" "$GEN" "$LIB" "$VAR" "$HARNESS"

# Locate torch and torch_npu without importing torch_npu (torch is imported with the backend autoload off).
eval "$(TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PY" - <<'EOF'
import importlib.util, os, shlex
spec = importlib.util.find_spec("torch_npu")
if spec is None or not spec.submodule_search_locations:
    raise SystemExit("build.sh: torch_npu is not installed for this python")
npu = list(spec.submodule_search_locations)[0]
import torch
tdir = os.path.dirname(torch.__file__)
abi = int(torch.compiled_with_cxx11_abi())
for k, v in {"TORCH_NPU_DIR": npu, "TORCH_DIR": tdir, "CXX11_ABI": str(abi)}.items():
    print(f"{k}={shlex.quote(v)}")
EOF
)"
NPU_LIB="$TORCH_NPU_DIR/lib"
ACL_INC="$TORCH_NPU_DIR/include/third_party/acl/inc"
[ -f "$NPU_LIB/libtorch_npu.so" ] || { echo "build.sh: $NPU_LIB/libtorch_npu.so not found" >&2; exit 1; }

COMMON=(-fPIC -fvisibility=hidden -D_GLIBCXX_USE_CXX11_ABI="$CXX11_ABI" -I"$HERE/src" -I"$ACL_INC" -Wall
        -Wno-unused-parameter -Wno-deprecated-declarations)
TORCH_INC=(-I"$TORCH_DIR/include" -I"$TORCH_DIR/include/torch/csrc/api/include")

# Compile: the ATen-based operator files are slow (10-20 s each), so they go first, at most $JOBS at a time.
pids=()
compile() {  # compile OUT.o SRC FLAGS...
  local out="$1" src="$2"; shift 2
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  "$CXX" -std=c++20 "${COMMON[@]}" "$@" -c "$src" -o "$out" &
  pids+=($!)
}
OPS_SRCS=(ops_base ops_more ops_rows ops_loss)
for s in "${OPS_SRCS[@]}"; do compile "$OBJ/$s.o" "$HERE/src/$s.cpp" "$OPT" "${TORCH_INC[@]}"; done
compile "$OBJ/runtime.o" "$HERE/src/runtime.cpp" -O2
compile "$OBJ/nnopbase.o" "$HERE/src/nnopbase.cpp" -O2
for p in "${pids[@]}"; do wait "$p"; done

# Harvest the names torch_npu needs and generate the stubs and the forwarding trampolines.
"$PY" "$HERE/gen_stubs.py" --torch-npu-lib "$NPU_LIB" --core-objects "$OBJ/runtime.o" \
  --other-objects "$OBJ/nnopbase.o" --out "$GEN"
"$CC" -O1 -fPIC -c "$GEN/stubs.c" -o "$OBJ/stubs.o"
"$CC" -O1 -fPIC -c "$GEN/forward.S" -o "$OBJ/forward_s.o"
"$CC" -O1 -fPIC -c "$GEN/forward.c" -o "$OBJ/forward_c.o"

LDSO=(-shared -Wl,--no-undefined -Wl,-z,defs)
# libascendcl.so: the core (state) and the generic stubs.
"$CXX" "${LDSO[@]}" -Wl,-soname,libascendcl.so -o "$LIB/libascendcl.so" "$OBJ/runtime.o" "$OBJ/stubs.o" -ldl -lpthread
# The other libraries torch_npu links or opens by name forward every name to libascendcl.so.
for name in hccl acl_op_compiler ge_runner graph acl_tdt_channel; do
  "$CC" "${LDSO[@]}" -Wl,-soname,lib$name.so -o "$LIB/lib$name.so" "$OBJ/forward_s.o" "$OBJ/forward_c.o" \
    -L"$LIB" -Wl,--no-as-needed -lascendcl -Wl,--as-needed -ldl -Wl,-rpath,'$ORIGIN'
done
# libnnopbase.so: aclnn objects.
"$CXX" "${LDSO[@]}" -Wl,-soname,libnnopbase.so -o "$LIB/libnnopbase.so" "$OBJ/nnopbase.o" \
  -L"$LIB" -Wl,--no-as-needed -lascendcl -Wl,-rpath,'$ORIGIN'
# libopapi.so: the aclnn operators (links the torch CPU libraries the process has loaded already).
# Only the C API is exported (not the ATen template instances the operator files instantiate).
printf '{ global: acl*; npu_emu_*; local: *; };\n' > "$GEN/opapi.map"
link_opapi() {  # link_opapi OUT OBJS...
  local out="$1"; shift
  "$CXX" "${LDSO[@]}" -Wl,-soname,libopapi.so -Wl,--version-script="$GEN/opapi.map" -o "$out" "$@" \
    -L"$LIB" -Wl,--no-as-needed -lnnopbase -lascendcl \
    -L"$TORCH_DIR/lib" -ltorch_cpu -lc10 -Wl,-rpath,'$ORIGIN' -Wl,-rpath,"$TORCH_DIR/lib"
}
OPS_OBJS=()
for s in "${OPS_SRCS[@]}"; do OPS_OBJS+=("$OBJ/$s.o"); done
link_opapi "$LIB/libopapi.so" "${OPS_OBJS[@]}"
# The variant without the loss APIs (an older CANN toolkit): same objects minus ops_loss.o.
NOLOSS=()
for s in "${OPS_SRCS[@]}"; do [ "$s" = ops_loss ] || NOLOSS+=("$OBJ/$s.o"); done
link_opapi "$VAR/libopapi.so" "${NOLOSS[@]}"
for f in "$LIB"/*.so; do
  [ "$(basename "$f")" = libopapi.so ] || ln -sf "../lib/$(basename "$f")" "$VAR/$(basename "$f")"
done

# A stand-in install tree for ASCEND_HOME_PATH / ASCEND_OPP_PATH (torch_npu checks these directories and reads
# the version from ascend_*_install.info when ASCEND_HOME_PATH is set; emulator.env() sets both).
rm -rf "$OUT/ascend"
mkdir -p "$OUT/ascend/runtime" "$OUT/ascend/compiler" "$OUT/ascend/opp/vendors"
printf 'version=%s\n' "${NPU_EMU_CANN_VERSION:-8.5.0}" > "$OUT/ascend/ascend_toolkit_install.info"

# The test-harness step's helper (c10_keys.py): outside lib/, so torch_npu never loads it, and loaded only by
# the step, in the emulated runs.
"$CXX" -std=c++17 -O1 "${COMMON[@]}" "${LDSO[@]}" -o "$HARNESS/libc10_keys.so" "$HERE/src/c10_keys.cpp"

# Summary.
n_ops=$(nm -D --defined-only "$LIB/libopapi.so" | awk '{print $3}' | grep -E '^aclnn.*GetWorkspaceSize$' | wc -l)
end=$(date +%s.%N)
"$PY" - "$GEN/counts.json" "$LIB" "$n_ops" "$start" "$end" <<'EOF'
import json, os, sys
c = json.load(open(sys.argv[1]))
libs = sorted(f for f in os.listdir(sys.argv[2]) if f.endswith(".so"))
print(f"npu_emulator: built {len(libs)} libraries ({', '.join(libs)}) in {sys.argv[2]}; "
      f"{c['harvested']} CANN symbols harvested from torch_npu ({c['imported']} imported, {c['looked_up']} by dlsym): "
      f"{c['implemented']} implemented, {c['stubbed']} stubbed; {sys.argv[3]} aclnn operators; "
      f"{float(sys.argv[5]) - float(sys.argv[4]):.0f} s")
EOF
