#!/usr/bin/env bash
# Packs what a lent GPU machine (the workplace's `device` tool, x86-64, no network, no cargo)
# needs to run the suite and the benches: the Vulkan/EGL loaders as Debian packages in .gl/ and
# the release CLI plus the GPU test binaries, stripped, in .devbin/ (both ignored by git through
# .git/info/exclude; the device tool's `carry` takes them). Run from the repository root after
# `cargo build --release --all-targets`; then run tools/device_check/run.sh there.
set -euo pipefail
grep -qx '/.gl/' .git/info/exclude 2>/dev/null || echo /.gl/ >> .git/info/exclude
grep -qx '/.devbin/' .git/info/exclude || echo /.devbin/ >> .git/info/exclude
if ! ls .gl/libvulkan1_*.deb >/dev/null 2>&1; then
  mkdir -p .gl /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update -qq
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
stage=$(mktemp -d)
cp target/release/wgpu-mha "$stage/"
for test in tests/*.rs; do
  name=$(basename "$test" .rs)
  bin=$(ls -t target/release/deps/"$name"-* 2>/dev/null | grep -v '\.d$' | head -1 || true)
  [ -n "$bin" ] && cp "$bin" "$stage/$name"
done
strip "$stage"/*
mkdir -p .devbin
tar -C "$stage" -cf - . | xz -6 -T2 > .devbin/bins.tar.xz
rm -rf "$stage"
ls -la .devbin/bins.tar.xz   # must stay well under the device tool's 64 MiB carry limit
