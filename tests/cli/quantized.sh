#!/usr/bin/env bash
# Quantized Hub checkpoints. Those in a format kiln does not read yet (none of ../shared's now): a
# clear error at config.json's quant_method, no engine written. AWQ, GPTQ and FP8 run their goldens
# with the other models (tests/golden); here, each malformed setting or packed tensor of a copy of
# them is an error that points at the key (file:line:col and a caret) or names the tensor.
. "$(dirname "$0")/lib.sh"
for dir in $(tr ':' '\n' <<<"${KILN_QUANTIZED:-}"); do
  name=$(basename "$dir")
  method=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['quantization_config']['quant_method'])" "$dir/config.json")
  expect_fail_re "$name" "$dir/config.json:[0-9]+:[0-9]+: error: quantization_config.quant_method: \"$method\": kiln reads awq, gptq, compressed-tensors \\(FP8\\) and fp8 checkpoints" -- \
    "$KILN_BIN" build "$dir" -o "$work/$name.engine"
  [ ! -e "$work/$name.engine" ] && passes=$((passes+1)) || { echo "FAIL $name: engine written"; failures=$((failures+1)); }
done
# A copy of a shared AWQ or GPTQ folder with config.json's quantization_config changed by a Python
# expression on q (the dict), and the expected error (a regular expression).
bad_config() {
  local model=$1 change=$2 want=$3 dir="$work/bad"
  rm -rf "$dir" && mkdir -p "$dir" && ln -s "$KILN_SHARED/models/$model/model.safetensors" "$dir/model.safetensors"
  [ -f "$KILN_SHARED/models/$model/tokenizer.json" ] && ln -s "$KILN_SHARED/models/$model/tokenizer.json" "$dir/"
  python3 -c "
import json, sys
c = json.load(open(sys.argv[1])); q = c.get('quantization_config', {})
$change
json.dump(c, open(sys.argv[2], 'w'), indent=2)" "$KILN_SHARED/models/$model/config.json" "$dir/config.json"
  expect_fail_re "$model: $change" "$want" -- "$KILN_BIN" build "$dir" -o "$work/bad.engine"
  [ ! -e "$work/bad.engine" ] && passes=$((passes+1)) || { echo "FAIL $model ($change): engine written"; failures=$((failures+1)); }
}
if [ -d "$KILN_SHARED/models/llama-awq-tiny" ] && [ -d "$KILN_SHARED/models/llama-gptq-tiny" ] &&
   [ -d "$KILN_SHARED/models/llama-fp8-tiny" ]; then
  bad_config llama-awq-tiny "q['bits'] = 3" "config.json:[0-9]+:[0-9]+: error: quantization_config.bits: AWQ checkpoints kiln reads are 4-bit"
  bad_config llama-awq-tiny "q['version'] = 'gemv'" "error: quantization_config.version: kiln reads AWQ's GEMM packing"
  bad_config llama-awq-tiny "q['zero_point'] = False" "error: quantization_config.zero_point: kiln reads AWQ with zero points"
  bad_config llama-awq-tiny "q['group_size'] = 32" "tensor 'model.layers.0.*scales': its shape does not fit the layer's qweight and the group size"
  bad_config llama-awq-tiny "q['quant_method'] = 'bitsandbytes'" "error: quantization_config.quant_method: \"bitsandbytes\": kiln reads awq, gptq, compressed-tensors \\(FP8\\) and fp8 checkpoints"
  bad_config llama-awq-tiny "q['quant_method'] = 7" "error: quantization_config.quant_method: missing, or not a string"
  bad_config llama-awq-tiny "c['quantization_config'] = [1]" "error: quantization_config: must be an object"
  bad_config llama-gptq-tiny "q['bits'] = 2" "error: quantization_config.bits: kiln reads 4- and 8-bit GPTQ"
  bad_config llama-gptq-tiny "q['bits'] = 8" "tensor 'model.layers.0.[a-z_.]*qzeros': expected i32 \\[groups, out \\* bits / 32\\] zero points"
  bad_config llama-gptq-tiny "q['group_size'] = 0" "error: quantization_config.group_size: must be positive, or -1"
  bad_config llama-gptq-tiny "q['group_size'] = 'x'" "error: quantization_config.group_size: must be an integer"
  bad_config llama-gptq-tiny "q['checkpoint_format'] = 'marlin'" "error: quantization_config.checkpoint_format: kiln reads \"gptq\" and \"gptq_v2\""
  bad_config llama-fp8-tiny "q['format'] = 'pack-quantized'" \
    "config.json:[0-9]+:[0-9]+: error: quantization_config.format: kiln reads compressed-tensors' \"float-quantized\" \\(FP8\\) format only"
  bad_config llama-fp8-tiny "q['config_groups']['group_0']['weights']['num_bits'] = 4" \
    "error: quantization_config.config_groups.group_0.weights: kiln reads 8-bit symmetric float weights"
  bad_config llama-fp8-tiny "q['config_groups']['group_0']['weights']['strategy'] = 'group'" \
    "error: quantization_config.config_groups.group_0.weights: strategy must be \"channel\", \"tensor\" or \"block\""
  bad_config llama-fp8-tiny "q['config_groups']['group_0']['weights']['strategy'] = 'tensor'" \
    "tensor 'model.layers.0.[a-z_.]*weight_scale': expected one scale for the tensor"
  bad_config llama-fp8-tiny "q['config_groups'] = {}" "error: quantization_config.config_groups: must be an object of one or more schemes"
  bad_config llama-fp8-tiny "c['quantization_config'] = {'quant_method': 'fp8', 'weight_block_size': [0, 128]}" \
    "error: quantization_config.weight_block_size: must be \\[rows, columns\\], two positive integers"
  bad_config llama-fp8-tiny "c['quantization_config'] = {'quant_method': 'fp8', 'weight_block_size': [64, 64]}" \
    "expected a scale a block"
  # a checkpoint without one of its scale tensors: an error naming the layer's tensor
  for drop in "llama-awq-tiny model.layers.0.self_attn.q_proj.scales model.layers.0.self_attn.q_proj.qweight" \
              "llama-fp8-tiny model.layers.1.mlp.down_proj.weight_scale model.layers.1.mlp.down_proj.weight"; do
    read -r model tensor named <<<"$drop"
    rm -rf "$work/drop" && mkdir -p "$work/drop" && cp "$KILN_SHARED/models/$model/config.json" "$work/drop/"
    python3 - "$KILN_SHARED/models/$model/model.safetensors" "$work/drop/model.safetensors" "$tensor" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
del head[sys.argv[3]]  # its bytes stay in the data section, unreferenced (safetensors allows gaps)
text = json.dumps(head).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
PY
    expect_fail_re "$model without $tensor" "model.safetensors: error: tensor '$named': its scale.* (is|are) missing" -- \
      "$KILN_BIN" build "$work/drop" -o "$work/drop.engine"
    [ ! -e "$work/drop.engine" ] && passes=$((passes+1)) || { echo "FAIL $model without $tensor: engine written"; failures=$((failures+1)); }
  done
  # a float checkpoint that says it is quantized: no packed layer
  bad_config llama-gqa-tiny "c['quantization_config'] = {'quant_method': 'gptq', 'bits': 4, 'group_size': 64}" \
    "config.json:[0-9]+:[0-9]+: error: quantization_config.quant_method: no quantized layer \\(P.qweight\\) in the checkpoint"
  # an FP8 checkpoint with static activation scales (P.input_scale, bf16 [1]): left unread, not called unused
  mkdir -p "$work/static" && cp "$KILN_SHARED/models/llama-fp8-tiny/config.json" "$work/static/"
  python3 - "$KILN_SHARED/models/llama-fp8-tiny/model.safetensors" "$work/static/model.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head, data = json.loads(raw[8:8 + n]), bytearray(raw[8 + n:])
for k in [k for k in head if k.endswith(".weight_scale")]:
    head[k[:-len("weight_scale")] + "input_scale"] = {"dtype": "BF16", "shape": [1], "data_offsets": [len(data), len(data) + 2]}
    data += b"\x80\x3f"  # 1.0
text = json.dumps(head).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + bytes(data))
PY
  expect_quiet_build "an FP8 checkpoint with input scales" "$work/static"
  # the real ones build without calling their packed tensors unused
  for model in llama-awq-tiny llama-gptq-tiny llama-fp8-tiny; do expect_quiet_build "$model" "$KILN_SHARED/models/$model"; done
fi
finish
