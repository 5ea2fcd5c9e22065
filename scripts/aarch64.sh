#!/usr/bin/env bash
# aarch64 Linux (the host CPU of most Ascend servers, e.g. Kunpeng 920) on an x86-64 Debian 12 machine:
# cross-build npu_loss_ops with aarch64-linux-gnu-g++ and run it under qemu-aarch64-static.
#
#   bash scripts/aarch64.sh slice   sysroot, torch, cross-build, and a slice of about 700 tests (listed in
#                                   SLICE below) in two workers: about 4 minutes after the setup, a first
#                                   look before the whole suite (CI runs neither: the release table's rows)
#   bash scripts/aarch64.sh full    sysroot, torch, cross-build, and the whole suite without the tests over
#                                   2**31 elements (-m "not large") and with 2 of the 38 memory-bound probes
#                                   (MEMORY_PROBES below), in two workers, for scripts/check_releases.sh
#   bash scripts/aarch64.sh npu     sysroot, torch, cross-build, and the NPU build check (scripts/check_releases.sh's
#                                   aarch64-npu row)
#   bash scripts/aarch64.sh setup   sysroot, torch and cross-build only
# Arguments after slice or full go to pytest. Each stage prints its wall time, and a summary at the end.
#
# Everything lives under build/aarch64/ (removing it starts from scratch; each stage skips what is done):
#   sysroot/   an arm64 Python 3.11 and its libraries, unpacked (dpkg -x) from Debian's arm64 .debs, plus an
#              arm64 /proc/cpuinfo (qemu's -L redirects the path: torch's cpuinfo segfaults on the x86 one)
#   venv/      a venv whose bin/python is a shell wrapper running the sysroot's python under qemu, so that
#              sys.executable, and every subprocess a test starts through it, is aarch64 too; torch and the
#              test tools are installed into it by the HOST pip (--platform ..._aarch64: pip under qemu
#              takes 10 to 30 minutes for the same)
#   src/       a copy of the checkout's files (git's tracked and untracked ones), built in place (editable)
#              and tested there: an aarch64 build in the checkout itself would overwrite
#              npu_loss_ops/_build_torch.py, the x86 build's record of its torch, under the engineers using
#              it. Its build/objects is the checkout's build/objects, so both architectures' objects share one
#              store, apart by setup.py's build key (which names the architecture)
#   venv-npu/  the same torch (through a .pth, not a second 4 GB copy) plus the aarch64 torch-npu wheel, and
#              npu_loss_ops with its NPU kernels built (not editable) from src/: only _C_npu's objects compile
#   bin/       the C++ compiler torch.compile's inductor gets in the tests (see write_runtime_cxx)
#   *.log      the builds' and the test runs' output
#
# Never registers or mounts binfmt_misc (the kernel is shared): every aarch64 program runs as
# `qemu-aarch64-static -L <sysroot> ...`, and x86 programs (ninja, the cross compiler) run natively.
# Nothing arm64 is installed into the system: apt-get works from a private state directory.
#
# Knobs: NPU_LOSS_OPS_TORCH_VERSION (default: build_config.py --torch-version; another release gets venvs of
# its own), NPU_LOSS_OPS_AARCH64_DIR (instead of build/aarch64: one sysroot and venv for several clones, e.g.
# scripts/check_releases.sh's clean clone of each commit), MAX_JOBS (default 2), QEMU_CPU (default
# neoverse-n1: ARMv8.2 without SVE, the closest qemu has to Kunpeng 920's TaiShan v110 cores),
# NPU_LOSS_OPS_REBUILD=1 (rebuild even when the sources did not change).
# Timings under qemu say nothing about aarch64 speed.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${NPU_LOSS_OPS_AARCH64_DIR:-$REPO_ROOT/build/aarch64}"
SYSROOT="$WORK/sysroot"
DEFAULT_QEMU_CPU=neoverse-n1
export QEMU_CPU="${QEMU_CPU:-$DEFAULT_QEMU_CPU}"
export MAX_JOBS="${MAX_JOBS:-2}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
HOST_PYTHON="${HOST_PYTHON:-python3}"

_log() { printf '[aarch64 %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
_die() { _log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------------------------------------------------
# Stage timing: `stage NAME FUNCTION` runs FUNCTION, prints its wall time, and the EXIT trap prints them all.

STAGE_TIMES=()
CURRENT_STAGE=""
CURRENT_T0=0
stage() {
  CURRENT_STAGE="$1" CURRENT_T0=$SECONDS
  shift
  _log "stage $CURRENT_STAGE: start"
  "$@"
  STAGE_TIMES+=("$CURRENT_STAGE: $((SECONDS - CURRENT_T0)) s")
  _log "stage $CURRENT_STAGE: done in $((SECONDS - CURRENT_T0)) s"
  CURRENT_STAGE=""
}
# At exit: every stage's wall time (a failed one marked), then pytest's own summary line again, so that a run
# ends with it.
_print_times() {
  local status=$? line
  [[ -n "$CURRENT_STAGE" ]] && STAGE_TIMES+=("$CURRENT_STAGE: $((SECONDS - CURRENT_T0)) s (failed)")
  ((${#STAGE_TIMES[@]})) || return 0
  _log "wall time per stage (exit status $status; qemu timings say nothing about aarch64 speed):"
  for line in "${STAGE_TIMES[@]}"; do printf '[aarch64]   %s\n' "$line" >&2; done
  if [[ -n "$PYTEST_LOG" && -f "$PYTEST_LOG" ]]; then
    grep -E '^=+ .* in [0-9.]+s( \([0-9:]+\))? =+$' "$PYTEST_LOG" | tail -n 1 || true
  fi
}
PYTEST_LOG=""
trap _print_times EXIT

# ---------------------------------------------------------------------------------------------------------
# Host tools: qemu-user (static, so it runs without an aarch64 loader), the cross compiler, the cross binutils
# (readelf/nm/strings for aarch64 objects in the NPU build check), and ninja and pip on the host.

HOST_TOOLS=(qemu-aarch64-static:qemu-user-static aarch64-linux-gnu-g++:g++-aarch64-linux-gnu
  aarch64-linux-gnu-readelf:binutils-aarch64-linux-gnu ninja:ninja-build)

ensure_host_tools() {
  local entry missing=()
  for entry in "${HOST_TOOLS[@]}"; do
    command -v "${entry%%:*}" >/dev/null 2>&1 || missing+=("${entry#*:}")
  done
  if ((${#missing[@]})); then
    [[ "$(id -u)" == 0 ]] || _die "missing host tools; as root: apt-get install ${missing[*]}"
    _log "installing host tools: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
  fi
  "$HOST_PYTHON" -m pip --version >/dev/null 2>&1 || _die "$HOST_PYTHON has no pip (HOST_PYTHON=... names another)"
}

# ---------------------------------------------------------------------------------------------------------
# The sysroot: Debian bookworm's arm64 Python 3.11 and the libraries it loads, unpacked with dpkg -x.
# apt-get runs on a private configuration under build/aarch64/apt (its own sources, lists, cache and an
# empty dpkg status), so the system's apt and dpkg configuration (dpkg --add-architecture) stay untouched.

SYSROOT_DEBS=(
  python3.11 python3.11-minimal python3.11-venv python3.11-dev
  libpython3.11 libpython3.11-minimal libpython3.11-stdlib libpython3.11-dev
  libc6 libgcc-s1 gcc-12-base libstdc++6 libgomp1 zlib1g libbz2-1.0 liblzma5 libzstd1 libexpat1 libffi8
  libssl3 libsqlite3-0 libncursesw6 libtinfo6 libreadline8 libuuid1 libdb5.3 libgdbm6 libgdbm-compat4
  libnsl2 libtirpc3 libtirpc-common libgssapi-krb5-2 libk5crypto3 libkrb5-3 libkrb5support0 libkeyutils1
  libcom-err2 libcrypt1 media-types
)
APT_DIR="$WORK/apt"

_apt() {
  apt-get -q -o Dir::Etc::SourceList="$APT_DIR/sources.list" -o Dir::Etc::SourceParts="$APT_DIR/sources.list.d" \
    -o Dir::State="$APT_DIR/state" -o Dir::State::Status="$APT_DIR/state/status" -o Dir::Cache="$APT_DIR/cache" \
    -o APT::Architecture=arm64 -o APT::Architectures::=arm64 -o Debug::NoLocking=1 -o APT::Sandbox::User=root "$@"
}

_private_apt() {
  mkdir -p "$APT_DIR/sources.list.d" "$APT_DIR/state/lists/partial" "$APT_DIR/cache/archives/partial"
  touch "$APT_DIR/state/status"
  local key=/usr/share/keyrings/debian-archive-keyring.gpg
  cat >"$APT_DIR/sources.list" <<SOURCES
deb [arch=arm64 signed-by=$key] http://deb.debian.org/debian bookworm main
deb [arch=arm64 signed-by=$key] http://deb.debian.org/debian bookworm-updates main
deb [arch=arm64 signed-by=$key] http://deb.debian.org/debian-security bookworm-security main
SOURCES
  _apt update
}

# An arm64 /proc/cpuinfo, one entry per host CPU (what torch's cpuinfo parses at import; on the host's x86
# file it segfaults under qemu 7.2), and each core's MIDR_EL1. The features and ids are a Kunpeng 920's
# (implementer 0x48, part 0xd01), matching QEMU_CPU=neoverse-n1's ARMv8.2 feature set.
_write_cpuinfo() {
  local cpu
  mkdir -p "$SYSROOT/proc"
  for ((cpu = 0; cpu < $(nproc); cpu++)); do
    printf '%s\n' "processor	: $cpu" "BogoMIPS	: 200.00" \
      "Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma dcpop asimddp asimdfhm" \
      "CPU implementer	: 0x48" "CPU architecture: 8" "CPU variant	: 0x1" "CPU part	: 0xd01" "CPU revision	: 0" ""
  done >"$SYSROOT/proc/cpuinfo"
  # oneDNN's xbyak_aarch64 reads each core's MIDR_EL1 from sysfs and prints "Can't open MIDR_EL1 sysfs
  # entry" at `import torch` without it (tests compare subprocesses' stderr): the same Kunpeng 920 id.
  for ((cpu = 0; cpu < $(nproc); cpu++)); do
    mkdir -p "$SYSROOT/sys/devices/system/cpu/cpu$cpu/regs/identification"
    echo 0x00000000481fd010 >"$SYSROOT/sys/devices/system/cpu/cpu$cpu/regs/identification/midr_el1"
  done
}

build_sysroot() {
  local want
  want="$(printf '%s\n' "${SYSROOT_DEBS[@]}")"
  if [[ -x "$SYSROOT/usr/bin/python3.11" && -f "$SYSROOT/.debs" && "$(cat "$SYSROOT/.debs")" == "$want" ]]; then
    _log "sysroot $SYSROOT is up to date"
    _write_cpuinfo
    return 0
  fi
  _private_apt
  rm -rf "$SYSROOT" "$WORK/debs"
  mkdir -p "$SYSROOT" "$WORK/debs"
  (cd "$WORK/debs" && _apt download "${SYSROOT_DEBS[@]/%/:arm64}")
  local deb
  for deb in "$WORK"/debs/*.deb; do dpkg -x "$deb" "$SYSROOT"; done
  _write_cpuinfo
  echo "$want" >"$SYSROOT/.debs"
  _log "sysroot: $(ls "$WORK"/debs/*.deb | wc -l) debs, $(du -sh "$SYSROOT" | cut -f1) unpacked"
  # Unpacked, the .debs and apt's lists (40 MB) are of no further use.
  rm -rf "$WORK/debs" "$APT_DIR"
}

# ---------------------------------------------------------------------------------------------------------
# Venvs whose python is aarch64. The venv is made by the sysroot's python under qemu (--without-pip: pip comes
# from the host's pip below), then bin/python becomes a wrapper script: qemu's -0 "$0" passes the wrapper's
# own path as argv[0], so Python finds the venv's pyvenv.cfg and sys.executable is the wrapper, and the
# subprocesses tests start (sys.executable), multiprocessing's spawn and pip's build backends all run aarch64.
# Without binfmt_misc the kernel cannot run an aarch64 program by itself: anything that execs one must go
# through such a wrapper. The sysroot gets one too, as usr/bin/python: the base interpreter a venv made
# *inside* the emulation (the tests' temporary venvs) links to.

_write_wrapper() {
  local qemu
  qemu="$(command -v qemu-aarch64-static)"
  cat >"$1" <<WRAPPER
#!/bin/sh
# The aarch64 Python 3.11 of $SYSROOT under qemu-user (written by scripts/aarch64.sh).
# QEMU_CPU: the emulated core (neoverse-n1: ARMv8.2 without SVE, like Kunpeng 920's).
export QEMU_CPU="\${QEMU_CPU:-$DEFAULT_QEMU_CPU}"
exec $qemu -L "$SYSROOT" -0 "\$0" "$SYSROOT/usr/bin/python3.11" "\$@"
WRAPPER
  chmod +x "$1"
}

# make_venv DIR: an aarch64 venv at DIR (kept when its wrapper already runs).
make_venv() {
  local dir="$1"
  _write_wrapper "$SYSROOT/usr/bin/python"
  if [[ -f "$dir/pyvenv.cfg" && "$("$dir/bin/python" -c 'import platform; print(platform.machine())' 2>/dev/null)" == aarch64 ]]; then
    _log "reusing venv $dir"
    return 0
  fi
  rm -rf "$dir"
  _log "creating the aarch64 venv $dir"
  qemu-aarch64-static -L "$SYSROOT" "$SYSROOT/usr/bin/python3.11" -m venv --without-pip "$dir"
  rm -f "$dir/bin/python" "$dir/bin/python3" "$dir/bin/python3.11"
  _write_wrapper "$dir/bin/python"
  ln -s python "$dir/bin/python3"
  ln -s python "$dir/bin/python3.11"
  [[ "$("$dir/bin/python" -c 'import platform; print(platform.machine())')" == aarch64 ]] \
    || _die "the venv's python at $dir does not run as aarch64"
}

# The venv's site-packages, as the host sees it (the venv's python would print the same path).
site_packages() { echo "$1/lib/python3.11/site-packages"; }

# ---------------------------------------------------------------------------------------------------------
# torch and the test tools: the HOST pip installs aarch64 wheels straight into the venv's site-packages
# (pip under qemu takes 10 to 30 minutes for the same). pip takes each --platform as one exact tag, so every
# manylinux_2_NN tag a dependency may carry is listed (nvidia-cudnn-cu13 is manylinux_2_27, nvidia-nccl-cu13
# manylinux_2_18: with fewer tags they are "not found"). The registry's aarch64 torch is its CUDA 13 build
# (about 4 GB with its nvidia-* packages); it runs on the CPU. ninja is not installed: its aarch64 binary
# could not run here, and the build uses the host's.

TORCH_VERSION="${NPU_LOSS_OPS_TORCH_VERSION:-$("$HOST_PYTHON" "$REPO_ROOT/build_config.py" --torch-version)}"
[[ "$TORCH_VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || _die "NPU_LOSS_OPS_TORCH_VERSION must be an exact release, got '$TORCH_VERSION'"
if [[ "$TORCH_VERSION" == "$("$HOST_PYTHON" "$REPO_ROOT/build_config.py" --torch-version)" ]]; then SUFFIX=""; else SUFFIX="-torch$TORCH_VERSION"; fi
VENV="$WORK/venv$SUFFIX"
NPU_VENV="$WORK/venv-npu$SUFFIX"
SRC="$WORK/src$SUFFIX"
# mypy at the release scripts/run_tests.sh pins (tests/test_typing.py runs it).
MYPY_PIN="$(grep -o 'mypy==[0-9.]*' "$REPO_ROOT/scripts/run_tests.sh" | head -n 1)"
TOOLS=(pip setuptools wheel pytest pytest-xdist==3.8.0 expecttest hypothesis numpy ${MYPY_PIN:-mypy})

# host_pip_aarch64 TARGET REQUIREMENT...: aarch64 cp311 wheels into the directory TARGET.
AARCH64_PLATFORMS=()
for ((n = 17; n <= 39; n++)); do AARCH64_PLATFORMS+=(--platform "manylinux_2_${n}_aarch64"); done
AARCH64_PLATFORMS+=(--platform manylinux2014_aarch64 --platform linux_aarch64)
AARCH64_WHEELS=(--python-version 3.11 --implementation cp --abi cp311 --only-binary=:all: "${AARCH64_PLATFORMS[@]}")
host_pip_aarch64() {
  local target="$1"
  shift
  "$HOST_PYTHON" -m pip install --progress-bar off --upgrade --target "$target" "${AARCH64_WHEELS[@]}" "$@" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
  # (the grep drops the noise of this machine's pip configuration; success is checked by the caller)
}

# The version of DISTRIBUTION installed in the site-packages SITE, read from its dist-info (no Python needed).
installed_version() {
  local site="$1" name="${2//-/_}" meta
  meta="$(compgen -G "$site/${name}-*.dist-info/METADATA" | head -n 1)" || return 0
  [[ -n "$meta" ]] && sed -n 's/^Version: //p' "$meta" | head -n 1
}

install_torch() {
  local site want have
  site="$(site_packages "$VENV")"
  want="$(printf '%s\n' "torch==$TORCH_VERSION" "${TOOLS[@]}")"
  have="$(installed_version "$site" torch)"
  if [[ "${have%%+*}" == "$TORCH_VERSION" && -f "$site/.aarch64-requirements" \
        && "$(cat "$site/.aarch64-requirements")" == "$want" ]]; then
    _log "torch $have and the test tools are already in $VENV"
  else
    _log "installing torch==$TORCH_VERSION ${TOOLS[*]} (aarch64 wheels) into $site with the host's pip"
    host_pip_aarch64 "$site" "torch==$TORCH_VERSION" "${TOOLS[@]}"
    have="$(installed_version "$site" torch)"
    [[ "${have%%+*}" == "$TORCH_VERSION" ]] || _die "torch==$TORCH_VERSION did not install (found '${have}')"
    echo "$want" >"$site/.aarch64-requirements"
  fi
  # --target leaves the console scripts with the host's interpreter in their #! line; nothing here uses them.
  "$VENV/bin/python" -c 'import torch, platform; print(f"[aarch64] torch {torch.__version__} on {platform.machine()}, {torch.get_num_threads()} threads")' >&2
}

# ---------------------------------------------------------------------------------------------------------
# The cross-build. The source copy is refreshed from the checkout (git's tracked and untracked files, so an
# engineer's uncommitted work is built too; mtimes kept, so ninja recompiles only what changed), and is a git
# repository of its own: tests (test_install_paths) and setup_env.sh list files with git ls-files.

# sync_sources DEST: DEST holds exactly the checkout's files (and what builds left there).
sync_sources() {
  local dest="$1" list
  mkdir -p "$dest"
  list="$(cd "$REPO_ROOT" && git ls-files -co --exclude-standard | LC_ALL=C sort | while IFS= read -r f; do
    if [[ -f "$f" ]]; then printf '%s\n' "$f"; fi; done)"
  if [[ -f "$dest/.aarch64-manifest" ]]; then
    # Files the checkout no longer has.
    comm -23 "$dest/.aarch64-manifest" <(printf '%s\n' "$list") | (cd "$dest" && xargs -r -d '\n' rm -f)
  fi
  (cd "$REPO_ROOT" && printf '%s\n' "$list" | xargs -r -d '\n' cp -p --parents -t "$dest")
  printf '%s\n' "$list" >"$dest/.aarch64-manifest"
  grep -qxF .aarch64-manifest "$dest/.git/info/exclude" 2>/dev/null \
    || { git -C "$dest" init -q && printf '%s\n' .aarch64-manifest .aarch64-build .aarch64-npu-build >>"$dest/.git/info/exclude"; }
}

# The cross compilers, and the sysroot's Python headers ahead of the host's: the include directory torch
# names is the one the aarch64 interpreter reports, and without CPPFLAGS the host's x86 pyconfig.h would be
# found first ("fatal error: aarch64-linux-gnu/python3.11/pyconfig.h"). -idirafter: the sysroot's other
# headers only where the cross toolchain's own have nothing.
CROSS_ENV=(CC=aarch64-linux-gnu-gcc CXX=aarch64-linux-gnu-g++ "LDSHARED=aarch64-linux-gnu-g++ -shared"
  AR=aarch64-linux-gnu-ar "CPPFLAGS=-I$SYSROOT/usr/include/python3.11 -idirafter $SYSROOT/usr/include"
  MAX_JOBS="$MAX_JOBS")

# What a build depends on, beyond the sources' mtimes: the sources' contents, torch's version, the flags.
build_digest() {
  { (cd "$1" && xargs -d '\n' sha256sum <.aarch64-manifest); installed_version "$(site_packages "$2")" torch
    installed_version "$(site_packages "$2")" torch_npu; printf '%s\n' "${CROSS_ENV[@]}"
    # setup.py's build switches: a DEBUG=1 (-O0) or sanitized build is not the release build.
    printf 'DEBUG=%s SANITIZE=%s\n' "${DEBUG:-}" "${NPU_LOSS_OPS_SANITIZE:-}"; } | sha256sum | cut -d' ' -f1
}

# pip_build SRC VENV LOG PIP-ARGS...: pip under qemu builds SRC with the cross compilers; the log keeps its output.
pip_build() {
  local src="$1" venv="$2" log="$3" status=0
  shift 3
  _log "building in $src under qemu (MAX_JOBS=$MAX_JOBS; log: $log)"
  (cd "$src" && env "${CROSS_ENV[@]}" "$venv/bin/python" -m pip install -v --progress-bar off \
    --no-build-isolation --no-deps "$@") >"$log" 2>&1 || status=$?
  grep -E '^\s*\[[0-9]+/[0-9]+\]' "$log" | sed -E 's/^\s*(\[[0-9]+\/[0-9]+\]).* -c ([^ ]+).*/\1 \2/' \
    | sed "s|$src/||" | cut -c1-100 >&2 || true
  if ((status)); then
    tail -n 60 "$log" >&2
    _die "the cross-build failed (pip exit status $status); full log: $log"
  fi
}

# share_objects SRC: SRC compiles into the checkout's build/objects, whose directories setup.py names by build
# key (which names the architecture).
share_objects() {
  mkdir -p "$1/build" "$REPO_ROOT/build/objects"
  [[ -L "$1/build/objects" ]] || rm -rf "$1/build/objects"
  ln -sfn "$REPO_ROOT/build/objects" "$1/build/objects"
}

# The CPU build: an editable install of the source copy into the venv (the compiled libraries land in
# src/npu_loss_ops/, where the tests import them). src/build/objects is the checkout's build/objects.
cross_build() {
  sync_sources "$SRC"
  share_objects "$SRC"
  local digest
  digest="$(build_digest "$SRC" "$VENV")"
  if [[ "${NPU_LOSS_OPS_REBUILD:-0}" != 1 && -f "$SRC/.aarch64-build" && "$(cat "$SRC/.aarch64-build")" == "$digest" ]] \
      && compgen -G "$SRC/npu_loss_ops/_C.cpython-311-aarch64-linux-gnu.so" >/dev/null; then
    _log "the aarch64 build in $SRC is up to date (NPU_LOSS_OPS_REBUILD=1 forces it)"
  else
    rm -f "$SRC/.aarch64-build"
    pip_build "$SRC" "$VENV" "$WORK/build$SUFFIX.log" -e .
    echo "$digest" >"$SRC/.aarch64-build"
    check_object_keys
  fi
  (cd / && "$VENV/bin/python" -c 'import npu_loss_ops, json; print("[aarch64] build_info:", json.dumps(npu_loss_ops.build_info()))') >&2
}

# The aarch64 build compiled and linked only in a directory of its own, named by the architecture (setup.py's
# build key: torch, architecture, compiler, flags), holding only aarch64 objects; no other key's directory
# (the x86 builds of this checkout) holds an aarch64 object. Other engineers' x86 builds may run meanwhile,
# so what is checked is the type of every object, not their mtimes.
check_object_keys() {
  local dirs dir stray
  dirs="$(grep -oE 'build/objects/[^/ ]+' "$WORK/build$SUFFIX.log" | sort -u)"
  [[ -n "$dirs" ]] || _die "the build log names no build/objects/<key> directory"
  for dir in $dirs; do
    [[ "$dir" == build/objects/torch*-aarch64-* ]] || _die "the aarch64 build used $dir, a key that does not name aarch64"
    stray="$(find "$REPO_ROOT/$dir" -name '*.o' -print0 | xargs -0 -r file | grep -v 'ARM aarch64' || true)"
    [[ -z "$stray" ]] || _die "$dir holds objects that are not aarch64: $stray"
    _log "objects: $dir, $(find "$REPO_ROOT/$dir" -name '*.o' | wc -l) aarch64 objects; the link lines name no other directory"
  done
  for dir in "$REPO_ROOT"/build/objects/*; do
    [[ "$dir" == *-aarch64-* ]] && continue
    stray="$(find "$dir" -name '*.o' -print0 | xargs -0 -r file | grep 'ARM aarch64' || true)"
    [[ -z "$stray" ]] || _die "${dir#"$REPO_ROOT"/} (another key) holds aarch64 objects: $stray"
    _log "objects: ${dir#"$REPO_ROOT"/}: $(find "$dir" -name '*.o' | wc -l) objects, none aarch64, none used here"
  done
}

# ---------------------------------------------------------------------------------------------------------
# The NPU build check (what scripts/check_npu.sh does on x86): the aarch64 torch-npu wheel of the release
# build_config.py pairs with this torch (--no-deps: its requirements would pull another torch), npu_loss_ops
# built with NPU_LOSS_OPS_NPU=1 (no CANN needed), then scripts/check_npu_build.py under qemu: the library and
# its NEEDED libtorch_npu.so, the aclnn names, the symbol guard, the argument-type guard, the import.
# venv-npu sees venv's torch and tools through a .pth (a .pth adds the directory; the .pth files in it, such
# as the CPU build's editable finder, are not run), so torch is not installed twice.

npu_build_check() {
  local npu_release site have digest
  npu_release="$("$HOST_PYTHON" "$REPO_ROOT/build_config.py" --torch-npu-version "$TORCH_VERSION")"
  [[ -n "$npu_release" ]] || _die "build_config.py pairs no torch_npu release with torch $TORCH_VERSION"
  make_venv "$NPU_VENV"
  site="$(site_packages "$NPU_VENV")"
  site_packages "$VENV" >"$site/_aarch64_venv_torch.pth"
  have="$(installed_version "$site" torch_npu)"
  if [[ "$have" != "$npu_release" ]]; then
    _log "installing torch-npu==$npu_release (aarch64 wheel, --no-deps) into $site with the host's pip"
    host_pip_aarch64 "$site" --no-deps "torch-npu==$npu_release"
    have="$(installed_version "$site" torch_npu)"
    [[ "$have" == "$npu_release" ]] || _die "torch-npu==$npu_release did not install (found '$have')"
  fi
  # The same source copy as the cross-build, built (not editable) into venv-npu: its static library and _C
  # are the cross-build's objects, the same commands in the same build key's directory, so only _C_npu
  # compiles; the editable build's in-place files stay as they are (a wheel build writes under build/).
  sync_sources "$SRC"
  share_objects "$SRC"
  digest="$(build_digest "$SRC" "$NPU_VENV")"
  if [[ "${NPU_LOSS_OPS_REBUILD:-0}" != 1 && -f "$SRC/.aarch64-npu-build" && "$(cat "$SRC/.aarch64-npu-build")" == "$digest" ]]; then
    _log "npu_loss_ops with _C_npu in $NPU_VENV is up to date (NPU_LOSS_OPS_REBUILD=1 forces a build)"
  else
    rm -f "$SRC/.aarch64-npu-build"
    # Without CANN, torch_npu's backend autoload would make `import torch` in setup.py fail.
    TORCH_DEVICE_BACKEND_AUTOLOAD=0 NPU_LOSS_OPS_NPU=1 pip_build "$SRC" "$NPU_VENV" "$WORK/build-npu$SUFFIX.log" \
      --force-reinstall .
    echo "$digest" >"$SRC/.aarch64-npu-build"
  fi
  # The check's own compiles (the guard probes) use $CXX; NPU_LOSS_OPS_SYSROOT tells the symbol guard where
  # the paths the aarch64 interpreter reports (its libpython) are on this machine; CPLUS_INCLUDE_PATH finds
  # the sysroot's multiarch pyconfig.h, as CPPFLAGS does for the build.
  (cd "$(mktemp -d)" && env CXX=aarch64-linux-gnu-g++ NPU_LOSS_OPS_SYSROOT="$SYSROOT" \
    CPLUS_INCLUDE_PATH="$SYSROOT/usr/include" TORCH_DEVICE_BACKEND_AUTOLOAD=0 \
    "$NPU_VENV/bin/python" "$SRC/scripts/check_npu_build.py")
}

# ---------------------------------------------------------------------------------------------------------
# The tests, under qemu, from the source copy (as scripts/run_tests.sh runs them from the checkout).
# torch.compile's inductor compiles C++ at run time ($CXX, else g++: the host's x86 one) for the aarch64
# process that loads it: it gets the cross compiler, through a wrapper that turns inductor's -march=native
# (which a native g++ resolves to the CPU it runs on, and the cross compiler rejects: "unknown value 'native'
# for '-march'") into the emulated CPU, -mcpu=$QEMU_CPU; and CPLUS_INCLUDE_PATH finds the sysroot's
# multiarch pyconfig.h, as CPPFLAGS does for the build.

RUNTIME_CXX="$WORK/bin/aarch64-g++-native"
write_runtime_cxx() {
  mkdir -p "$(dirname "$RUNTIME_CXX")"
  cat >"$RUNTIME_CXX" <<'CXX'
#!/usr/bin/env bash
# aarch64-linux-gnu-g++ with -march=native meaning the CPU qemu emulates (written by scripts/aarch64.sh).
args=()
for arg in "$@"; do
  if [[ "$arg" == -march=native || "$arg" == -mcpu=native ]]; then
    if [[ "${QEMU_CPU:-neoverse-n1}" == max ]]; then arg=-march=armv8.5-a; else arg="-mcpu=${QEMU_CPU:-neoverse-n1}"; fi
  fi
  args+=("$arg")
done
exec aarch64-linux-gnu-g++ "${args[@]}"
CXX
  chmod +x "$RUNTIME_CXX"
}

# The slice: these files, and of them the tests the -k clauses below select (about 700 of the suite's
# 14,800; the count is printed at each run). Chosen across what could differ on aarch64: the CPU kernels'
# vector bodies and tails (5000-element samples), special values (NaN, inf, KL's zero target), every op,
# dtype and reduction; the API's errors; autograd (gradcheck, the autograd nodes, the torch.func transforms
# on broadcast samples); the row kernels; and the sums' committed bits.
# Not here (they run in the whole suite under qemu, the release table's aarch64 row): the error matrix, whose
# worker processes each start torch under qemu (the slice's longest part, with enable(), at over 15 minutes),
# and enable(), whose dispatch is the same on every architecture; the API's own errors stay.
SLICE_FILES=(tests/test_correctness.py tests/test_functional.py tests/test_weight.py
  tests/test_gradcheck.py tests/test_autograd_nodes.py tests/test_transforms.py
  tests/test_same_bits.py tests/test_distillation.py)
SLICE_K=(
  # correctness: forward and backward ops on 5000 elements, every op, dtype and reduction (30 each)
  "test_forward_op[ and 5000" "test_backward_op[ and 5000"
  # correctness: autograd against torch.nn.functional on a broadcast (200,200)x(200,1) sample (15)
  "test_autograd_vs_functional[ and 200"
  # correctness: NaN and inf as PyTorch gives them, KL's target gradient at 0 and inf, beta edge cases (134)
  "test_nan_inf_like_pytorch" "test_kl_target_grad"
  "test_smooth_l1_tiny_beta or test_smooth_l1_beta_inf or test_l1_grad_at_nan"
  # validation: the API's errors (50)
  "test_invalid_reduction or test_bad_ or test_complex_is_rejected or test_kl_integer_is_rejected"
  "test_weight_of_another_size or test_weight_on_another_device"
  # autograd: gradcheck of the forward ops on transposed inputs (45), every autograd-node test (87), and
  # four torch.func transforms on the mean-reduced broadcast samples (72)
  "test_gradcheck_forward[ and transposed"
  "test_autograd_nodes.py"
  "(test_vmap[ or test_grad[ or test_jvp[ or test_hessian[) and mean-bcast"
  # the float32 and float64 sums of every loss have aarch64's committed bits (tests/data/reduction_bits.json)
  "test_same_bits.py"
  # distillation: the row kernels against TRL's formula in float64 at vocabularies of 257, 1,000 and 32,001
  # (the vector bodies and tails, mixed dtypes) and at beta = 0.5 over every shape, gradcheck, the same bits
  # with 1 and 2 threads, float16 under loss scaling, dropped and empty rows, rows whose maximum rises in
  # every block and rows below -87 in log-probability (its bad inputs: "test_bad_")
  "test_distillation.py and test_matches_trl[ and (257 or 1000 or 32001 or b0.5-T1)"
  "test_distillation.py and (test_gradcheck or test_same_bits_with or test_float16_gradients)"
  "test_distillation.py and (test_dropped_rows or test_empty_logits or test_every_row_ignored)"
  "test_distillation.py and test_rising_and_steep_rows"
)

slice_expression() {
  local clause expr=""
  for clause in "${SLICE_K[@]}"; do expr+="${expr:+ or }($clause)"; done
  printf '%s' "$expr"
}

# run_pytest NAME PYTEST-ARGS...: pytest under qemu in the source copy; fails on any failure and on
# "no tests collected" (pytest's exit status 5).
run_pytest() {
  local name="$1" status=0
  shift
  PYTEST_LOG="$WORK/pytest-$name$SUFFIX.log"
  write_runtime_cxx
  _log "running: python -m pytest $*"
  (cd "$SRC" && env CXX="$RUNTIME_CXX" CPLUS_INCLUDE_PATH="$SYSROOT/usr/include" \
    "$VENV/bin/python" -m pytest -p no:cacheprovider -rfEs "$@") 2>&1 | tee "$PYTEST_LOG" || status=$?
  local selected
  selected="$(grep -m 1 -E '^collected [0-9]+ items|workers \[[0-9]+ items\]' "$PYTEST_LOG" || true)"
  _log "$name: ${selected:-no collection line}"
  if ((status == 5)); then _log "$name: pytest collected no tests; that is a failure"; fi
  return "$status"
}

run_slice() {
  _log "the slice: ${SLICE_FILES[*]} -k \"$(slice_expression)\""
  # Two pytest-xdist workers: most of a test under qemu is one emulated thread, so two processes use both cores.
  run_pytest slice -n 2 "${SLICE_FILES[@]}" -k "$(slice_expression)" "$@"
}

# The memory-bound probes (test_memory_bound, test_memory_bounds) measure a subprocess's resident peak over a
# whole forward and backward at up to 155 million logits: minutes of emulated arithmetic each, hours for their
# 38 cases. Their bound is a property of the chunk planning, the same code on both architectures, and the
# README's test command runs every case on x86-64; under qemu one case of each runs, the heaviest bound at the
# 151,936-token vocabulary.
MEMORY_PROBES="not test_memory_bound or 512x151936-bfloat16-both-kernel or 1024x256x151936-bfloat16-teacher"

run_full_suite() {
  # Two pytest-xdist workers, as in the slice: each test is mostly one emulated thread. A file's tests stay on
  # one worker (--dist loadfile), so that a module's fixture runs once: test_dtensor's two gloo processes, run
  # by both workers at once, took over its time limit. That limit is tripled under qemu.
  export NPU_LOSS_OPS_TIME_LIMIT_SCALE=3
  run_pytest full -n 2 --dist loadfile -m "not large" -k "$MEMORY_PROBES" "$@"
}

# One run at a time per build/aarch64 (two would rewrite each other's source copy and venvs mid-build or
# mid-test, e.g. the slice and scripts/check_releases.sh's full suite sharing it): a second one waits.
lock_work() {
  mkdir -p "$WORK"
  exec 9>"$WORK/.lock"
  if ! flock -n 9; then
    _log "another scripts/aarch64.sh is running on $WORK; waiting for it"
    flock 9
  fi
}

prepare() {
  lock_work
  ensure_host_tools
  stage sysroot build_sysroot
  make_venv "$VENV"
  stage torch install_torch
  stage cross-build cross_build
}

main() {
  local command="${1:-}"
  (($#)) && shift
  case "$command" in
    slice) prepare; stage tests run_slice "$@" ;;
    full) prepare; stage tests run_full_suite "$@" ;;
    npu) prepare; stage npu-build-check npu_build_check ;;
    setup) prepare ;;
    *) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' >&2; exit 2 ;;
  esac
}

main "$@"
