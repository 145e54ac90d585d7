#!/usr/bin/env python3
"""moe_bench.py — kiln's decode of a Qwen3-30B-A3B-shaped mixture of experts against its bytes floor
(issue #12, item 4), on the GPU machine.

The shape: hidden 2048, 32 q heads and 4 kv heads of 128, 128 experts of width 768 with 8 active a
token (normalized top-k), vocabulary 151936, untied head; LAYERS (default 24 of the real 48, so
that the bf16 checkpoint, ~31 GB, and the engine fit the device machine's memory and disk). Random
bf16 weights (N(0, 0.02), norms 1) made on the GPU by transformers' Qwen3MoeForCausalLM and saved as
safetensors; `kiln build DIR --dtype bf16 --precision fast --target sm_90`; `kiln bench --json`
decodes at batch 1 and the --batch sizes (default 32) after a short prompt.

The floor of a batch-1 step: the bytes it must read — each layer's attention weights (q, k, v, o),
its router, its 8 active experts' gate, up and down rows, its norms; the embedding row; the final
norm and the head — over the device-to-device copy rate measured in the same run (bytes read +
written per second, best of 10 copies of 2 GiB). The bar (issue #12): batch 1 within 1.5x of it.

    python3 bench/moe_bench.py --kiln build-gpu/gpu/bin/kiln [--layers 24] [--batch 32] [--out DIR] [--profile]
    python3 bench/moe_bench.py --kiln ... --tiny      (2 layers, 8 experts, hidden 256: the script alone,
                                                      on a machine without a GPU: the CPU engine)
Writes DIR/moe_bench.json and prints a table (bench/RESULTS.md's form).
"""
import argparse, json, os, shutil, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama8b_common import make_checkpoint  # noqa: E402

QWEN3_30B_A3B = dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                     num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, intermediate_size=6144,
                     vocab_size=151936, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                     rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=4096,
                     tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645)
TINY = dict(QWEN3_30B_A3B, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=96, vocab_size=1024, bos_token_id=1,
            eos_token_id=2)


def log(*a):
    print(*a, flush=True)


def step_bytes(cfg, layers, wbytes=2):
    """Bytes a batch-1 decode step reads: the weights it needs, nothing of the KV cache (short context)."""
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    attn = (h * (q + 2 * kv) + q * h) * wbytes + 2 * hd * wbytes  # q, k, v, o; q_norm, k_norm
    router = cfg["num_experts"] * h * wbytes
    active = cfg["num_experts_per_tok"] * 3 * cfg["moe_intermediate_size"] * h * wbytes
    norms = 2 * h * wbytes
    head = cfg["vocab_size"] * h * wbytes + h * wbytes
    parts = {"attention": layers * attn, "routers": layers * router, "active experts": layers * active,
             "norms": layers * norms, "embedding row": h * wbytes, "head": head}
    return sum(parts.values()), parts


def copy_rate(torch, dev):
    n = (2 << 30) if dev == "cuda" else (64 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(12):
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        if dev == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * n / best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--batch", default="32")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--out", default=".")
    ap.add_argument("--work", default=None, help="checkpoint and engine folder (default /dev/shm/moe_bench)")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="also `kiln bench --profile` of batch 1 and 32 decodes: OUT/moe_profile_b1.txt, _b32.txt")
    a = ap.parse_args()
    import torch
    dev = "cuda" if torch.cuda.is_available() and not a.tiny else "cpu"
    cfg, layers = (TINY, 2) if a.tiny else (QWEN3_30B_A3B, a.layers)
    work = a.work or ("/dev/shm/moe_bench" if os.path.isdir("/dev/shm") else "/tmp/moe_bench")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    ckpt, engine = os.path.join(work, "ckpt"), os.path.join(work, "moe.engine")
    res = {"shape": "Qwen3-30B-A3B" if not a.tiny else "tiny", "layers": layers, "config": cfg,
           "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu"}
    rate = copy_rate(torch, dev)
    res["copy_bytes_per_s"] = rate
    log(f"copy: {rate / 1e12:.2f} TB/s ({res['device']})")
    model, res["parameters"] = make_checkpoint(dict(cfg, num_hidden_layers=layers), ckpt, dev, 0,
                                               ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"), "4GB")
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()
    target = ["--target", "sm_90"] if dev == "cuda" else []
    t0 = time.time()
    p = subprocess.run([a.kiln, "build", ckpt, "--dtype", "bf16", "--precision", "fast", "--stats", *target,
                        "-o", engine], capture_output=True, text=True)
    if p.returncode != 0:
        log(f"FAIL kiln build (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
        sys.exit(1)
    res["build_s"] = time.time() - t0
    log(f"kiln build: {res['build_s']:.1f} s; {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''}")
    shutil.rmtree(ckpt, ignore_errors=True)  # room for the engine's upload
    p = subprocess.run([a.kiln, "bench", engine, "--prompts", "16", "--decode", str(a.decode), "--batch", a.batch,
                        "--reps", "3", "--warmup", "1", "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        log(f"FAIL kiln bench (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
        sys.exit(1)
    kb = json.loads(p.stdout.strip().splitlines()[-1])
    res["kiln_bench"] = kb
    os.makedirs(a.out, exist_ok=True)
    if a.profile:  # each kernel's time (no graphs): where a step's time goes
        for b in ("1", a.batch.split(",")[-1]):
            p = subprocess.run([a.kiln, "bench", engine, "--prompts", "16", "--decode-prompt", "16", "--decode", "16",
                                *(["--batch", b] if b != "1" else []), "--reps", "1", "--warmup", "1", "--profile"],
                               capture_output=True, text=True)
            open(os.path.join(a.out, f"moe_profile_b{b}.txt"), "w").write(p.stdout + p.stderr)
            log(f"kiln bench --profile (batch {b}): exit {p.returncode}, {a.out}/moe_profile_b{b}.txt")
    total, parts = step_bytes(cfg, layers)
    floor_ms = total / rate * 1e3
    res["floor"] = {"bytes": total, "parts": parts, "ms": floor_ms}
    b1 = kb["decode"]["ms_per_token_median"]
    rows = [("decode, batch 1 (ms/token)", b1, floor_ms)]
    for b in kb.get("decode_batch") or []:
        if b.get("ran"):
            rows.append((f"decode, batch {b['batch']} (ms/step)", b["ms_per_step_median"], None))
    lines = [f"| {res['shape']} ({layers} layers), bf16 fast, {res['device']} | kiln | floor | kiln / floor |",
             "|---|---:|---:|---:|"]
    for what, ms, fl in rows:
        lines.append(f"| {what} | {ms:.3f} | {fl:.3f} | {ms / fl:.2f}x |" if fl else f"| {what} | {ms:.3f} | | |")
    lines.append(f"\nfloor: {total / 1e9:.3f} GB a token (" + ", ".join(
        f"{k} {v / 1e9:.3f}" for k, v in parts.items()) + f" GB) at {rate / 1e12:.2f} TB/s; the bar: 1.5x")
    res["table"] = "\n".join(lines)
    log(res["table"])
    os.makedirs(a.out, exist_ok=True)
    json.dump(res, open(os.path.join(a.out, "moe_bench.json"), "w"), indent=1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
