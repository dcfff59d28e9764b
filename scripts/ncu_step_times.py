#!/usr/bin/env python3
"""Per-step kernel times of replay steps, from ncu's CSV of `gpu__time_duration.sum`.

Under ncu every kernel runs alone, so the times add up without the overlap of flush and verify
that a CUDA graph step has; they say which kernel a step's time is in. A step is the kernels from
one `validate_tokens_kernel` to the next (validate, flush, verify, commit); steps are grouped by
their verify kernel's full name, so the bench's phase-spreading decode steps (W = 1) are kept
apart from the timed window's. Usage (docs/cuda.md, "Running on the GPU machine"):

    ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        -k regex:'verify|flush|validate|commit' -c 160 \
        replayssm bench --backend cuda --repeats 1 --flush-cycles 1 --windows 8 \
        --modes separate-fp8 --batches 64 > ncu.csv
    scripts/ncu_step_times.py ncu.csv

`--metric NAME` sums another metric of the same CSV per step instead (collect it with ncu's
`--metrics gpu__time_duration.sum,NAME`: the time's rows still mark the kernels), e.g.
`smsp__inst_executed.sum` for warp instructions or `dram__bytes_read.sum`, printed in millions.
"""
import argparse
import csv
import re
import statistics
import sys

KINDS = ("validate", "flush", "verify", "commit")


def kind(name):
    """The step part a kernel is (None: not one of them)."""
    base = re.sub(r"^void\s+", "", name).split("<")[0].split("(")[0]
    for k in KINDS:
        if base.startswith(k):
            return k
    return None


TIME = "gpu__time_duration.sum"


def read_rows(path, metric=TIME):
    """(kernel name, value) in launch order: microseconds for the time, else millions of the
    metric's unit."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"ncu_step_times: no CSV header in {path} (run ncu with --csv)")
    scale = {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}  # to us
    rows = []
    for r in csv.DictReader(lines[start:]):
        if r.get("Metric Name") != metric:
            continue
        unit = r["Metric Unit"]
        if metric != TIME:
            factor = 1e-6
        elif unit in scale:
            factor = scale[unit]
        else:
            sys.exit(f"ncu_step_times: unknown unit {unit!r} in {path}")
        rows.append((r["Kernel Name"], float(r["Metric Value"].replace(",", "")) * factor))
    if not rows:
        sys.exit(f"ncu_step_times: no rows of metric {metric} in {path}")
    return rows


def steps(rows):
    """Lists of (kind, name, us), one per step; kernels before the first validate are dropped."""
    out, cur = [], None
    for name, us in rows:
        k = kind(name)
        if k is None:
            continue
        if k == "validate":
            cur = []
            out.append(cur)
        if cur is not None:
            cur.append((k, name, us))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="+", help="ncu --csv output (other lines are skipped)")
    ap.add_argument("--metric", default=TIME,
                    help="ncu metric to sum per step (default: the time, in us; others in millions)")
    args = ap.parse_args()
    unit = "us" if args.metric == TIME else "M"
    for path in args.csv:
        groups = {}
        for st in steps(read_rows(path, args.metric)):
            verify = next((n for k, n, _ in st if k == "verify"), "(no verify)")
            per = {k: sum(us for kk, _, us in st if kk == k) for k in KINDS}
            groups.setdefault(verify, []).append(per)
        print(f"== {path}")
        for verify, per_steps in groups.items():
            print(f"{len(per_steps)} steps with {verify}")
            print(f"  {unit + ' per step':12s}   mean  median     min     max")
            for k in KINDS + ("sum",):
                vals = [sum(p.values()) if k == "sum" else p[k] for p in per_steps]
                print(f"  {k:10s} {statistics.mean(vals):7.1f} {statistics.median(vals):7.1f} "
                      f"{min(vals):7.1f} {max(vals):7.1f}")


if __name__ == "__main__":
    main()
