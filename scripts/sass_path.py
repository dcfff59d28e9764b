#!/usr/bin/env python3
"""Instructions a warp issues along one path through a kernel's SASS (no GPU needed).

Reads the text of `cuobjdump -sass -fun NAME OBJ` and walks it from START to END (hex addresses as
printed), following every unconditional BRA. A conditional branch falls through unless a
decision names it: ADDR=T (taken), ADDR=N (not taken) or ADDR=L<k> (a loop's back edge, taken k
times, then not). Predicated instructions other than branches count as issued. Prints the count
and the most frequent opcodes. This is how docs/cuda.md's per-element counts of the flush were
taken: one row group's path when every value is finite, per number of folded entries.

  scripts/ptxas_report.py --keep /tmp/obj src/cuda/modes/separate_nvfp4.cu
  cuobjdump -sass -fun MANGLED_NAME /tmp/obj/separate_nvfp4.cu.o > flush.sass
  scripts/sass_path.py flush.sass 3f50 8bf0 49e0=L2 4a00=T 4f50=T

A branch taken by some lanes of a warp and not by others (divergence) costs the warp both
sides: leave such branches not taken, so that the path includes their bodies.
"""
import argparse
import collections
import re
import sys


def read_sass(path):
    """{address: instruction text} of the SASS listing."""
    code = {}
    with open(path) as f:
        for line in f:
            m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
            if m:
                code[int(m.group(1), 16)] = m.group(2).strip()
    return code


def opcode(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def walk(code, start, end, decisions, limit=1_000_000):
    addrs = sorted(code)
    index = {a: i for i, a in enumerate(addrs)}
    taken_count = collections.Counter()
    ops = collections.Counter()
    pc = start
    issued = 0
    while pc != end:
        if pc not in code:
            sys.exit(f"sass_path: no instruction at {pc:#x}")
        if issued >= limit:
            sys.exit("sass_path: no end reached (a loop without a decision?)")
        issued += 1
        text = code[pc]
        op = opcode(text)
        ops[op] += 1
        if op == "BRA":
            target = int(re.search(r"0x([0-9a-f]+)", text).group(1), 16)
            rule = decisions.get(pc, "N") if text.startswith("@") else "T"
            if rule.startswith("L"):
                taken_count[pc] += 1
                take = taken_count[pc] <= int(rule[1:])
            else:
                take = rule == "T"
            if take:
                pc = target
                continue
        pc = addrs[index[pc] + 1]
    return ops


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass", help="cuobjdump -sass output of one function")
    ap.add_argument("start", help="first address (hex)")
    ap.add_argument("end", help="address where the walk stops, not counted (hex)")
    ap.add_argument("decisions", nargs="*", help="ADDR=T, ADDR=N or ADDR=L<k> per branch")
    args = ap.parse_args(argv)
    decisions = {}
    for d in args.decisions:
        addr, rule = d.split("=")
        if not re.fullmatch(r"[TN]|L\d+", rule):
            sys.exit(f"sass_path: bad decision {d}")
        decisions[int(addr, 16)] = rule
    ops = walk(read_sass(args.sass), int(args.start, 16), int(args.end, 16), decisions)
    top = ", ".join(f"{k} {v}" for k, v in ops.most_common(12))
    print(f"{sum(ops.values())} instructions: {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
