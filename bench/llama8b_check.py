#!/usr/bin/env python3
"""llama8b_check.py — kiln's CUDA engines of a Llama-3-8B-shaped model against Hugging Face.

Run on the GPU machine (bench/gpu_check.sh run calls it; torch and transformers are there):

    python3 bench/llama8b_check.py --kiln build-cuda-a/gpu/bin/kiln

1. A Llama-3-8B-shaped model (tests/data/llama3-8b-config.json) with random weights: every
   matrix N(0, 0.02), norm weights 1, made on the GPU in bf16 with a fixed seed, saved with
   save_pretrained as safetensors (bf16, 16 GB) — the checkpoint kiln builds from.
2. A 128-token prompt of random ids (fixed seed) through Hugging Face in float32 (TF32 off for
   matmuls and cuDNN) and in bf16: the prompt's logits, 32 greedy tokens, prefill and decode
   times.
3. kiln build CKPT --target sm_90 --dtype f32, and --dtype bf16; kiln run ENGINE --ids PROMPT -n 32
   --logits-out: the prompt's logits and the greedy tokens; a second run without --logits-out
   for the times (time to first token = the prompt's step; decode rate).
4. Reports (also as JSON in OUT/llama8b.json): kiln f32 vs HF f32 relative L2 over all prompt
   logits (target <= 1e-4) and whether the 32 greedy tokens agree; kiln bf16 vs HF f32 relative
   L2 against HF bf16 vs HF f32 (target: at most 1.5 times); times and their floors (decode:
   weight bytes / 4.2 TB/s).

Options shrink it for a smoke test on a machine without a GPU (--device cpu --target cpu and a
small --config).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import torch

from llama8b_common import log, make_checkpoint, rel_l2, run, work_dirs

HBM_BYTES_PER_S = 4.2e12  # H200 device-to-device copy rate (../shared/README.md: 4.23 TB/s)
FP32_FLOPS = 67e12        # H200 SXM fp32 CUDA-core peak (no tensor cores), for the prefill floor


def hf_run(model, ids, n_new, dev, label):
    """Prompt logits [P, vocab] (float32, host), greedy tokens, prefill s, decode s/token."""
    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()
    warm = 2  # decode steps left out of the time (first-use costs)
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)  # warm-up at the prompt's shape
        sync()
        t0 = time.time()
        out = model(input_ids=ids, use_cache=True)
        sync()
        prefill = time.time() - t0
        logits = out.logits[0].float().cpu().numpy()
        past = out.past_key_values
        tok = out.logits[0, -1].argmax()
        toks = [int(tok)]
        t1 = None
        for i in range(n_new - 1):
            if i == min(warm, n_new - 2):
                sync()
                t1, timed = time.time(), n_new - 1 - i
            o = model(input_ids=tok.view(1, 1), past_key_values=past, use_cache=True)
            past = o.past_key_values
            tok = o.logits[0, -1].argmax()
            toks.append(int(tok))
        sync()
        decode = (time.time() - t1) / timed if t1 is not None else 0.0
    log(f"HF {label}: prefill {prefill * 1e3:.1f} ms, decode {decode * 1e3:.2f} ms/token, tokens {toks}")
    return logits, toks, prefill, decode


def kiln_stats(stderr):
    m = re.search(r"time to first token ([0-9.]+) ms, ([0-9.]+) tokens/s", stderr)
    return (float(m.group(1)), float(m.group(2))) if m else (None, None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", required=True, help="the kiln binary")
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                      "llama3-8b-config.json"))
    ap.add_argument("--work", default=None,
                    help="checkpoint and logits, about 16 GB (default: /dev/shm/llama8b when it has room for "
                         "them and the engines, else /tmp/llama8b)")
    ap.add_argument("--engines", default=None,
                    help="where engines go, 32 GB at most (default: --work, or /dev/shm when it has room)")
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per kiln command")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    dev = a.device
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        log(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    import transformers
    log(f"transformers {transformers.__version__}")
    cfg = json.load(open(a.config))
    vocab = cfg["vocab_size"]
    a.work, engines = work_dirs(a.work, a.engines, ckpt_bytes=16e9, engine_bytes=36e9)
    ckpt = os.path.join(a.work, "ckpt")
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "config": os.path.basename(a.config),
           "prompt_tokens": a.prompt, "new_tokens": a.new, "seed": a.seed}

    # 1-2: the model, the checkpoint, Hugging Face's answers
    model, n_params = make_checkpoint(cfg, ckpt, dev, a.seed)
    res["parameters"] = n_params
    ids = torch.randint(0, vocab, (1, a.prompt), generator=torch.Generator().manual_seed(a.seed))
    ids_dev = ids.to(dev)
    ids_arg = ",".join(str(int(i)) for i in ids[0])
    hf_bf16, tok_bf16, pre_bf16, dec_bf16 = hf_run(model, ids_dev, a.new, dev, "bf16")
    model = model.float()
    hf_f32, tok_f32, pre_f32, dec_f32 = hf_run(model, ids_dev, a.new, dev, "f32")
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()
    res["hf"] = {"f32": {"prefill_ms": pre_f32 * 1e3, "decode_ms_per_token": dec_f32 * 1e3, "tokens": tok_f32},
                 "bf16": {"prefill_ms": pre_bf16 * 1e3, "decode_ms_per_token": dec_bf16 * 1e3, "tokens": tok_bf16,
                          "rel_l2_vs_f32": rel_l2(hf_bf16, hf_f32)}}
    log(f"HF bf16 vs HF f32: relative L2 {res['hf']['bf16']['rel_l2_vs_f32']:.3e}")

    # 3: kiln
    help_text = subprocess.run([a.kiln, "run", "--help"], capture_output=True, text=True).stdout
    run_extra = ["--kv-blocks", "64"] if "--kv-blocks" in help_text and a.target != "cpu" else []
    res["kiln"] = {}
    for dt in a.dtypes.split(","):
        eng = os.path.join(engines, f"{dt}.engine")
        need = (4 if dt == "f32" else 2) * n_params
        if shutil.disk_usage(engines).free < need * 1.02:
            log(f"FAIL kiln {dt}: {engines} has {shutil.disk_usage(engines).free / 1e9:.1f} GB free, the engine needs "
                f"{need / 1e9:.1f} GB")
            continue
        build = [a.kiln, "build", ckpt, "--dtype", dt, "-o", eng]
        if a.target != "cpu":
            build += ["--target", a.target]
        _, t_build = run(build, a.timeout, f"kiln build --dtype {dt}")
        size = os.path.getsize(eng)
        lf = os.path.join(a.work, f"kiln.{dt}.f32")
        p, t_run = run([a.kiln, "run", eng, "--ids", ids_arg, "-n", str(a.new), "--logits-out", lf] + run_extra,
                       a.timeout, f"kiln run ({dt})")
        toks = [int(t) for t in p.stdout.split()]
        logits = np.fromfile(lf, dtype=np.float32).reshape(a.prompt, vocab)
        p2, t_run2 = run([a.kiln, "run", eng, "--ids", ids_arg, "-n", str(a.new)] + run_extra, a.timeout,
                         f"kiln run ({dt}, timing)")
        ttft, rate = kiln_stats(p2.stderr)
        if "--profile" in help_text:
            # where the time goes: every kernel timed (no CUDA graphs), the table kiln prints
            p3, _ = run([a.kiln, "run", eng, "--ids", ids_arg, "-n", "16", "--profile"] + run_extra, a.timeout,
                        f"kiln run ({dt}, --profile)")
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, f"llama8b.{dt}.profile.txt"), "w") as f:
                f.write(p3.stderr)
            log(f"kiln {dt} --profile:\n" + "\n".join(p3.stderr.splitlines()[-40:]))
        info = [l for l in p2.stderr.splitlines() if l.startswith("kiln:")]
        r = {"build_s": t_build, "engine_bytes": size, "run_s": t_run2, "tokens": toks,
             "tokens_equal_hf_f32": toks == tok_f32, "rel_l2_vs_hf_f32": rel_l2(logits, hf_f32),
             "rel_l2_vs_hf_bf16": rel_l2(logits, hf_bf16), "ttft_ms": ttft, "decode_tokens_per_s": rate,
             "decode_ms_per_token": 1e3 / rate if rate else None, "stderr": info}
        first_diff = next((i for i, (x, y) in enumerate(zip(toks, tok_f32)) if x != y), None)
        r["first_token_differing_from_hf_f32"] = first_diff
        res["kiln"][dt] = r
        log(f"kiln {dt}: build {t_build:.1f} s ({size / 1e9:.2f} GB engine), run {t_run2:.1f} s; "
            f"vs HF f32 relative L2 {r['rel_l2_vs_hf_f32']:.3e}; greedy tokens equal HF f32: {r['tokens_equal_hf_f32']}"
            f" (first difference {first_diff}); {' | '.join(info)}")
        os.remove(eng)
        os.remove(lf)

    # 4: the verdicts and the floors
    weight_bytes = {"f32": 4 * n_params, "bf16": 2 * n_params}
    res["floors"] = {dt: {"decode_ms_per_token": weight_bytes[dt] / HBM_BYTES_PER_S * 1e3,
                          "prefill_ms": max(weight_bytes[dt] / HBM_BYTES_PER_S,
                                            2 * n_params * a.prompt / FP32_FLOPS) * 1e3}
                     for dt in weight_bytes}
    ok = True
    if "f32" in res["kiln"]:
        k = res["kiln"]["f32"]
        k["pass_rel_l2"] = k["rel_l2_vs_hf_f32"] <= 1e-4
        ok &= k["pass_rel_l2"]
        log(f"kiln f32 vs HF f32: relative L2 {k['rel_l2_vs_hf_f32']:.3e} (target <= 1e-4): "
            f"{'pass' if k['pass_rel_l2'] else 'FAIL'}; greedy 32 tokens equal: {k['tokens_equal_hf_f32']}")
    if "bf16" in res["kiln"]:
        k = res["kiln"]["bf16"]
        ratio = k["rel_l2_vs_hf_f32"] / res["hf"]["bf16"]["rel_l2_vs_f32"]
        k["ratio_to_hf_bf16"] = ratio
        k["pass_ratio"] = ratio <= 1.5
        ok &= k["pass_ratio"]
        log(f"kiln bf16 vs HF f32: relative L2 {k['rel_l2_vs_hf_f32']:.3e}; HF bf16 vs HF f32 "
            f"{res['hf']['bf16']['rel_l2_vs_f32']:.3e}; ratio {ratio:.2f} (target <= 1.5): "
            f"{'pass' if k['pass_ratio'] else 'FAIL'}")
    for dt, f in res["floors"].items():
        log(f"floors {dt}: decode {f['decode_ms_per_token']:.2f} ms/token (weights / 4.2 TB/s), prefill of "
            f"{a.prompt} tokens {f['prefill_ms']:.1f} ms (max of weights / 4.2 TB/s, FLOPs / 67 TFLOP/s fp32)")
    res["pass"] = bool(ok)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "llama8b.json"), "w") as f:
        json.dump(res, f, indent=1)
    shutil.rmtree(a.work, ignore_errors=True)
    if engines != a.work:
        shutil.rmtree(engines, ignore_errors=True)
    log("llama8b_check:", "pass" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
