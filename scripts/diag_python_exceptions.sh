#!/usr/bin/env bash
# Diagnoses a Python process that dies when the module raises (docs/python.md: on the GPU
# machine's Python 3.12 it died at the module's first or second error, because the module carried
# a private static libstdc++; CMakeLists.txt now links the shared one): a child process raises the
# module's error three times, and the script prints how it ended, which libraries the C++
# unwinder's entry points were bound to (LD_DEBUG=bindings: an entry point bound to the module
# itself means a private runtime; a libunwind.so.8 that interposes on libgcc_s is another known
# cause) and which C++ runtimes and unwinders were mapped; where the child died and gdb is
# installed, its backtrace.
#   scripts/diag_python_exceptions.sh [BUILD_DIR]   (default build; needs its python/replayssm*.so)
set -uo pipefail
build=${1:-build}
log=$(mktemp)
child='
import sys
import numpy as np
import replayssm
H, P, N, G = 2, 16, 32, 1
cache = replayssm.ReplayCache((H, P, N, G), A_log=np.zeros(H, np.float32),
                              dt_bias=np.zeros(H, np.float32), D=np.ones(H, np.float32))
slots = np.array([cache.allocate(1)], dtype=np.int32)
for i in range(3):
    try:
        cache.commit(slots, np.array([5], dtype=np.int32))  # no pending entries: an error
    except replayssm.Error as e:
        print(f"error {i + 1} raised and caught: {e}", flush=True)
print(sys.version.split()[0], "numpy", np.__version__, "replayssm", replayssm.__version__)
with open("/proc/self/maps") as maps:
    libs = sorted({line.split()[-1] for line in maps if any(
        k in line for k in ("unwind", "gcc_s", "stdc++", "c++abi"))})
print("mapped C++ runtimes and unwinders:", *libs, sep="\n  ")
'
PYTHONPATH="$build/python" LD_DEBUG=bindings LD_DEBUG_OUTPUT="$log" python3 -X faulthandler -c "$child"
status=$?
echo "child exit status: $status (139 = SIGSEGV)"
if ((status != 0)) && command -v gdb >/dev/null; then
  echo "the child again under gdb, its backtrace at the signal:"
  PYTHONPATH="$build/python" timeout 120 gdb -q -batch -ex run -ex bt -ex "info sharedlibrary" \
    --args python3 -c "$child" 2>&1 | grep -vE "^\[(New|Thread)|libthread_db" | tail -60
fi
echo "bindings of the unwinder and the C++ throw / catch entry points:"
entry='_Unwind_RaiseException|_Unwind_Resume|__cxa_throw|__cxa_begin_catch|__gxx_personality_v0'
cat "$log"* 2>/dev/null | grep -E "symbol \`($entry)'" |
  sed -E 's/^ *[0-9]+: *//' | sort | uniq -c | head -20
rm -f "$log"*
