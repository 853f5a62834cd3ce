#!/usr/bin/env bash
# Offline GPU check (issue 13, part 6): Megatron-core GPTModel and the embedded engine on CUDA, for a machine with
# one NVIDIA GPU, torch and transformers preinstalled, and no network (so no SGLang: its wheels and CUDA kernels
# are gigabytes; the online check with SGLang is benchmarks/gpu_smoke.sh).
#
#   bash benchmarks/gpu_check.sh pack [DIR]          # here, with the package registry: wheels into DIR
#   bash benchmarks/gpu_check.sh run  [DIR] [ARGS]   # there: install DIR's wheels aside, run gpu_check.py ARGS
#
# DIR (default dist/gpu-check) holds megatron-core 0.16.1 for CPython 3.10-3.13 (x86_64; 2.6 MB each, it has a
# compiled helper) and areal's own wheel: about 11 MB, refused above 60 MB. `run` installs them with
# `pip --no-index --no-deps --target` into a temporary folder put first on PYTHONPATH (the machine's torch and
# transformers are used as they are; nothing is installed into its environment), then runs
# benchmarks/gpu_check.py under an 8-minute limit. ARGS go to gpu_check.py (--out DIR, --dry-run, --steps N ...).
# `run DIR --dry-run` does the same on a CPU machine with a tiny model: CI runs it (tests/test_gpu_check.py).
# PYTHON selects the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MAX_MB=60
BUDGET_S=${GPU_CHECK_BUDGET_S:-480}
MEGATRON=megatron-core==0.16.1

die() { echo "error: $*" >&2; exit 2; }

pack() {
  local dir=${1:-dist/gpu-check}
  rm -rf "$dir" && mkdir -p "$dir"
  local iso=--no-build-isolation
  "$PY" -c "import setuptools" 2>/dev/null || iso=
  # shellcheck disable=SC2086
  "$PY" -m pip wheel -q --no-deps $iso -w "$dir" . >/dev/null || die "building areal's wheel failed"
  for v in 3.10 3.11 3.12 3.13; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version "$v" \
      --platform manylinux_2_28_x86_64 -d "$dir" "$MEGATRON" >"$dir/pip.log" 2>&1 \
      || { cat "$dir/pip.log" >&2; die "cannot download $MEGATRON for CPython $v (is the package registry reachable?)"; }
  done
  rm -f "$dir/pip.log"
  local bytes
  bytes=$(du -cb "$dir"/*.whl | tail -1 | cut -f1)
  [ "$bytes" -le $((MAX_MB * 1000000)) ] || die "$dir: wheels total $((bytes / 1000000)) MB, over ${MAX_MB} MB"
  (cd "$dir" && sha256sum ./*.whl > SHA256SUMS)
  echo "packed $(ls "$dir"/*.whl | wc -l) wheels, $((bytes / 1000)) kB, into $dir"
}

run() {
  local dir=dist/gpu-check
  if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then dir=$1; shift; fi
  local t0
  t0=$(date +%s)
  [ -f "$dir/SHA256SUMS" ] || die "$dir: no packed wheels (run 'bash benchmarks/gpu_check.sh pack $dir' first)"
  (cd "$dir" && sha256sum --quiet -c SHA256SUMS) || die "$dir: a wheel does not match SHA256SUMS"
  "$PY" -c "import torch, transformers" 2>/dev/null \
    || die "$PY cannot import torch and transformers (set PYTHON to the interpreter that has them)"
  SITE=$(mktemp -d "${TMPDIR:-/tmp}/areal-gpu-check.XXXXXX")
  trap 'rm -rf "$SITE"' EXIT
  local site=$SITE
  "$PY" -m pip install -q --no-index --no-deps --find-links "$dir" --target "$site" "$MEGATRON" areal-cli \
    >"$site.log" 2>&1 || { cat "$site.log" >&2; die "installing the wheels of $dir for $("$PY" -V 2>&1) failed"; }
  rm -f "$site.log"
  local left=$((BUDGET_S - ($(date +%s) - t0)))
  echo "installed megatron-core and areal into $site in $(($(date +%s) - t0)) s; ${left} s left"
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" timeout --kill-after=10 "$left" "$PY" benchmarks/gpu_check.py "$@"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) die "usage: bash benchmarks/gpu_check.sh pack [DIR] | run [DIR] [gpu_check.py args]" ;;
esac
