#!/usr/bin/env bash
# A/B of programs built elsewhere (here, for sm_90a) and carried with the device call, so that no
# device time goes to builds: the same benchmarks run with every program in turn, ROUNDS times,
# the order rotated each round (same card state, same copy-bandwidth ceiling; a drift over the
# call shows as a difference between rounds). A program may run with its own environment (a knob
# of an experiment). Results go to $OUT/results.tgz, packed again after every run, with one
# `scripts/bench_compare.py` table per configuration (compare-c<i>.md), the first program the base.
#   scripts/gpu_ab_programs.sh NAME=PROGRAM[+VAR=VALUE...]...
#   e.g. UNPACK=.cuda-wt/pk/pk.tar.xz scripts/gpu_ab_programs.sh main=rs-main new=rs-new \
#          knob=rs-knob+REPLAYSSM_CARVEOUT_ALL=85
# PROGRAM: a path, or a file of the UNPACK archive (a .tar.xz, unpacked first); a PROGRAM.xz is
# decompressed. Each is made executable (a file packed without its execute bit is still run).
# Environment: BENCH_ARGS (the `replayssm bench --backend cuda` options; several configurations
# separated by ';'), ROUNDS (default 2), BENCH_LIMIT_S (seconds per run, default 60), LIMIT_S
# (overall, default 540: later runs are skipped), UNPACK, OUT (default gpu-out), RESULTS_DIR (the
# folder the runs are written to and $OUT/results.tgz is packed from; default a temporary one).
# Each run writes bench-c<configuration>-r<round>-<name>.json and .err (whose `[bench]` lines are
# the rows measured so far: a run cut short by its limit writes no JSON, and the tables take
# those rows instead).
# Make the programs: build here (`cmake --build build --target replayssm-cli`), then
# `strip -o DIR/NAME build/bin/replayssm`; `tar -cf - -C DIR . | xz -T1 -9e` packs several
# programs of one source tree in little more than one's size (docs/cuda.md).
set -uo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: scripts/gpu_ab_programs.sh NAME=PROGRAM[+VAR=VALUE...]..." >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-gpu-out}
mkdir -p "$out"
bins=$(mktemp -d)
if [[ -n ${RESULTS_DIR:-} ]]; then  # a caller's folder (scripts/gpu_ab.sh): packed, kept
  work=$RESULTS_DIR
  mkdir -p "$work"
  trap 'rm -rf "$bins"' EXIT
else
  work=$(mktemp -d)
  trap 'rm -rf "$work" "$bins"' EXIT
fi
default_args="--batches 64,256 --windows 1 --modes shared-fp8,separate-fp8,separate-nvfp4"
bench_args=${BENCH_ARGS:-$default_args}
rounds=${ROUNDS:-2}
bench_limit=${BENCH_LIMIT_S:-60}
limit=${LIMIT_S:-540}
pack() { tar -czf "$out/results.tgz" -C "$work" .; }
left() {  # at least 1: `timeout 0` would mean no limit
  local l=$((limit - SECONDS))
  echo $((l > 1 ? l : 1))
}

if [[ -n ${UNPACK:-} ]]; then
  xz -dc "$UNPACK" | tar -xf - -C "$bins" || { echo "cannot unpack $UNPACK" >&2; exit 2; }
fi
names=() programs=() envs=()
for spec in "$@"; do
  name=${spec%%=*} rest=${spec#*=}
  [[ $spec == *=* && -n $name && -n $rest ]] || { echo "not NAME=PROGRAM: $spec" >&2; exit 2; }
  IFS='+' read -r -a parts <<< "$rest"
  program=${parts[0]}
  [[ -e $program ]] || program=$bins/${parts[0]}
  [[ -e $program ]] || { echo "$name: no program ${parts[0]} (nor in UNPACK)" >&2; exit 2; }
  if [[ $program == *.xz ]]; then  # decompressed, or copied where it lacks the execute bit
    xz -dc "$program" > "$bins/$name.bin" || exit 2
    program=$bins/$name.bin
  elif [[ ! -x $program ]]; then
    cp "$program" "$bins/$name.bin" || exit 2
    program=$bins/$name.bin
  fi
  chmod +x "$program" 2>/dev/null
  names+=("$name") programs+=("$program") envs+=("${parts[*]:1}")
  "$program" --version > "$work/version-$name.txt" 2>&1
  echo "[$name] $(head -1 "$work/version-$name.txt")${envs[-1]:+ with ${envs[-1]}}"
done

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$work/gpu.txt" 2>&1
IFS=';' read -r -a configs <<< "$bench_args"
printf '%s\n' "${configs[@]}" > "$work/configurations.txt"
n=${#names[@]}
for ((round = 1; round <= rounds; ++round)); do
  for ((c = 0; c < ${#configs[@]}; ++c)); do
    for ((k = 0; k < n; ++k)); do
      i=$(((k + round - 1) % n))  # rotated, so no program always runs first
      tag="bench-c$c-r$round-${names[i]}"
      if (($(left) < bench_limit)); then
        echo "[${names[i]}] skipped $tag: LIMIT_S"
        continue
      fi
      # shellcheck disable=SC2086  # the environment and the options split on spaces
      env ${envs[i]} timeout "$bench_limit" "${programs[i]}" bench --backend cuda ${configs[c]} \
        -o json > "$work/$tag.json" 2> "$work/$tag.err"
      echo "[${names[i]}] $tag exit $? at ${SECONDS}s"
      grep -h '^\[bench\] replay' "$work/$tag.err"
      pack
    done
  done
done
for ((c = 0; c < ${#configs[@]}; ++c)); do
  sets=()
  for ((i = 0; i < n; ++i)); do
    files=()
    for ((round = 1; round <= rounds; ++round)); do
      f=$work/bench-c$c-r$round-${names[i]}
      # A run cut short by BENCH_LIMIT_S wrote no JSON: the rows its stderr reported count, where
      # bench_compare.py reads any (a run cut before its first row is left out instead of failing
      # the configuration's table).
      if [[ -s $f.json ]]; then
        files+=("$f.json")
      elif [[ -s $f.err ]] && python3 "$here/bench_compare.py" "cut=$f.err" >/dev/null 2>&1; then
        files+=("$f.err")
      fi
    done
    ((${#files[@]})) && sets+=("${names[i]}=$(IFS=,; echo "${files[*]}")")
  done
  ((${#sets[@]})) || continue
  python3 "$here/bench_compare.py" "${sets[@]}" > "$work/compare-c$c.md" 2>&1
  echo "configuration $c (${configs[c]}):"
  cat "$work/compare-c$c.md"
done
pack
