#!/bin/sh
# cpu_half.sh [KILN...] — the reference interpreter (CPU) on a model large enough to be bound by memory
# bandwidth, with f32, bf16 and f16 weights: decode tokens/s and peak resident memory. A measurement,
# not a test; bench/RESULTS.md ("CPU interpreter: half-precision weights") keeps its figures.
#
#   KILN...         the kiln binaries to measure (default build/cli/kiln); with several (say, before and
#                   after a change) their runs alternate, so that a change of load affects them alike
#   KILN_BENCH_DIR  where the generated model, engines and tools go (default /tmp/kiln_cpu_half;
#                   about 2.4 GB; kept between runs, nothing is written into the repository)
#   KILN_BENCH_RUNS runs of each binary on each engine (default 5)
#
# 1. bench/cpu_half_model.py writes a random-weight Llama of 200.8M parameters (bf16 safetensors;
#    numpy, installed into a virtual environment there when python3 lacks it).
# 2. bench/membw.c measures memory bandwidth: a copy loop and a read loop, 1 and 2 threads.
# 3. For f32, bf16 and f16: the first binary builds the engine (kiln build --dtype), then each binary
#    runs `kiln run ENGINE --ids <16 ids> -n 64 --profile` (greedy) under /usr/bin/time -v: kiln's
#    decode tokens/s (64 new tokens; time to first token, a prefill of 16, apart), the fastest decode
#    step (--profile) and the peak RSS (the mapped engine's pages it touched count). Reported per
#    binary and engine: the best and the median rate, the fastest step of all runs (the figure least
#    disturbed by other work) as tokens/s, the median time to first token, the largest peak RSS, and
#    the floor: the bytes of weights a decode step reads over the read bandwidth (2 threads, as the
#    interpreter's matmuls use on this machine; the best of three measurements).
# On a machine shared with other work the rates vary from run to run: the load average is printed.
# Run from the repository root.
set -eu
[ $# -gt 0 ] || set -- build/cli/kiln
DIR=${KILN_BENCH_DIR:-/tmp/kiln_cpu_half}
RUNS=${KILN_BENCH_RUNS:-5}
mkdir -p "$DIR"

if [ ! -f "$DIR/model/model.safetensors" ]; then
    PY=python3
    if ! python3 -c 'import numpy' 2>/dev/null; then
        [ -x "$DIR/venv/bin/python" ] || { python3 -m venv "$DIR/venv" && "$DIR/venv/bin/pip" install -q numpy; }
        PY="$DIR/venv/bin/python"
    fi
    "$PY" bench/cpu_half_model.py "$DIR/model"
fi
# parameters every decode step reads: all but the embedding table, of which one row
PER_TOKEN=$(python3 - "$DIR/model/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
h, f, v, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
print(L * (2 * h + h * q + 2 * h * kv + q * h + 3 * h * f) + h + v * h + h)
EOF
)

cc -O2 -Wall -Wextra -pthread -o "$DIR/membw" bench/membw.c
echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$DIR/membw" 512 1
BW=0
for rep in 1 2 3; do
    b=$("$DIR/membw" 512 2)
    echo "$b"
    BW=$(echo "$b" | sed 's/.*read \([0-9.]*\) GB.*/\1/' | awk -v bw="$BW" '{print ($1 > bw) ? $1 : bw}')
done

IDS=$(python3 -c "print(','.join(str(100 + 997 * i % 31000) for i in range(16)))")
# median of the numbers on standard input
median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
for dt in f32 bf16 f16; do
    e="$DIR/$dt.engine"
    "$1" build "$DIR/model" --dtype "$dt" -o "$e" >/dev/null
    cat "$e" >/dev/null # in the page cache before the first run
    : >"$DIR/runs.txt"
    rep=0
    while [ $rep -lt "$RUNS" ]; do
        rep=$((rep + 1))
        k=0
        for kiln in "$@"; do
            k=$((k + 1))
            /usr/bin/time -v "$kiln" run "$e" --ids "$IDS" -n 64 --profile >/dev/null 2>"$DIR/run.err"
            line=$(grep 'tokens/s' "$DIR/run.err" | sed 's/^kiln: //')
            rate=$(echo "$line" | sed -n 's/.*, \([0-9.]*\) tokens\/s$/\1/p')
            ttft=$(echo "$line" | sed -n 's/.*first token \([0-9.]*\) ms.*/\1/p')
            fastest=$(sed -n 's/.*decode steps.*(min \([0-9.]*\),.*/\1/p' "$DIR/run.err")
            rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$DIR/run.err")
            echo "$dt $kiln run $rep: $line, fastest decode step $fastest us, peak RSS $((rss / 1024)) MiB," \
                "load $(cut -d' ' -f1 /proc/loadavg)"
            echo "$k $rate $ttft $rss $fastest" >>"$DIR/runs.txt"
        done
    done
    case $dt in f32) bytes=$((PER_TOKEN * 4)) ;; *) bytes=$((PER_TOKEN * 2)) ;; esac
    k=0
    for kiln in "$@"; do
        k=$((k + 1))
        best=$(awk -v k=$k '$1 == k {print $2}' "$DIR/runs.txt" | sort -n | tail -1)
        med=$(awk -v k=$k '$1 == k {print $2}' "$DIR/runs.txt" | median)
        ttft=$(awk -v k=$k '$1 == k {print $3}' "$DIR/runs.txt" | median)
        rss=$(awk -v k=$k '$1 == k {print $4}' "$DIR/runs.txt" | sort -n | tail -1)
        fastest=$(awk -v k=$k '$1 == k {print $5}' "$DIR/runs.txt" | sort -n | head -1)
        echo "$bytes $BW $best $med $ttft $rss $(stat -c %s "$e") $fastest" | awk -v dt="$dt" -v kiln="$kiln" '{
            floor = $2 * 1e9 / $1
            printf "== %s, %s: engine %.0f MB, decode reads %.0f MB/token, floor %.1f tokens/s (at %.2f GB/s); " \
                   "decode best %.1f tokens/s, median %.1f; fastest step %.1f ms (%.1f tokens/s, %.0f%% of the floor); " \
                   "time to first token (median) %.0f ms; peak RSS %.0f MiB\n", dt, kiln, $7 / 1e6, $1 / 1e6, floor, $2,
                   $3, $4, $8 / 1e3, 1e6 / $8, 100 * 1e6 / $8 / floor, $5, $6 / 1024 }'
    done
done
