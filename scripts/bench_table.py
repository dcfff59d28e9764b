#!/usr/bin/env python3
"""The README's headline table from `replayssm bench -o json` runs: one row per configuration
and window, one column per batch size. A cell is the microseconds per layer-step; a replay cell
adds its speedup over the standard fp32 / bf16 kernels of its window (T = 1 for W = 1, T = W with
intermediate states otherwise), a standard cell the fraction of the copy bandwidth it reached.

Each FILE is one bench output or a combined results file (run key -> bench output), of which
`FILE:TEXT` takes the runs whose key contains TEXT (as in scripts/bench_compare.py). Where several
runs hold a configuration, the cell is their mean and a speedup the ratio of the means. Every
run's ratios are against the standard kernels of its own process, so pool runs of one call only;
runs of different settings (history, shape, ...) are refused: select one with TEXT or --history.

    scripts/bench_table.py bench/results/2026-12-05-h100-session48.json:call1-main
    scripts/bench_table.py gpu-out/table.json --history 16
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_compare import InputError, bench_outputs, config_times, mean  # noqa: E402

# Replay modes from the widest checkpoint to the narrowest, as the README lists them.
MODE_ORDER = ["fp32", "bf16", "fp16", "fp16-sr", "shared-int8", "shared-fp8", "separate-fp8",
              "separate-nvfp4"]


def row_order(name, window):
    """Windows in order; in each, the fp32 then the bf16 standard kernel, then the replay modes."""
    if name.startswith("standard"):
        return (window, 0, 0 if "fp32" in name else 1)
    mode = name.removeprefix("replay ")
    return (window, 1, MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


def label(name, window):
    if name.startswith("standard"):
        state = "fp32" if "fp32" in name else "bf16"
        if window == 1:
            return f"standard decode, {state} state"
        return f"standard, {window} tokens with intermediate states, {state}"
    mode = name.removeprefix("replay ")
    return f"replay {mode}, " + ("autoregressive" if window == 1 else f"verify {window}")


def baseline(state, window):
    """The bench's name of the standard kernel a replay row of this window is compared with."""
    return f"standard {state} state" + ("" if window == 1 else " + intermediates")


def table(runs):
    """The markdown table of the runs (a list of bench outputs)."""
    times = config_times(runs)
    fractions = config_times(runs, "fraction_of_copy_bandwidth")
    batches = sorted({batch for (_, batch, _) in times})
    configs = sorted({(name, window) for (name, _, window) in times}, key=lambda c: row_order(*c))
    lines = ["| us per layer-step (speedup over standard fp32 / bf16) | " +
             " | ".join(f"batch {b}" for b in batches) + " |",
             "|---|" + "---:|" * len(batches)]
    for name, window in configs:
        cells = []
        for batch in batches:
            key = (name, batch, window)
            if key not in times:
                cells.append("")
                continue
            us = mean(times[key])
            if name.startswith("standard"):
                cells.append(f"{us:.1f} ({100 * mean(fractions[key]):.0f}%)")
                continue
            bases = [(baseline(s, window), batch, window) for s in ("fp32", "bf16")]
            if all(b in times for b in bases):
                ratios = [mean(times[b]) / us for b in bases]
                cells.append(f"{us:.1f} ({ratios[0]:.2f}x / {ratios[1]:.2f}x)")
            else:
                cells.append(f"{us:.1f}")
        lines.append(f"| {label(name, window)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", metavar="FILE[:TEXT]", help="bench outputs")
    parser.add_argument("--history", type=int, help="only the runs of this ring capacity")
    args = parser.parse_args(argv)
    try:
        runs = []
        for item in args.files:
            path, colon, key_filter = item.partition(":")
            runs += bench_outputs(path, key_filter if colon else None)
        if args.history is not None:
            runs = [r for r in runs if r.get("history") == args.history]
            if not runs:
                raise InputError(f"no run of history {args.history}")
        print(table(runs))
    except InputError as e:
        print(f"bench_table: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
