#!/usr/bin/env python3
"""Where a kernel's warps wait, from ncu's SASS source page: the warp-state samples by stall
reason, by region of the code (straight-line parts and loops) and by instruction.

A region is a maximal run of instructions executed as often as the kernel's first instruction
(straight-line code, once per warp) or more often (a loop; an inner loop stays inside its outer
loop's region). Instructions executed less often (a branch's body taken by some warps) join the
region before them. So the split says, e.g., how much of a readout kernel's time is its prologue
and how much its walk. Usage (docs/cuda.md, "Running on the GPU machine"):

    ncu --clock-control none --section WarpStateStats --section SourceCounters \
        --import-source no -k regex:verify -s 40 -c 1 -o /tmp/v \
        replayssm bench --backend cuda --repeats 1 --flush-cycles 1 --windows 1 \
        --modes separate-fp8 --batches 64
    ncu --import /tmp/v.ncu-rep --page source --csv --print-source sass > source.csv
    scripts/ncu_source_summary.py source.csv

(`-s 40` skips the bench's phase-spreading pre-steps, so that a timed step's launch is sampled.)

Each region also says how many instructions a warp executes in it (its instructions' executed
counts over the kernel's first instruction's, the number of warps), and the kernel's instructions
per warp are split by opcode: the instruction mix, where a kernel that issues every cycle spends
its time.

`--kernel I` picks the I-th kernel of the page (1-based, default 1), `--top N` the number of
instructions listed (default 12), `--opcodes N` the number of opcodes (default 16).
"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def number(text):
    """ncu's number text (may hold thousands separators; empty is 0)."""
    text = text.replace(",", "").strip()
    return int(float(text)) if text else 0


def read_kernels(path):
    """[(kernel name, [instruction])] of the page, one per profiled launch; an instruction is a dict
    with address, source, samples, executed and stalls ({reason: samples}, the issued and
    not-issued samples both)."""
    kernels, header = [], None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                kernels.append((row[1] if len(row) > 1 else "?", []))
                header = None
            elif row[0] == "Address":
                missing = [c for c in (SAMPLES, EXECUTED, "Source") if c not in row]
                if missing:
                    sys.exit(f"ncu_source_summary: {path} lacks the column(s) {missing}: collect "
                             "--section SourceCounters --section WarpStateStats")
                header = row
            elif header and kernels:
                cells = dict(zip(header, row))
                kernels[-1][1].append({
                    "address": cells["Address"],
                    "source": cells["Source"].strip(),
                    "samples": number(cells[SAMPLES]),
                    "executed": number(cells[EXECUTED]),
                    "stalls": {h[len("stall_"):]: number(cells[h]) for h in header
                               if h.startswith("stall_") and "Not Issued" not in h},
                })
    if not kernels:
        sys.exit(f"ncu_source_summary: no kernel in {path} (expected ncu's --page source --csv)")
    # ncu 2025's page lists each profiled launch twice, the same rows both times: keep one.
    return [k for i, k in enumerate(kernels) if i == 0 or k != kernels[i - 1]]


def regions(code):
    """[(first, last, is_loop)] index ranges covering the code, in order."""
    if not code:
        return []
    entry = code[0]["executed"]
    out = []
    for i, ins in enumerate(code):
        loop = entry > 0 and ins["executed"] > entry
        if out and out[-1][2] == loop:
            out[-1] = (out[-1][0], i, loop)
        elif out and not loop and ins["executed"] < entry:
            out[-1] = (out[-1][0], i, out[-1][2])  # a branch body: part of what surrounds it
        else:
            out.append((i, i, loop))
    return out


def opcode(source):
    """The opcode of a SASS line without its predicate and modifiers: "@!P0 IMAD.WIDE.U32 R2, ..."
    -> "IMAD"."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def summary(name, code, top, opcodes=16):
    """The report's lines for one kernel."""
    total = sum(i["samples"] for i in code)
    executed = sum(i["executed"] for i in code)
    warps = code[0]["executed"] if code else 0
    per_warp = lambda n: f"{n / warps:.1f}" if warps else "?"
    lines = [f"kernel: {name}", f"warp-state samples: {total}, instructions executed: "
             f"{executed} ({per_warp(executed)} per warp of {warps})"]
    if total == 0:
        return lines + ["no samples (was WarpStateStats collected?)"]
    pct = lambda n: f"{100.0 * n / total:5.1f}%"
    reasons = {}
    for ins in code:
        for r, n in ins["stalls"].items():
            reasons[r] = reasons.get(r, 0) + n
    lines.append("by stall reason: " + ", ".join(
        f"{r} {pct(n).strip()}" for r, n in sorted(reasons.items(), key=lambda t: -t[1])
        if n > 0.01 * total))
    lines.append("by region (instruction indices, addresses):")
    other = 0
    for first, last, loop in regions(code):
        n = sum(i["samples"] for i in code[first:last + 1])
        if n < 0.01 * total:
            other += n
            continue
        runs = max(i["executed"] for i in code[first:last + 1]) if loop else warps
        count = sum(i["executed"] for i in code[first:last + 1])
        lines.append(f"  {pct(n)}  {'loop  ' if loop else 'linear'} {first}-{last} "
                     f"({code[first]['address']}..{code[last]['address']}), "
                     f"executed up to {runs} times, {per_warp(count)} instructions per warp")
    if other:
        lines.append(f"  {pct(other)}  regions under 1% each")
    mix = collections.Counter()
    for ins in code:
        mix[opcode(ins["source"])] += ins["executed"]
    ranked_ops = mix.most_common(opcodes)
    lines.append("by opcode (instructions per warp): " +
                 ", ".join(f"{op} {per_warp(n)}" for op, n in ranked_ops if n > 0))
    lines.append(f"top {top} instructions by samples:")
    ranked = sorted(range(len(code)), key=lambda i: -code[i]["samples"])[:top]
    for i in ranked:
        ins = code[i]
        if ins["samples"] == 0:
            break
        reason = max(ins["stalls"].items(), key=lambda t: t[1], default=("?", 0))[0]
        lines.append(f"  {pct(ins['samples'])}  [{i}] {ins['source'][:60]:60}  mostly {reason}, "
                     f"executed {ins['executed']}")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--kernel", type=int, default=1, help="which kernel of the page (1-based)")
    ap.add_argument("--top", type=int, default=12, help="instructions to list")
    ap.add_argument("--opcodes", type=int, default=16, help="opcodes of the mix to list")
    args = ap.parse_args(argv)
    kernels = read_kernels(args.csv)
    if not 1 <= args.kernel <= len(kernels):
        sys.exit(f"ncu_source_summary: --kernel {args.kernel}: the page has {len(kernels)}")
    name, code = kernels[args.kernel - 1]
    print("\n".join(summary(name, code, args.top, args.opcodes)))


if __name__ == "__main__":
    main()
