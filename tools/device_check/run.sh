#!/usr/bin/env bash
# Runs on the lent GPU machine, in the repository root, with .gl and .devbin carried (see
# pack.sh): every packed test binary on Vulkan (TESTS= to choose, GL=1 for GL too), `check` over
# every case file, and the benches (BENCH= to choose). The summary goes to $OUT/summary.txt and a
# failing binary's log to $OUT/fail-*.log. Checked on the H200 on 2026-12-04: 27 binaries and
# `check` green on Vulkan; GL there could not open a device headless (RequestDevice: Lost).
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
[ -f $icd ] && export VK_DRIVER_FILES=$icd
[ -f $egl ] && export __EGL_VENDOR_LIBRARY_FILENAMES=$egl
export XDG_RUNTIME_DIR=/tmp
# Test binaries find fixtures and the CLI under the path they were built in.
mkdir -p /work; [ -e /work/main ] || ln -s "$PWD" /work/main
B=/tmp/device-bins; mkdir -p $B; tar -C $B -xJf .devbin/bins.tar.xz
mkdir -p target/release && cp $B/wgpu-mha target/release/
exec > >(tee "$OUT/summary.txt") 2>&1
t0=$(date +%s); stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
stamp info; $B/wgpu-mha info | head -12
stamp check; timeout 120 $B/wgpu-mha --backend vulkan check tests/fixtures/*.safetensors \
  tests/fixtures/torch/*.safetensors tests/fixtures/torch_functional/*.safetensors \
  tests/fixtures/hf/*.safetensors > "$OUT/check.txt" 2>&1; tail -1 "$OUT/check.txt"
for backend in vulkan ${GL:+gl}; do
  for name in ${TESTS:-$(ls $B | grep -vx wgpu-mha)}; do
    [ -x $B/$name ] || continue
    WGPU_BACKEND=$backend timeout 120 $B/$name --test-threads=$([ $backend = gl ] && echo 1 || echo 8) > "$OUT/t.log" 2>&1
    rc=$?; echo "$backend $name rc=$rc $(grep -E '^test result' "$OUT/t.log" | tail -1)"
    [ $rc = 0 ] || cp "$OUT/t.log" "$OUT/fail-$backend-$name.log"
  done
done
stamp bench
# BENCH: bench argument lists separated by ';' (empty: no bench).
IFS=';' read -ra benches <<< "${BENCH-"--only decode;--only serve;--only sdpa;--no-naive"}"
for b in "${benches[@]}"; do
  echo "== bench $b"; timeout 150 $B/wgpu-mha --backend vulkan bench $b --iters 5 2>&1 | grep -v '^\s*$'
done
stamp done
