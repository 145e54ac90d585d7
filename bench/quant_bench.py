#!/usr/bin/env python3
"""quant_bench.py — quantized engines (kiln build --quant, issue #13) against their bytes floors and the
bf16 engine of the same weights, on the GPU machine.

The shape: Llama-3-8B (tests/data/llama3-8b-config.json), LAYERS of its 32 (default all), random bf16
weights (N(0, 0.02), norms 1) made on the GPU by transformers and saved as safetensors. One engine a
scheme from that checkpoint: `kiln build DIR --dtype bf16 --precision fast --target sm_90 [--quant S]`
(S: each of --schemes, default w4a16,w8a16; the embedding and the lm_head stay bf16; kv-int8 and kv-fp8:
bf16 weights and `--kv-dtype int8|fp8`, whose KV blocks at the same fraction are logged beside bf16's); `kiln bench
--json` of each: time to first token at --prompts, decode at batch 1 and the --batch sizes.

The floor of a batch-1 step: the bytes it must read — each layer's quantized matmuls' codes, scales and
zero points (or bf16 weights), its norms; the embedding row; the final norm and the bf16 head — over
the device-to-device copy rate measured in the same run (bytes read + written per second, best of 12
copies of 2 GiB). The bars (issue #13): w4a16 batch 1 within 1.2x of its floor and under llama.cpp's
Q4_0 on the same GPU (2.92 ms/token on the H200, 2026-11-29).

    python3 bench/quant_bench.py --kiln build-gpu/gpu/bin/kiln [--layers 32] [--schemes w4a16,w8a16]
                                 [--batch 8] [--prompts 512] [--out DIR] [--profile]
    python3 bench/quant_bench.py --kiln build-dev/cli/kiln --tiny    (2 layers, hidden 256, on the CPU:
                                                                      the script alone, no GPU)
Writes DIR/quant_bench.json and prints a table (bench/RESULTS.md's form).
"""
import argparse, json, os, shutil, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama8b_common import make_checkpoint  # noqa: E402
from moe_bench import copy_rate, log  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def step_bytes(cfg, layers, scheme, group=128):
    """Bytes a batch-1 decode step reads: the weights it needs (short context: no KV cache)."""
    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["hidden_size"] // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    mats = [(q + 2 * kv, h), (h, q), (2 * inter, h), (h, inter)]  # q,k,v; o; gate,up; down: [N, K]
    per_layer = 0.0
    for n, k in mats:
        if scheme == "bf16" or scheme.startswith("kv-"):  # kv-int8, kv-fp8: bf16 weights, a cache of codes
            per_layer += 2 * n * k
        elif scheme == "w4a16":  # u4 codes, an f16 scale and a u8 zero point a group of 128
            per_layer += n * k / 2 + n * (k // group) * 3
        elif scheme == "w8a16":  # i8 codes, an f16 scale a row
            per_layer += n * k + 2 * n
        elif scheme in ("fp8", "w8a8"):  # e4m3 or i8 codes, an f32 scale a row
            per_layer += n * k + 4 * n
        else:
            raise ValueError(scheme)
    norms = 2 * h * 2
    head = cfg["vocab_size"] * h * 2 + h * 2
    parts = {"matmuls": layers * per_layer, "norms": layers * norms, "embedding row": h * 2, "head": head}
    return sum(parts.values()), parts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--schemes", default="w4a16,w8a16")
    ap.add_argument("--batch", default="8")
    ap.add_argument("--prompts", default="512")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--out", default=".")
    ap.add_argument("--work", default=None, help="checkpoint and engines (default /dev/shm/quant_bench)")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--profile", action="store_true", help="also `kiln bench --profile` of each engine's batch-1 decode")
    a = ap.parse_args()
    import torch
    dev = "cuda" if torch.cuda.is_available() and not a.tiny else "cpu"
    cfg = json.load(open(os.path.join(HERE, "..", "tests", "data", "llama3-8b-config.json")))
    layers = a.layers
    if a.tiny:
        cfg = dict(cfg, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                   vocab_size=1024, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
        layers = 2
    work = a.work or ("/dev/shm/quant_bench" if os.path.isdir("/dev/shm") else "/tmp/quant_bench")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    ckpt = os.path.join(work, "ckpt")
    res = {"shape": "Llama-3-8B" if not a.tiny else "tiny", "layers": layers,
           "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu"}
    rate = copy_rate(torch, dev)
    res["copy_bytes_per_s"] = rate
    log(f"copy: {rate / 1e12:.2f} TB/s ({res['device']})")
    model, res["parameters"] = make_checkpoint(dict(cfg, num_hidden_layers=layers), ckpt, dev, 0, shard="4GB")
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()
    target = ["--target", "sm_90"] if dev == "cuda" else []
    schemes = ["bf16"] + [s for s in a.schemes.split(",") if s]
    engines, procs = {}, {}
    for s in schemes:  # the builds side by side (the quantization uses every core: they share them)
        engines[s] = os.path.join(work, f"{s}.engine")
        quant = [] if s == "bf16" else ["--kv-dtype", s[3:]] if s.startswith("kv-") else ["--quant", s]
        procs[s] = (time.time(), subprocess.Popen([a.kiln, "build", ckpt, "--dtype", "bf16", "--precision", "fast",
                                                   *quant, *target, "--max-tokens", "2048", "-o", engines[s]],
                                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    res["builds"] = {}
    for s, (t0, p) in procs.items():
        out, err = p.communicate()
        if p.returncode != 0:
            log(f"FAIL kiln build {s} (exit {p.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
            sys.exit(1)
        res["builds"][s] = {"s": time.time() - t0, "bytes": os.path.getsize(engines[s])}
        log(f"kiln build {s}: {time.time() - t0:.1f} s (side by side); {err.strip().splitlines()[-1] if err.strip() else ''}")
    shutil.rmtree(ckpt, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    res["schemes"] = {}
    rows = []
    for s in schemes:
        p = subprocess.run([a.kiln, "bench", engines[s], "--prompts", a.prompts, "--decode", str(a.decode),
                            "--batch", a.batch, "--reps", "3", "--warmup", "1", "--json"], capture_output=True, text=True)
        if p.returncode != 0:
            log(f"FAIL kiln bench {s} (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
            continue
        kb = json.loads(p.stdout.strip().splitlines()[-1])
        total, parts = step_bytes(cfg, layers, s)
        floor_ms = total / rate * 1e3
        res["schemes"][s] = {"kiln_bench": kb, "floor": {"bytes": total, "parts": parts, "ms": floor_ms}}
        b1 = kb["decode"]["ms_per_token_median"]
        batches = {b["batch"]: b["ms_per_step_median"] for b in kb.get("decode_batch") or [] if b.get("ran")}
        ttft = {pp["tokens"]: pp["ttft_ms_median"] for pp in kb.get("prefill") or [] if pp.get("ran")}
        rows.append((s, b1, floor_ms, batches, ttft))
        log(f"{s}: KV cache {kb.get('kv_blocks')} blocks of {kb.get('kv_block_size')} positions, "
            f"{(kb.get('kv_bytes') or 0) / 2**30:.2f} GiB (kiln bench's default fraction of the free memory)")
        if a.profile:
            p = subprocess.run([a.kiln, "bench", engines[s], "--prompts", "16", "--decode-prompt", "16", "--decode", "16",
                                "--reps", "1", "--warmup", "1", "--profile"], capture_output=True, text=True)
            open(os.path.join(a.out, f"quant_profile_{s}.txt"), "w").write(p.stdout + p.stderr)
            log(f"kiln bench --profile ({s}, batch 1): exit {p.returncode}, {a.out}/quant_profile_{s}.txt")
    bs = sorted({b for r in rows for b in r[3]})
    ps = sorted({t for r in rows for t in r[4]})
    head = (f"| {res['shape']} ({layers} layers), {res['device']} | decode b1 (ms) | floor (ms) | b1 / floor | "
            + " | ".join(f"b{b} (ms/step)" for b in bs) + (" | " if bs else "")
            + " | ".join(f"TTFT {t} (ms)" for t in ps) + (" |" if ps else ""))
    lines = [head, "|---" * (4 + len(bs) + len(ps)) + "|"]
    for s, b1, fl, batches, ttft in rows:
        lines.append(f"| {s} | {b1:.3f} | {fl:.3f} | {b1 / fl:.2f}x | "
                     + " | ".join(f"{batches[b]:.3f}" if b in batches else "" for b in bs) + (" | " if bs else "")
                     + " | ".join(f"{ttft[t]:.2f}" if t in ttft else "" for t in ps) + (" |" if ps else ""))
    base = next((r[4] for r in rows if r[0] == "bf16"), {})
    for s, _, _, _, ttft in rows:  # the bar of fp8 (issue #13): its prefill at 2048 tokens <= 0.6 x bf16's
        if s != "bf16" and base:
            lines.append(f"{s} time to first token / bf16's: "
                         + ", ".join(f"{t} tokens {ttft[t] / base[t]:.2f}" for t in ps if t in ttft and t in base))
    lines.append(f"\ncopy {rate / 1e12:.2f} TB/s; floors: the weights a step reads (w4a16: 0.5 B a weight, an f16 scale "
                 f"and a u8 zero a 128; w8a16: 1 B, an f16 scale a row; the head and embedding bf16)")
    res["table"] = "\n".join(lines)
    log(res["table"])
    json.dump(res, open(os.path.join(a.out, "quant_bench.json"), "w"), indent=1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
