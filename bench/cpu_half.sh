#!/bin/sh
# cpu_half.sh [KILN] — the reference interpreter (CPU) on a model large enough to be bound by memory
# bandwidth, with f32, bf16 and f16 weights: decode tokens/s and peak resident memory. A measurement,
# not a test; bench/RESULTS.md ("CPU interpreter: half-precision weights") keeps its figures.
#
#   KILN            the kiln binary to measure (default build/cli/kiln)
#   KILN_BENCH_DIR  where the generated model, engines and tools go (default /tmp/kiln_cpu_half;
#                   about 2.2 GB; kept between runs, nothing is written into the repository)
#
# 1. bench/cpu_half_model.py writes a random-weight Llama of 200.8M parameters (bf16 safetensors;
#    numpy, installed into a virtual environment there when python3 lacks it).
# 2. bench/membw.c measures memory bandwidth: a copy loop and a read loop, 1 and 2 threads.
# 3. For f32, bf16 and f16: kiln build, then five times `kiln run ENGINE --ids <16 ids> -n 64` (greedy)
#    under /usr/bin/time -v: kiln's decode tokens/s (64 new tokens, time to first token apart) and the
#    peak RSS (the mapped engine's pages it touched count). The best and the median rate of the five
#    are reported, and the floor: the bytes of weights a decode step reads over the read bandwidth
#    (2 threads, as the interpreter's matmuls use on this machine; the best of three measurements).
# On a machine shared with other work the rates vary from run to run: the load average is printed.
# Run from the repository root.
set -eu
KILN=${1:-build/cli/kiln}
DIR=${KILN_BENCH_DIR:-/tmp/kiln_cpu_half}
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
    b=$("$DIR/membw" 512 2 | tee /dev/stderr | sed 's/.*read \([0-9.]*\) GB.*/\1/')
    BW=$(echo "$b $BW" | awk '{print ($1 > $2) ? $1 : $2}')
done

IDS=$(python3 -c "print(','.join(str(100 + 997 * i % 31000) for i in range(16)))")
for dt in f32 bf16 f16; do
    e="$DIR/$dt.engine"
    "$KILN" build "$DIR/model" --dtype "$dt" -o "$e" >/dev/null
    cat "$e" >/dev/null # in the page cache before the first run
    rates="" rss=0
    for rep in 1 2 3 4 5; do
        /usr/bin/time -v "$KILN" run "$e" --ids "$IDS" -n 64 >/dev/null 2>"$DIR/run.err"
        r=$(sed -n 's/.*, \([0-9.]*\) tokens\/s$/\1/p' "$DIR/run.err")
        m=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$DIR/run.err")
        echo "$dt run $rep: $(grep 'tokens/s' "$DIR/run.err" | sed 's/^kiln: //'), peak RSS $((m / 1024)) MiB, load $(cut -d' ' -f1 /proc/loadavg)"
        rates="$rates $r"
        [ "$m" -gt "$rss" ] && rss=$m
    done
    best=$(echo $rates | tr ' ' '\n' | sort -n | tail -1)
    median=$(echo $rates | tr ' ' '\n' | sort -n | sed -n 3p)
    case $dt in f32) bytes=$((PER_TOKEN * 4)) ;; *) bytes=$((PER_TOKEN * 2)) ;; esac
    echo "$bytes $BW $best $median $rss $(stat -c %s "$e")" | awk -v dt="$dt" '{
        floor = $2 * 1e9 / $1
        printf "== %s: engine %.0f MB, decode reads %.0f MB/token, floor %.1f tokens/s (at %.2f GB/s), measured best %.1f (%.0f%% of the floor), median %.1f tokens/s, peak RSS %.0f MiB\n",
               dt, $6 / 1e6, $1 / 1e6, floor, $2, $3, 100 * $3 / floor, $4, $5 / 1024 }'
done
