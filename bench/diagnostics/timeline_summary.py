#!/usr/bin/env python3
"""Summarises a step timeline written by a build with bench/diagnostics/step-timeline.patch
(REPLAYSSM_TIMELINE=PREFIX replayssm bench ...): per step, when each kernel's blocks start, pass
their waits, begin the walk and end, as medians over the recorded steps; then one step's
profile in 1 us bins (blocks of each phase running) and the spread of blocks over SMs.

    python3 bench/diagnostics/timeline_summary.py PREFIX.<pid>.<n>.csv [--bin-us 1]
"""
import argparse
import csv
import statistics as st

VALIDATE, FLUSH, VERIFY = 0, 1, 2


def load(path):
    header, rows = "", []
    with open(path) as f:
        first = f.readline()
        header = first.strip() if first.startswith("#") else ""
        if not header:
            f.seek(0)
        for r in csv.DictReader(f):
            rows.append({k: int(v) for k, v in r.items()})
    return header, rows


def split_steps(rows, gap_ns=3000):
    """Steps begin where a validate block starts more than gap_ns after the previous one."""
    starts = sorted(r["start"] for r in rows if r["kind"] == VALIDATE)
    bounds = [s for i, s in enumerate(starts) if i == 0 or s - starts[i - 1] > gap_ns]
    # The first step may have lost blocks to the ring's overwriting and the last may be cut short.
    return [[r for r in rows if b <= r["start"] < e] for b, e in zip(bounds[1:-1], bounds[2:])]


def step_stats(step):
    t0 = min(r["start"] for r in step if r["kind"] == VALIDATE)
    rel = lambda t: (t - t0) / 1000.0  # us
    val = [r for r in step if r["kind"] == VALIDATE]
    fl = [r for r in step if r["kind"] == FLUSH]
    fl_work = [r for r in fl if r["mark2"]]
    ver = [r for r in step if r["kind"] == VERIFY]
    ver_f = [r for r in ver if r["flushing"]]
    ver_n = [r for r in ver if not r["flushing"]]
    s = {
        "validate end": rel(max(r["end"] for r in val)),
        "flush first start": rel(min(r["start"] for r in fl)) if fl else None,
        "flush past wait (first)": rel(min(r["mark1"] for r in fl)) if fl else None,
        "flush items start (first)": rel(min(r["mark2"] for r in fl_work)) if fl_work else None,
        "flush end (last)": rel(max(r["end"] for r in fl_work)) if fl_work else None,
        "flush blocks with items": len(fl_work),
        "verify first start": rel(min(r["start"] for r in ver)) if ver else None,
        "verify walk start, other entries (median)":
            st.median(rel(r["mark2"]) for r in ver_n if r["mark2"]) if ver_n else None,
        "verify end, other entries (last)": rel(max(r["end"] for r in ver_n)) if ver_n else None,
        "verify past flush wait, flushing entries (first)":
            rel(min(r["mark1"] for r in ver_f)) if ver_f else None,
        "verify walk start, flushing entries (median)":
            st.median(rel(r["mark2"]) for r in ver_f if r["mark2"]) if ver_f else None,
        "verify end, flushing entries (last)": rel(max(r["end"] for r in ver_f)) if ver_f else None,
        "verify blocks (flushing entries)": f"{len(ver)} ({len(ver_f)})",
        "verify prologue per block, other entries (median us)":
            st.median((r["mark2"] - r["start"]) / 1000.0 for r in ver_n if r["mark2"])
            if ver_n else None,
        "verify walk per block, other entries (median us)":
            st.median((r["end"] - r["mark2"]) / 1000.0 for r in ver_n if r["mark2"])
            if ver_n else None,
        "flush block span with items (median us)":
            st.median((r["end"] - r["start"]) / 1000.0 for r in fl_work) if fl_work else None,
        "step end": rel(max(r["end"] for r in step)),
    }
    return t0, s


def profile(step, t0, bin_us):
    end = max(r["end"] for r in step)
    bins = int((end - t0) / 1000.0 / bin_us) + 1
    cols = ["validate", "flush", "verify prologue", "verify walk", "verify waiting"]
    prof = [[0] * len(cols) for _ in range(bins)]

    def add(col, a, b):
        if not a or not b or b <= a:
            return
        for i in range(int((a - t0) / 1000 / bin_us), int((b - t0) / 1000 / bin_us) + 1):
            if 0 <= i < bins:
                prof[i][col] += 1

    for r in step:
        if r["kind"] == VALIDATE:
            add(0, r["start"], r["end"])
        elif r["kind"] == FLUSH and r["mark2"]:
            add(1, r["start"], r["end"])
        elif r["kind"] == VERIFY:
            if r["flushing"]:
                add(4, r["start"], r["mark1"])
                add(2, r["mark1"], r["mark2"] or r["end"])
            else:
                add(2, r["start"], r["mark2"] or r["end"])
            if r["mark2"]:
                add(3, r["mark2"], r["end"])
    print(f"\nBlocks running in each {bin_us} us bin of the median-length step:")
    print("| us | " + " | ".join(cols) + " |")
    print("|---:|" + "---:|" * len(cols))
    for i, p in enumerate(prof):
        print(f"| {i * bin_us:.0f} | " + " | ".join(str(v) for v in p) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--bin-us", type=float, default=1.0)
    a = ap.parse_args()
    header, rows = load(a.csv)
    steps = [s for s in split_steps(rows) if any(r["kind"] == VERIFY for r in s)]
    print(header)
    print(f"{len(rows)} records, {len(steps)} whole steps")
    if not steps:
        return
    stats = [step_stats(s) for s in steps]
    print("\n| per step (us from the first validate block's start) | median | min | max |")
    print("|---|---:|---:|---:|")
    for k in stats[0][1]:
        vals = [s[k] for _, s in stats if isinstance(s[k], (int, float))]
        if vals and not isinstance(stats[0][1][k], str):
            print(f"| {k} | {st.median(vals):.1f} | {min(vals):.1f} | {max(vals):.1f} |")
        else:
            print(f"| {k} | {stats[0][1][k]} | | |")
    lengths = [s["step end"] for _, s in stats]
    mid = sorted(range(len(stats)), key=lambda i: lengths[i])[len(stats) // 2]
    profile(steps[mid], stats[mid][0], a.bin_us)
    sms = {}
    for r in steps[mid]:
        sms.setdefault(r["smid"], []).append(r["kind"])
    per = [len(v) for v in sms.values()]
    print(f"\nSMs used {len(sms)}; blocks per SM in that step: median {st.median(per)}, "
          f"min {min(per)}, max {max(per)}")


if __name__ == "__main__":
    main()
