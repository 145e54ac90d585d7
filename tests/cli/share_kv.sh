#!/usr/bin/env bash
# share_kv (passes/share_kv.c): an attention whose V is each head's first dims of its K keeps K alone in the
# cache (v_in_k). DeepSeek-V3's latent attention (K = [latent, rotary key], V = the latent): both layers'
# attention and kv_write marked, the cache a third smaller (K's 24 values a position, not 24 + 16), the
# logits unchanged (the goldens of tests/golden run the same engine); a Llama, whose V is its own, untouched;
# the IR's round trip keeps the attribute.
. "$(dirname "$0")/lib.sh"
ds="$(dirname "$0")/../data/deepseek_v3-tiny"
ts="$KILN_SHARED/models/tinystories-656k"
"$KILN_BIN" build "$ds" -o "$work/ds.engine" --dump-ir-after share_kv,plan_memory --dump-dir "$work/ir" >/dev/null 2>&1 \
  || { echo "FAIL: kiln build"; exit 1; }
expect_same "deepseek: attention v_in_k" 2 "$(grep -cE '= attention\(.*v_in_k=1' "$work/ir/03-share_kv.ir")"
expect_same "deepseek: kv_write of K alone" 2 "$(grep -cE '= kv_write\(.*v_in_k=1' "$work/ir/13-plan_memory.ir")"
# the cache's bytes a block: 16 positions x 2 layers x 1 head x 24 f32 values (K alone; with V 40)
kv=$("$KILN_BIN" bench "$work/ds.engine" --prompts 8 --decode 2 --reps 1 --warmup 0 --json 2>/dev/null | tail -1 |
  python3 -c "import json, sys; r = json.load(sys.stdin); print(r['kv_bytes'] // r['kv_blocks'])")
expect_same "deepseek: bytes a KV block" 3072 "$kv"
"$KILN_BIN" build "$ds" -o "$work/ds-again.engine" --from-ir "$work/ir/13-plan_memory.ir" >/dev/null 2>&1 \
  && "$KILN_BIN" run "$work/ds.engine" --ids 1,2,3,4 -n 3 --temperature 0 --logits-out "$work/a.bin" >/dev/null 2>&1 \
  && "$KILN_BIN" run "$work/ds-again.engine" --ids 1,2,3,4 -n 3 --temperature 0 --logits-out "$work/b.bin" >/dev/null 2>&1 \
  && cmp -s "$work/a.bin" "$work/b.bin" && passes=$((passes+1)) || { echo "FAIL: the IR's round trip"; failures=$((failures+1)); }
"$KILN_BIN" build "$ts" -o "$work/ts.engine" --dump-ir-after share_kv --dump-dir "$work/ts" >/dev/null 2>&1 \
  || { echo "FAIL: kiln build tinystories"; exit 1; }
expect_same "llama: V its own" 0 "$(grep -c 'v_in_k' "$work/ts/03-share_kv.ir")"
finish
