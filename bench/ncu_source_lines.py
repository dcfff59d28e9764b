#!/usr/bin/env python3
"""Warp instructions and stall samples of one profiled kernel, summed per source line.

Input: the source page of an Nsight Compute report, written on the GPU machine by
    ncu --section SourceCounters -k regex:KERNEL --launch-count 1 -o rep <command>
    ncu -i rep.ncu-rep --page source --csv --print-source cuda,sass > rep.csv
(build with -DCMAKE_CUDA_FLAGS=-lineinfo so that SASS maps to source lines).
Usage: ncu_source_lines.py rep.csv [lines to print, default 40]
"""
import collections
import csv
import sys


def main() -> None:
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    instructions = collections.Counter()
    samples = collections.Counter()
    text = {}
    current_file = None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "File Path":
                current_file = row[1].split("/")[-1]
                continue
            # Header rows, and SASS rows (empty line number) under their source line's row.
            if row[0] in ("Function Name", "Line No") or row[0] == "":
                continue
            try:
                executed, sampled = int(row[7]), int(row[4])
            except (IndexError, ValueError):
                continue
            key = (current_file, int(row[0]))
            instructions[key] += executed
            samples[key] += sampled
            text[key] = row[1].strip()[:90]
    total_i = sum(instructions.values()) or 1
    total_s = sum(samples.values()) or 1
    print(f"total warp instructions {total_i}, stall samples {total_s}")
    for key, n in instructions.most_common(top):
        print(f"{n:10d} {100 * n / total_i:5.1f}% samples {100 * samples[key] / total_s:5.1f}%  "
              f"{key[0]}:{key[1]}  {text[key]}")


if __name__ == "__main__":
    main()
