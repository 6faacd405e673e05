#!/usr/bin/env python3
"""Where a shader's time goes on lavapipe/llvmpipe, without a debug Mesa.

Release Mesa prints no NIR or LLVM IR, and perf cannot name JIT code. This runs a command under
`perf record`, attaches gdb every --interval seconds to copy the process's anonymous executable
mappings (llvmpipe's JIT code), and prints the x86 instruction mix weighted by perf samples, and
the hottest instructions in context.

What it told us about flash_attention (see src/kernels/flash_attention.rs): the time is in
per-lane scalar loads and stores (vpextrd/vpinsrd/mov, a test-and-branch per lane) of
dynamically indexed private arrays, not in the multiply-adds.

Needs perf, gdb and objdump (binutils); not used by the tests. Example, from the repo root:

    cargo build --release
    python3 tools/lavapipe_profile.py -- target/release/wgpu-mha bench --only gemm

Code compiled and freed between two copies is missed; the coverage line says how much of the
samples the copies explain.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time

INSN = re.compile(r"\s*([0-9a-f]+):\s+(?:[0-9a-f]{2} )+\s*\t(\S+)\s*(.*)")


def jit_mappings(pid):
    """Anonymous executable mappings of a process: (start, end)."""
    regions = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) < 5 or "x" not in fields[1]:
                continue
            if len(fields) >= 6 and fields[5].startswith("/"):
                continue  # a file-backed library, which perf already names
            start, end = (int(x, 16) for x in fields[0].split("-"))
            regions.append((start, end))
    return regions


def command_pid(perf_pid):
    """The profiled command: the child of the perf process."""
    for _ in range(50):
        out = subprocess.run(["pgrep", "-P", str(perf_pid)], capture_output=True, text=True)
        pids = out.stdout.split()
        if pids:
            return int(pids[0])
        time.sleep(0.1)
    sys.exit("no child of perf found")


def disassemble(path, start):
    out = subprocess.run(
        ["objdump", "-D", "-b", "binary", "-m", "i386:x86-64", f"--adjust-vma={start:#x}", path],
        capture_output=True, text=True, check=True,
    )
    insns = []
    for line in out.stdout.splitlines():
        m = INSN.match(line)
        if m:
            insns.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return insns


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between copies of the JIT code")
    ap.add_argument("--top", type=int, default=25, help="rows of the instruction mix")
    ap.add_argument("--context", type=int, default=30, help="instructions shown around the hottest one")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command to profile")

    work = tempfile.mkdtemp(prefix="lvp_profile_")
    data = os.path.join(work, "perf.data")
    perf = subprocess.Popen(["perf", "record", "-q", "-o", data, "--", *command])
    pid = command_pid(perf.pid)
    dumps = {}  # (start, end) -> copy; a later copy of the same range replaces an earlier one
    while perf.poll() is None:
        time.sleep(args.interval)
        try:
            regions = jit_mappings(pid)
        except OSError:
            break  # the command has ended
        gdb = ["gdb", "-p", str(pid), "-batch"]
        for start, end in regions:
            path = os.path.join(work, f"jit_{start:x}_{end:x}.bin")
            gdb += ["-ex", f"dump binary memory {path} {start:#x} {end:#x}"]
            dumps[(start, end)] = path
        subprocess.run(gdb, capture_output=True)
    if perf.wait() != 0:
        sys.exit(f"the profiled command failed (perf exit {perf.returncode})")

    ips = subprocess.run(["perf", "script", "-i", data, "-F", "ip"], capture_output=True, text=True)
    samples = collections.Counter(int(l, 16) for l in ips.stdout.split())
    total = sum(samples.values())
    # One entry per address: a mapping that grew was copied under two ranges, and the later
    # copy (inserted later into `dumps`) is the one that holds the newer code.
    code = {}
    for (start, _), path in dumps.items():
        if os.path.exists(path):
            for a, op, operands in disassemble(path, start):
                code[a] = (op, operands)
    insns = [(a, op, operands) for a, (op, operands) in sorted(code.items())]
    by_addr = {a: i for i, (a, _, _) in enumerate(insns)}
    covered = sum(samples[a] for a in by_addr)
    print(f"{total} samples; {100 * covered / max(total, 1):.1f}% in the JIT code copied")
    mix = collections.Counter()
    for a, op, operands in insns:
        if samples[a]:
            mix[op + (" (memory)" if "(" in operands else "")] += samples[a]
    print("\ninstruction mix, % of all samples:")
    for op, n in mix.most_common(args.top):
        print(f"  {op:28} {100 * n / total:5.1f}")
    if by_addr:
        hottest = max(by_addr, key=lambda a: samples[a])
        i = by_addr[hottest]
        print(f"\naround the hottest instruction ({hottest:#x}); left: samples")
        for a, op, operands in insns[max(0, i - args.context): i + args.context]:
            print(f"  {samples[a]:6}  {a:#x}  {op} {operands}")
    print(f"\nperf data and code copies: {work}")


if __name__ == "__main__":
    main()
