#!/usr/bin/env python3
"""Registers and spills of every kernel in CUDA sources, from ptxas (no GPU needed).

Compiles each source with its flags from a configured build folder (`ninja -t commands`), for
sm_90a machine code only, with `-Xptxas -v`, into a scratch object, and prints one line per
kernel: registers, spill stores / loads, and the demangled name. --tree compiles another checkout
(e.g. a worktree under .cuda-wt/) with the same flags, so a branch's kernels can be compared with
main's before any device time is spent.

  scripts/ptxas_report.py src/cuda/modes/separate_nvfp4.cu
  scripts/ptxas_report.py --tree .cuda-wt/X --spills src/cuda/modes/separate_fp8.cu
  scripts/ptxas_report.py --grep verify_kernel src/cuda/modes/*.cu
  scripts/ptxas_report.py --keep /tmp/obj src/cuda/modes/separate_nvfp4.cu  # then cuobjdump -sass

Each source takes a few minutes (every instantiation of the mode). The build folder needs the
Ninja generator and a CUDA configuration (scripts/setup.sh's default build/ is one).
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile


def compile_command(build, source):
    """The build's nvcc command line for `source` (an absolute path in the build's tree)."""
    out = subprocess.run(["ninja", "-C", build, "-t", "commands"], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        if "nvcc" in line and f" -c {source} " in f"{line} ":
            return line
    sys.exit(f"ptxas_report: no nvcc command for {source} in {build} (a .cu file of the library, "
             "and a build folder configured with CUDA?)")


def retarget(cmd, root, tree, obj):
    """cmd for the same source in `tree`, sm_90a code only, verbose ptxas, output to obj."""
    args = shlex.split(cmd)
    out = []
    skip = 0
    for a in args:
        if skip:
            skip -= 1
            continue
        if a in ("-MD",):
            continue
        if a in ("-MT", "-MF"):
            skip = 1
            continue
        if a == "-o":
            skip = 1
            continue
        if a.startswith("--generate-code=") or a.startswith("-gencode"):
            a = "--generate-code=arch=compute_90a,code=[sm_90a]"
        if tree != root:
            a = a.replace(root + "/src", tree + "/src").replace(root + "/include",
                                                                 tree + "/include")
        out.append(a)
    return out + ["-o", obj, "-Xptxas", "-v"]


def demangle(names):
    if not names or not shutil.which("c++filt"):
        return {n: n for n in names}
    res = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return dict(zip(names, res.stdout.splitlines()))


def parse(log):
    """(mangled name, registers, spill stores, spill loads) per compiled entry function."""
    kernels = []
    name = None
    spills = (0, 0)
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            spills = (int(m.group(1)), int(m.group(2)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            kernels.append((name, int(m.group(1)), spills[0], spills[1]))
            name = None
    return kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="+", help="CUDA sources, relative to the tree")
    ap.add_argument("--build", default="build", help="configured build folder (default build)")
    ap.add_argument("--tree", default=".", help="checkout to compile (default: this one)")
    ap.add_argument("--spills", action="store_true", help="only kernels that spill")
    ap.add_argument("--grep", default="", help="only kernels whose demangled name contains this")
    ap.add_argument("--keep", default="", help="folder to keep the objects in (SASS for cuobjdump)")
    args = ap.parse_args()
    root = os.path.realpath(os.getcwd())
    tree = os.path.realpath(args.tree)
    build = os.path.realpath(args.build)
    status = 0
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for src in args.sources:
            cmd = compile_command(build, os.path.join(root, src))
            obj = os.path.join(os.path.realpath(args.keep) if args.keep else tmp,
                               os.path.basename(src) + ".o")
            res = subprocess.run(retarget(cmd, root, tree, obj), cwd=build, capture_output=True,
                                 text=True)
            if res.returncode != 0:
                print(res.stdout + res.stderr, file=sys.stderr)
                print(f"ptxas_report: {src} did not compile", file=sys.stderr)
                status = 1
                continue
            kernels = parse(res.stdout + res.stderr)
            names = demangle([k[0] for k in kernels])
            print(f"== {src} ({'tree ' + args.tree if tree != root else 'this tree'}): "
                  f"{len(kernels)} kernels")
            print(f"{'regs':>4} {'spill st':>8} {'spill ld':>8}  kernel")
            for name, regs, st, ld in sorted(kernels, key=lambda k: names[k[0]]):
                if args.spills and st == 0 and ld == 0:
                    continue
                if args.grep and args.grep not in names[name]:
                    continue
                print(f"{regs:4d} {st:8d} {ld:8d}  {names[name]}")
    return status


if __name__ == "__main__":
    sys.exit(main())
