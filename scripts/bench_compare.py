#!/usr/bin/env python3
"""A/B table of `replayssm bench -o json` runs: microseconds per layer-step of each configuration
in each set of runs, and the change against the first set.

Each SET is `LABEL=FILE[,FILE...]`. A FILE is one bench output (`replayssm bench -o json`) or a
combined results file (`bench/results/*-callN.json`: an object of run key -> bench output), of
which `FILE:TEXT` takes the runs whose key contains TEXT, or the stderr of a run cut short
(`.err`: its `[bench] NAME, batch B, W W: T us/step` lines, the rows measured before it stopped,
and its `[bench] settings {...}` line; scripts/gpu_ab_programs.sh keeps them). A set's value for
a configuration (name, batch, window) is the mean over its runs, which must share their settings
(history, shape, ...: RUN_SETTINGS); the run count and the spread (max - min, % of the mean) are
shown where a set has more than one run.

The standard kernels are the same code in every set, so their differences between sets are the
noise of the comparison (other clocks, another machine, another process): the table ends with
the largest of them, and a change of a replay configuration below it is not a measurement of the
change. That is also why the base of an A/B should be main's own binary, measured in the same call
(docs/cuda.md, "Running on the GPU machine").

    scripts/bench_compare.py main=r1-main.json,r2-main.json new=r1-new.json,r2-new.json
    scripts/bench_compare.py off=bench/results/X-call4.json:-off- on=bench/results/X-call4.json:-on-
"""
import argparse
import json
import re
import sys

STANDARD_PREFIX = "standard"


class InputError(Exception):
    """A set or file that cannot be read, with what is wrong with it."""


# A row as `replayssm bench` reports it on stderr while it runs (tools/cmd_bench.cpp), and the
# run's settings (the JSON document's fields but the rows and the provenance), printed before
# the first row.
BENCH_LINE = re.compile(r"^\[bench\] (.+), batch (\d+), W (\d+): ([0-9.]+) us/step")
SETTINGS_LINE = re.compile(r"^\[bench\] settings (\{.*\})$")


def stderr_rows(path):
    """The bench output of a run known only by its stderr: the rows its `[bench]` lines name,
    with the settings of its `[bench] settings` line (none from a bench older than that line)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror})")
    rows = [{"name": m[1], "batch": int(m[2]), "window": int(m[3]), "us_per_step": float(m[4])}
            for m in map(BENCH_LINE.match, lines) if m]
    if not rows:
        raise InputError(f"{path}: no '[bench] NAME, batch B, W W: T us/step' line")
    output = {}
    for m in filter(None, map(SETTINGS_LINE.match, lines)):
        try:
            settings = json.loads(m[1])
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: its '[bench] settings' line is not JSON ({e.msg})")
        output.update(settings)
    output["rows"] = rows
    return output


def bench_outputs(path, key_filter=None):
    """The bench outputs in `path`: the file itself, the values of a combined results file whose
    keys contain key_filter (all of them without one), or a run's stderr (.err)."""
    if path.endswith(".err"):
        if key_filter is not None:
            raise InputError(f"{path}: a run's stderr has no run keys to select with "
                             f"':{key_filter}'")
        return [stderr_rows(path)]
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror})")
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON ({e.msg} at line {e.lineno})")
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, found {type(data).__name__}")
    if "rows" in data:
        if key_filter is not None:
            raise InputError(f"{path}: one bench output has no run keys to select with "
                             f"':{key_filter}'")
        return [data]
    runs = [value for key, value in sorted(data.items())
            if isinstance(value, dict) and "rows" in value
            and (key_filter is None or key_filter in key)]
    if not runs:
        what = f"whose key contains '{key_filter}'" if key_filter is not None else ""
        raise InputError(f"{path}: no bench output (an object with 'rows') {what}".rstrip())
    return runs


def parse_set(text):
    """LABEL=FILE[,FILE...] -> (label, [bench output, ...])."""
    label, sep, files = text.partition("=")
    if not sep or not label or not files:
        raise InputError(f"'{text}': expected LABEL=FILE[,FILE...]")
    runs = []
    for item in files.split(","):
        path, colon, key_filter = item.partition(":")
        runs += bench_outputs(path, key_filter if colon else None)
    return label, runs


# A bench output's settings that change what its rows measure. Rows are matched by (name, batch,
# window) only, so runs pooled into one mean must agree on these: session 61's README table
# averaged its history-16 and history-32 runs this way before the check existed.
RUN_SETTINGS = ("backend", "shape", "history", "phases", "cold_cache", "accept_mean",
                "accept_window")


def check_same_settings(runs):
    """Raises InputError naming each setting that differs between the runs (a setting a run
    does not state, as in the stderr of a bench older than its settings line, agrees with any)."""
    differing = []
    for setting in RUN_SETTINGS:
        values = []
        for data in runs:
            value = data.get(setting)
            if value is not None and value not in values:
                values.append(value)
        if len(values) > 1:
            differing.append(f"{setting} " + " / ".join(json.dumps(v) for v in values))
    if differing:
        raise InputError("the runs pooled into one mean differ in " + "; ".join(differing) +
                         ": select runs of one setting (FILE:TEXT, or bench_table's --history)")


def config_times(runs, field="us_per_step"):
    """(name, batch, window) -> [the row's `field` (us_per_step) of each run], in the order the
    runs list them. The runs must share their settings (check_same_settings)."""
    check_same_settings(runs)
    times = {}
    for data in runs:
        for row in data["rows"]:
            try:
                key = (row["name"], int(row["batch"]), int(row["window"]))
                value = float(row[field])
            except (KeyError, TypeError, ValueError) as e:
                raise InputError(f"a bench row lacks name, batch, window or {field}: {e}")
            times.setdefault(key, []).append(value)
    return times


def mean(values):
    return sum(values) / len(values)


def spread_pct(values):
    return 100.0 * (max(values) - min(values)) / mean(values)


def compare(sets):
    """sets: [(label, runs)] -> (table rows, largest change of a standard kernel in %).
    Each row: (name, batch, window, [(mean, runs, spread %) or None per set], [change % or None
    per set after the first])."""
    per_set = [config_times(runs) for _, runs in sets]
    order = []
    for times in per_set:
        order += [key for key in times if key not in order]
    rows, noise = [], 0.0
    for key in order:
        cells = [(mean(t[key]), len(t[key]), spread_pct(t[key])) if key in t else None
                 for t in per_set]
        base = cells[0]
        changes = [100.0 * (c[0] - base[0]) / base[0] if c and base else None for c in cells[1:]]
        if key[0].startswith(STANDARD_PREFIX):
            noise = max([noise] + [abs(c) for c in changes if c is not None])
        rows.append((*key, cells, changes))
    return rows, noise


def markdown(sets, rows, noise):
    labels = [label for label, _ in sets]
    head = ["configuration", "batch", "W"] + [f"{label} us" for label in labels]
    head += [f"{label} vs {labels[0]}" for label in labels[1:]]
    lines = ["| " + " | ".join(head) + " |",
             "|---|---:|---:|" + "---:|" * (len(labels) + len(labels) - 1)]
    for name, batch, window, cells, changes in rows:
        out = [name, str(batch), str(window)]
        for cell in cells:
            if cell is None:
                out.append("-")
            elif cell[1] > 1:
                out.append(f"{cell[0]:.1f} ({cell[1]} runs, {cell[2]:.1f}%)")
            else:
                out.append(f"{cell[0]:.1f}")
        out += ["-" if c is None else f"{c:+.1f}%" for c in changes]
        lines.append("| " + " | ".join(out) + " |")
    lines.append("")
    lines.append(f"The standard kernels (the same code in every set) differ by up to {noise:.1f}% "
                 f"between the sets: changes of that size are noise.")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sets", nargs="+", metavar="LABEL=FILE[,FILE...]",
                        help="a set of runs; the first is the base")
    args = parser.parse_args(argv)
    try:
        sets = [parse_set(text) for text in args.sets]
        if len({label for label, _ in sets}) != len(sets):
            raise InputError("two sets have the same label")
        rows, noise = compare(sets)
    except InputError as e:
        print(f"bench_compare: {e}", file=sys.stderr)
        return 2
    print(markdown(sets, rows, noise))
    return 0


if __name__ == "__main__":
    sys.exit(main())
