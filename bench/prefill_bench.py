#!/usr/bin/env python3
"""prefill_bench.py — kiln against the GPU's ceilings and a compiled PyTorch peer, in one run.

On the GPU machine (bench/gpu_check.sh's "bench" stage runs it; torch and transformers are there):

    python3 bench/prefill_bench.py --kiln build-gpu/gpu/bin/kiln --out $OUT --budget 560

in one process, within --budget seconds (what does not fit is skipped, and the results say so):
1. ceilings: device-to-device copy bandwidth (bytes read + written per second); cuBLAS bf16 GEMM
   through torch.matmul on the prefill GEMMs of the model (QKV, out, gate/up, down, lm_head) at
   T = --lengths tokens, in TFLOP/s; torch SDPA (flash) causal attention at those lengths, GQA.
2. the Llama-3-8B-shaped model (tests/data/llama3-8b-config.json) with random bf16 weights
   (bench/llama8b_common.py), saved as safetensors; `kiln build` of it (bf16, --max-tokens the
   longest length) starts in the background.
3. the peer (bench/peer_llama.py, the gpt-fast design) on the same weights, checked against
   Hugging Face: in float32 (TF32 off) within 1e-4 relative L2 of Hugging Face float32's logits,
   and in bf16 within twice Hugging Face bf16's own distance from float32 (the last prompt
   position and one decode step); a wrong peer fails the run and is not timed.
4. kiln, once its build is done (`--stats`: its time and peak memory): `kiln bench ENGINE --json`
   (time to first token and decode, the same lengths; the longest in a second call, so that a
   slow one costs only itself), then its decode after --decode-at's contexts at batch 1 and its
   batches (kiln bench --batch).
5. the peer torch.compile'd (prefill: dynamic shapes, CUDA graphs per length; decode:
   mode="reduce-overhead"), checked again, and timed as kiln bench times kiln: time to first
   token (ids to the device, prefill, the argmax on the host) and decode ms/token at batch 1;
   its decode at --decode-at's contexts and batches (peer_decode_at, --no-peer-batches to skip);
   and the cold pairs at --cold's lengths (each side's prefill after 3 s idle, alternating: both
   at the GPU's idle clock, where the medians run at the power-capped one).
6. `kiln run --profile` of a prompt of 2048 tokens (or the longest below), saved beside the results,
   each kernel's TFLOP/s as a fraction of cuBLAS's best GEMM TFLOP/s at that length (--profile-ceiling).
7. the report (bench/prefill_report.py): one table with ratios (kiln / peer, kiln / ceiling) on stdout; OUT/prefill_bench.json
   (rewritten after every stage, so a run cut short leaves what it measured),
   OUT/prefill_bench.md (a dated section with the GPU's name and driver, for bench/RESULTS.md)
   and OUT/prefill_bench.png (when matplotlib is importable).

Here, without a GPU:

    python3 bench/prefill_bench.py --tiny [--kiln build/cli/kiln] [--compile]
        the same run on a tiny config on the CPU (the peer against Hugging Face float32; kiln's
        CPU engine when --kiln is given); torch.compile only with --compile (slow on a CPU)
    python3 bench/prefill_bench.py --chart prefill_bench.json [--out DIR]
        the chart and the markdown again from a run's JSON (the GPU machine may lack matplotlib)

The ceiling of a prefill is the time its GEMMs and attention take at cuBLAS's and SDPA's measured
speed (layers x (QKV + out + gate/up + down + attention)) plus lm_head on the last position (its
weights at the measured copy rate): nothing else of the step counted. Both kiln (draws only: its
head runs on the drawn rows) and the peer (prefill returns the last position's logits) compute the
logits the first token needs, not every position's. The decode floor is the weights' bytes over
the measured copy bandwidth. (The lm_head GEMM at T tokens is still measured and shown.)
"""
import argparse
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from prefill_report import gemm_shapes, kv_bytes_per_position, report  # noqa: E402
CONFIG_8B = os.path.join(HERE, "..", "tests", "data", "llama3-8b-config.json")
TINY_CONFIG = {  # a Llama small enough for the CPU: GQA, untied, no RoPE scaling
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": 64,
    "intermediate_size": 160, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
    "tie_word_embeddings": False, "vocab_size": 384, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
}
F32_LIMIT = 1e-4      # peer float32 vs Hugging Face float32, relative L2
BF16_FACTOR = 2.0     # peer bf16 vs HF f32 may be this many times HF bf16 vs HF f32
CHECK_PROMPT = 32     # tokens of the check's prompt (one decode step follows)


def log(*a):
    print(*a, flush=True)


# ---- the run: results, budget, stages ---------------------------------------------------------
class Run:
    """The results (res, written to OUT/prefill_bench.json after each stage) and the time budget."""

    def __init__(self, out, budget, res):
        self.out, self.deadline, self.res = out, time.time() + budget, res
        os.makedirs(out, exist_ok=True)

    def left(self):
        return self.deadline - time.time()

    def skip(self, what, why):
        self.res["skipped"].append(f"{what}: {why}")
        log(f"SKIP {what}: {why}")

    def save(self):
        path = os.path.join(self.out, "prefill_bench.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.res, f, indent=1)
        os.replace(path + ".tmp", path)

    def do(self, name, need_s, fn, *args):
        """fn(*args) as stage `name` when about need_s seconds are left; its result, or None when
        skipped or failed (the error is recorded, the run goes on)."""
        if self.left() < need_s:
            self.skip(name, f"{self.left():.0f} s of the budget left, it needs about {need_s} s")
            return None
        t0 = time.time()
        log(f"== {name} ({self.left():.0f} s of the budget left; {time.strftime('%H:%M:%S')} local time)")
        try:
            return fn(*args)
        except Exception as e:  # a stage's failure is a result: record it, go on with the others
            self.res["errors"].append(f"{name}: {type(e).__name__}: {e}")
            log(f"FAIL {name}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
            return None
        finally:
            self.res["stage_s"][name] = round(time.time() - t0, 1)
            self.save()


# ---- timing -------------------------------------------------------------------------------------
def timed(torch, fn, dev, reps=5, min_ms=2.0):
    """Median and min of fn's time in ms: on a GPU by CUDA events around groups of calls (enough
    calls a group for min_ms), on the CPU by the host clock."""
    fn()
    if dev != "cuda":
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts), min(ts)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    inner = max(1, min(1000, int(min_ms / max(a.elapsed_time(b), 1e-3))))
    ts = []
    for _ in range(reps):
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / inner)
    return statistics.median(ts), min(ts)


def sync(torch, dev):
    if dev == "cuda":
        torch.cuda.synchronize()


# ---- 1. ceilings ------------------------------------------------------------------------------
def ceilings(run, torch, cfg, lengths, dev):
    import torch.nn.functional as F
    c = run.res["ceilings"] = {"copy": None, "gemm": [], "sdpa": []}
    n = (2 << 30) if dev == "cuda" else (64 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    med, best = timed(torch, lambda: dst.copy_(src), dev, reps=10)
    c["copy"] = {"bytes": n, "ms_median": med, "tb_per_s": 2 * n / (best * 1e-3) / 1e12,
                 "tb_per_s_median": 2 * n / (med * 1e-3) / 1e12, "how": "bytes read + written per second, best of 10"}
    log(f"copy: {c['copy']['tb_per_s']:.2f} TB/s (best; median {c['copy']['tb_per_s_median']:.2f}) over {n >> 20} MiB")
    src = dst = None
    run.save()
    g = torch.Generator(device=dev).manual_seed(1)
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", cfg["hidden_size"] // H)
    for T in lengths:
        if run.left() < 20:
            run.skip(f"ceilings at T = {T}", "out of budget")
            continue
        for name, K, N, _ in gemm_shapes(cfg):
            x = torch.randn(T, K, dtype=torch.bfloat16, device=dev, generator=g)
            w = torch.randn(N, K, dtype=torch.bfloat16, device=dev, generator=g)
            med, best = timed(torch, lambda: torch.matmul(x, w.t()), dev)
            fl = 2.0 * T * K * N
            c["gemm"].append({"name": name, "t": T, "k": K, "n": N, "ms_median": med, "ms_min": best,
                              "tflops": fl / (best * 1e-3) / 1e12, "tflops_median": fl / (med * 1e-3) / 1e12})
            x = w = None
        q = torch.randn(1, H, T, hd, dtype=torch.bfloat16, device=dev, generator=g)
        k = torch.randn(1, KV, T, hd, dtype=torch.bfloat16, device=dev, generator=g)
        v = torch.randn(1, KV, T, hd, dtype=torch.bfloat16, device=dev, generator=g)
        med, best, how = sdpa_time(torch, F, q, k, v, dev)
        fl = 4.0 * H * hd * T * (T + 1) / 2  # QK^T and PV over the causal half
        c["sdpa"].append({"t": T, "ms_median": med, "ms_min": best, "tflops": fl / (best * 1e-3) / 1e12,
                          "backend": how})
        del q, k, v
        row = " ".join(f"{e['name']} {e['tflops']:.3g}" for e in c["gemm"] if e["t"] == T)
        log(f"T = {T}: GEMM TFLOP/s {row}; SDPA {best:.3f} ms ({how})")
        run.save()
    if dev == "cuda":
        torch.cuda.empty_cache()


def sdpa_time(torch, F, q, k, v, dev):
    """Causal GQA attention: flash (enable_gqa) when the build has it, else what SDPA picks with K
    and V repeated per query head beforehand (outside the timing)."""
    tries = []
    if dev == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        tries.append(("flash, enable_gqa", lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION), True))
    tries.append(("default, enable_gqa", None, True))
    tries.append(("default, K/V repeated", None, False))
    g = q.shape[1] // k.shape[1]
    for how, ctx, gqa in tries:
        try:
            if gqa:
                fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
            else:
                kr, vr = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
                fn = lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True)  # noqa: E731
            if ctx:
                with ctx():
                    med, best = timed(torch, fn, dev)
            else:
                med, best = timed(torch, fn, dev)
            return med, best, how
        except (RuntimeError, TypeError) as e:
            log(f"SDPA {how}: not available ({str(e).splitlines()[0][:200]})")
    raise RuntimeError("no SDPA backend ran")


# ---- 2. the model and kiln's build -------------------------------------------------------------
def start_kiln_build(run, a, ckpt, engine):
    cmd = [a.kiln, "build", ckpt, "--dtype", "bf16", "--max-tokens", str(a.max_tokens), "-o", engine, "--stats"]
    if a.target != "cpu":
        cmd += ["--target", a.target]
    cmd += a.kiln_build_args.split()
    run.res["kiln"]["build_command"] = " ".join(cmd)
    log("started: " + " ".join(cmd))
    f = open(os.path.join(run.out, "kiln_build.log"), "w")
    return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT), time.time(), f


def wait_kiln_build(run, build):
    proc, t0, f = build
    try:
        rc = proc.wait(timeout=max(1, run.left() - 30))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        f.close()
        raise RuntimeError("kiln build did not finish within the budget (killed)")
    f.close()
    text = open(f.name).read()
    run.res["kiln"]["build_s"] = round(time.time() - t0, 1)
    if rc != 0:
        raise RuntimeError(f"kiln build failed (exit {rc}): {text[-2000:]}")
    log(f"kiln build: done after {run.res['kiln']['build_s']} s: {text.strip().splitlines()[-1] if text.strip() else ''}")
    # --stats' "kiln: build: S s, peak memory N MiB" (issue #11: at most 1.5 GB for the 8B engine)
    m = re.search(r"^kiln: build: ([0-9.]+) s, peak memory ([0-9.]+) (KiB|MiB|GiB)$", text, re.M)
    if m:
        mib = float(m.group(2)) * {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[m.group(3)]
        run.res["kiln"]["build_peak_mib"] = round(mib, 1)
        log(f"kiln build: {m.group(1)} s, peak memory {mib:.0f} MiB")


# ---- 3. the peer ------------------------------------------------------------------------------
def hf_logits(torch, model, ids):
    """Logits [T, vocab] float32 on the host of Hugging Face's model for ids [1, T]."""
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits[0].float().cpu()


def peer_logits(torch, peer, ids, prefill=None, decode=None, mark=lambda: None):
    """The peer's logits (float32, host) at the prompt's last position (ids[:, :-1] prefilled) and
    for the decode step of ids[:, -1]."""
    prefill = prefill or peer.prefill
    decode = decode or peer.decode
    P = ids.shape[1] - 1
    with torch.no_grad():
        mark()  # inputs as the timing passes them (not views: a compiled function guards on that)
        a = prefill(ids[:, :P].clone())[0, -1].float().cpu()
        mark()
        b = decode(ids[0, P:].clone().view(1, 1), torch.tensor([P], device=ids.device))[0, -1].float().cpu()
    return a, b


def check_peer(run, torch, a, cfg, hf, dev, max_len, decode_len):
    """Build the peer from hf's weights and check it (see the top). Returns the peer in bf16 and the
    Hugging Face float32 reference logits [prompt's last, decode step], for the compiled check."""
    from llama8b_common import rel_l2
    from peer_llama import PeerLlama
    res = run.res["peer"]["check"] = {"prompt_tokens": CHECK_PROMPT, "f32_limit": F32_LIMIT,
                                       "bf16_factor": BF16_FACTOR}
    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(0, cfg["vocab_size"], (1, CHECK_PROMPT + 1), generator=g).to(dev)
    peer = PeerLlama(cfg, torch.bfloat16, dev, max_len, decode_len)
    peer.load_hf(hf)
    ref_bf16 = hf_logits(torch, hf, ids)[CHECK_PROMPT - 1:]
    pb = torch.stack(peer_logits(torch, peer, ids))
    if dev == "cuda":  # the float32 references without TF32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    hf.float()
    ref = hf_logits(torch, hf, ids)[CHECK_PROMPT - 1:]
    peer.float()
    pf = torch.stack(peer_logits(torch, peer, ids))
    peer.to(torch.bfloat16)
    res["hf_bf16_vs_hf_f32"] = [rel_l2(ref_bf16[i], ref[i]) for i in range(2)]
    res["peer_f32_vs_hf_f32"] = [rel_l2(pf[i], ref[i]) for i in range(2)]
    res["peer_bf16_vs_hf_f32"] = [rel_l2(pb[i], ref[i]) for i in range(2)]
    ok_f32 = max(res["peer_f32_vs_hf_f32"]) <= F32_LIMIT
    ok_bf16 = all(p <= BF16_FACTOR * h for p, h in zip(res["peer_bf16_vs_hf_f32"], res["hf_bf16_vs_hf_f32"]))
    res["pass"] = bool(ok_f32 and ok_bf16)
    fmt = lambda v: ", ".join(f"{x:.2e}" for x in v)  # noqa: E731
    log(f"peer check (relative L2 of the logits at the prompt's last position, decode step): peer f32 vs HF f32 "
        f"{fmt(res['peer_f32_vs_hf_f32'])} (limit {F32_LIMIT:g}); peer bf16 vs HF f32 {fmt(res['peer_bf16_vs_hf_f32'])}"
        f", HF bf16 vs HF f32 {fmt(res['hf_bf16_vs_hf_f32'])} (limit {BF16_FACTOR:g}x): "
        f"{'pass' if res['pass'] else 'FAIL'}")
    if not res["pass"]:
        raise RuntimeError("the peer does not compute what Hugging Face computes: it is not timed")
    return peer, ids, ref


def mark_step(torch):
    f = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    return f or (lambda: None)


def compile_peer(run, torch, a, peer, dev, ids, ref):
    """torch.compile the peer; the compiled prefill and decode checked against ref as the eager
    bf16 peer was. Returns (prefill, decode, mark)."""
    from llama8b_common import rel_l2
    p = run.res["peer"]
    mark = mark_step(torch)
    if not a.compile:
        p["mode"] = "eager (not compiled)"
        return peer.prefill, peer.decode, mark
    # gpt-fast's settings; the prefill's CUDA graphs (one per length) are what the peer of
    # ../shared/README.md used too
    import torch._inductor.config as ic
    ic.fx_graph_cache = True
    try:  # a recompile while timing costs the budget: the log says when one happens, and why
        torch._logging.set_logs(recompiles=True)
    except (AttributeError, TypeError):
        pass
    t0 = time.time()
    for mode in dict.fromkeys([a.peer_prefill_mode, "default"]):  # the asked mode, else no CUDA graphs for prefill
        p["mode"] = f"torch.compile: prefill dynamic=True mode={mode}, decode mode=reduce-overhead"
        try:
            prefill = torch.compile(peer.prefill, fullgraph=True, dynamic=True, mode=mode)
            decode = torch.compile(peer.decode, fullgraph=True, mode="reduce-overhead")
            pa = peer_logits(torch, peer, ids, prefill, decode, mark)  # compiles both
            break
        except Exception as e:  # noqa: BLE001 (inductor raises many kinds)
            p.setdefault("compile_errors", []).append(f"{p['mode']}: {type(e).__name__}: {str(e)[:500]}")
            log(f"FAIL compiling the peer ({p['mode']}): {type(e).__name__}: {str(e)[:2000]}")
            torch._dynamo.reset()
            if mode == "default" or run.left() < 150:
                raise
            log("trying again with the prefill compiled without CUDA graphs")
    p["compile_s"] = round(time.time() - t0, 1)
    for _ in range(2):  # cudagraph trees record on the second or third call
        pa = peer_logits(torch, peer, ids, prefill, decode, mark)
    chk = run.res["peer"]["check"]
    chk["compiled_bf16_vs_hf_f32"] = [rel_l2(pa[i], ref[i]) for i in range(2)]
    ok = all(x <= BF16_FACTOR * h for x, h in zip(chk["compiled_bf16_vs_hf_f32"], chk["hf_bf16_vs_hf_f32"]))
    chk["compiled_pass"] = ok
    log(f"peer compiled in {p['compile_s']} s; compiled bf16 vs HF f32: "
        f"{', '.join(f'{x:.2e}' for x in chk['compiled_bf16_vs_hf_f32'])}: {'pass' if ok else 'FAIL'}")
    if not ok:
        raise RuntimeError("the compiled peer does not compute what Hugging Face computes: it is not timed")
    return prefill, decode, mark


def peer_ttft_ms(torch, dev, prefill, mark, host):
    """One peer prefill timed as kiln bench times kiln's: ids to the device, prefill, the argmax on the host."""
    t0 = time.perf_counter()
    mark()
    ids = host.to(dev)
    with torch.no_grad():
        int(prefill(ids)[0, -1].argmax())
    return (time.perf_counter() - t0) * 1e3


def time_peer(run, torch, a, cfg, dev, prefill, decode, mark):
    """Time to first token at each length, then decode ms/token, as kiln bench measures them."""
    p = run.res["peer"]
    g = torch.Generator().manual_seed(a.seed + 2)
    for T in a.lengths:
        if T > cfg["max_position_embeddings"]:
            continue  # said once, for both
        if run.left() < 15 + T / 512:
            run.skip(f"peer prefill {T}", "out of budget")
            continue
        host = torch.randint(0, cfg["vocab_size"], (1, T), generator=g)
        ts = []
        for k in range(a.warmup + a.reps + (1 if a.compile else 0)):  # a first call at a new length records
            ts.append(peer_ttft_ms(torch, dev, prefill, mark, host))
        ts = ts[-a.reps:]
        p["prefill"].append({"tokens": T, "ttft_ms_median": statistics.median(ts), "ttft_ms_min": min(ts)})
        log(f"peer: time to first token, {T} tokens: {statistics.median(ts):.2f} ms (min {min(ts):.2f})")
        run.save()
    if a.decode <= 0:
        return
    host = torch.randint(0, cfg["vocab_size"], (1, a.decode_prompt), generator=g)
    ts = []
    for k in range(a.warmup + a.reps + 1):
        with torch.no_grad():
            mark()
            tok = prefill(host.to(dev))[0, -1].argmax().view(1, 1)
            pos = torch.tensor([a.decode_prompt], device=dev)
            sync(torch, dev)
            t0 = time.perf_counter()
            for _ in range(a.decode):  # gpt-fast's loop: the next id stays on the device
                mark()
                tok = decode(tok, pos)[0, -1].argmax().view(1, 1)
                pos += 1
            int(tok)
        ts.append((time.perf_counter() - t0) * 1e3 / a.decode)
    ts = ts[-a.reps:]
    p["decode"] = {"prompt_tokens": a.decode_prompt, "tokens": a.decode, "ms_per_token_median": statistics.median(ts),
                   "ms_per_token_min": min(ts)}
    log(f"peer: decode {statistics.median(ts):.3f} ms/token (min {min(ts):.3f}) after {a.decode_prompt} tokens")


def decode_at_steps(a):
    """Decode steps timed at each --decode-at point, kiln's and the peer's: --decode, at most 32."""
    return max(1, min(a.decode, 32))


def peer_decode_at(run, torch, a, cfg, dev, peer, mark):
    """The peer's decode at kiln's decode_at points (issue #11: batch 8 and 32 at a context of 512,
    128 at 4096): for each context C one more PeerLlama over the same weight tensors, with a cache of
    C + steps + 1 positions for the context's largest batch (its attention reads the C positions and
    the steps', as kiln's does: a cache sized for the longest context would have it read and mask
    4096 positions at a context of 512, 6.51 ms at batch 1 against its static decode's 4.57, #11 step
    1), its decode compiled once a context for all of its batches of 2 or more sequences
    (torch.compile, mode="reduce-overhead", the batch dimension marked dynamic: one compile, a CUDA
    graph a batch size; a compile takes 70-100 s of the 8B shape, one a batch size did not fit a
    device call), every sequence at the context's position. Batch 1 is not compiled again: the
    static decode's own figure (time_peer; its cache of a few hundred positions read whole, a few µs
    short of C's) stands for it, marked "static". The cache rows before it are random (what the step
    reads and computes does not depend on their values; the batch-1 peer was checked against Hugging
    Face). res["peer"]["decode_at"], as kiln's."""
    from peer_llama import PeerLlama
    steps = decode_at_steps(a)
    g = torch.Generator(device=dev).manual_seed(a.seed + 4)
    out = []
    static = (run.res["peer"].get("decode") or {}).get("ms_per_token_median")
    for C, batches in a.decode_at:
        if run.left() < 40:
            run.skip(f"peer decode at {C}", "out of budget")
            continue
        multi = sorted(b for b in batches if b > 1)
        rows = []
        if static:
            rows.append({"batch": 1, "ms_per_step_median": static, "ms_per_step_min": static,
                         "tokens_per_s": 1e3 / static, "note": "static"})
        if not multi:
            out.append({"context": C, "steps": steps, "rows": rows})
            continue
        length = C + steps + 1
        # the cache a batch needs (K and V of every layer, bf16) against the GPU's free memory, less a tenth for
        # the step's activations and logits: a batch that does not fit is skipped, not run out of memory
        per_seq = kv_bytes_per_position(cfg) * length
        free = torch.cuda.mem_get_info()[0] if dev == "cuda" else float("inf")
        for B in [b for b in multi if b * per_seq > 0.9 * free]:
            run.skip(f"peer decode at {C}, batch {B}", f"its cache of {B * per_seq / 1e9:.1f} GB does not fit in "
                     f"0.9 of the {free / 1e9:.1f} GB free on the GPU")
            multi.remove(B)
        if not multi:
            out.append({"context": C, "steps": steps, "rows": rows})
            continue
        big_b = multi[-1]
        pb = PeerLlama(cfg, torch.bfloat16, dev, length, length, batch=big_b)
        pb.share_weights(peer)
        with torch.no_grad():
            for l in pb.layers:
                for buf in (l.k_cache, l.v_cache):
                    buf.normal_(0.0, 0.5, generator=g)
        decode = torch.compile(pb.decode, fullgraph=True, mode="reduce-overhead") if a.compile else pb.decode
        for B in multi:
            if run.left() < 20:
                run.skip(f"peer decode at {C}, batch {B}", "out of budget")
                continue
            ts = []
            for k in range(2 + a.reps):  # a compile (the first batch size), a CUDA graph's recording, then timed
                with torch.no_grad():
                    tok = torch.randint(0, cfg["vocab_size"], (B, 1), generator=g, device=dev)
                    pos = torch.tensor([C], device=dev)
                    sync(torch, dev)
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        mark()
                        if a.compile:
                            torch._dynamo.mark_dynamic(tok, 0, min=2, max=big_b)
                        tok = decode(tok, pos)[:, -1].argmax(-1).view(B, 1)
                        pos += 1
                    tok.sum().item()
                ts.append((time.perf_counter() - t0) * 1e3 / steps)
            ts = ts[-a.reps:]
            rows.append({"batch": B, "ms_per_step_median": statistics.median(ts), "ms_per_step_min": min(ts),
                         "tokens_per_s": B * 1e3 / statistics.median(ts)})
            log(f"peer: decode after {C} tokens, batch {B}: {rows[-1]['ms_per_step_median']:.3f} ms/step "
                f"({run.left():.0f} s of the budget left)")
        out.append({"context": C, "steps": steps, "rows": rows})
        log(f"peer: decode after {C} tokens: " + ", ".join(
            f"batch {e['batch']} {e['ms_per_step_median']:.3f} ms/step ({e['tokens_per_s']:.0f} tokens/s)"
            + (" [static decode]" if e.get("note") else "") for e in rows))
        run.res["peer"]["decode_at"] = out
        run.save()
        del pb, decode
        torch.cuda.empty_cache()


# ---- 4. kiln ----------------------------------------------------------------------------------
def kiln_bench(run, a, engine, lengths, decode, into="prefill", extra=()):
    """kiln bench --json; its times to first token into res["kiln"][into], its decode into "decode" (with
    into's suffix past "prefill": into "prefill_no_overlap" puts it in "decode_no_overlap")."""
    cmd = [a.kiln, "bench", engine, "--prompts", ",".join(map(str, lengths)), "--decode", str(decode),
           "--decode-prompt", str(a.decode_prompt), "--reps", str(a.reps), "--warmup", str(a.warmup), "--json",
           *extra]
    if decode > 0 and getattr(a, "batch", None) and into == "prefill":  # the batched decode rides with the decode
        cmd += ["--batch", ",".join(map(str, a.batch))]
    log("run: " + " ".join(cmd))
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1, run.left() - 20))
    wall = time.time() - t0
    if p.returncode != 0:
        raise RuntimeError(f"kiln bench failed (exit {p.returncode}): {p.stderr[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    k = run.res["kiln"]
    k["bench"].append({"command": " ".join(cmd), "wall_s": round(wall, 1), "result": r})
    for e in r["prefill"]:
        if e["ran"]:
            k.setdefault(into, []).append({"tokens": e["tokens"], "ttft_ms_median": e["ttft_ms_median"],
                                 "ttft_ms_min": e["ttft_ms_min"], "steps": e["steps"], "note": e["note"]})
            log(f"kiln: time to first token{'' if into == 'prefill' else ' (' + into + ')'}, {e['tokens']} "
                f"tokens: {e['ttft_ms_median']:.2f} ms "
                f"(min {e['ttft_ms_min']:.2f}; {e['steps']} step(s))")
        else:
            run.skip(f"kiln prefill {e['tokens']}", e["note"])
    if r["decode"]:
        k["decode" + into[len("prefill"):]] = r["decode"]
        log(f"kiln: decode{'' if into == 'prefill' else ' (' + into + ')'} {r['decode']['ms_per_token_median']:.3f} "
            f"ms/token (min {r['decode']['ms_per_token_min']:.3f})")
    for b in r.get("decode_batch") or []:
        if not b.get("ran", True):  # its sequences outgrow the KV cache on this GPU: kiln bench's note says so
            run.skip(f"kiln decode at batch {b['batch']}", b["note"])
            continue
        k.setdefault("decode_batch", []).append(b)
        log(f"kiln: decode at batch {b['batch']}: {b['ms_per_step_median']:.3f} ms/step, {b['tokens_per_s']:.0f} tokens/s")
    c = r.get("cold_start")
    if c and "cold_start" not in k:  # the first bench's: the engine file to its first token
        k["cold_start"] = c
        log(f"kiln: cold start {c['total_s']:.2f} s: the engine file read and checked in {c['open_s']:.2f} s "
            f"({c['read_gb_per_s']:.2f} GB/s), the session (weights uploaded) {c['session_s']:.2f} s, the first "
            f"{c['prompt_tokens']}-token prompt's first token {c['first_token_ms']:.1f} ms")
    k["device"] = r["device"]
    log(f"kiln bench: {wall:.1f} s in all (opening the engine included)")


def kiln_decode_at(run, a, engine, context, batches):
    """kiln bench's decode after `context` prompt tokens, at batch 1 and at each of batches (sequences
    of that context each; a.decode steps, at most 32; one warm-up and one timed run: a batch of 128
    prompts of 4096 tokens takes ~15 s to prefill): res["kiln"]["decode_at"] gets one entry."""
    steps = decode_at_steps(a)
    cmd = [a.kiln, "bench", engine, "--prompts", "1", "--decode", str(steps), "--decode-prompt", str(context),
           "--reps", "1", "--warmup", "1", "--json"]
    if batches:
        cmd += ["--batch", ",".join(map(str, batches))]
    log("run: " + " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1, run.left() - 10))
    if p.returncode != 0:
        raise RuntimeError(f"kiln bench failed (exit {p.returncode}): {p.stderr[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    rows = [{"batch": 1, "ms_per_step_median": r["decode"]["ms_per_token_median"],
             "tokens_per_s": r["decode"]["tokens_per_s"]}]
    for b in r.get("decode_batch") or []:
        if b.get("ran", True):
            rows.append({"batch": b["batch"], "ms_per_step_median": b["ms_per_step_median"],
                         "tokens_per_s": b["tokens_per_s"]})
        else:  # its sequences outgrow the KV cache on this GPU
            run.skip(f"kiln decode after {context} tokens, batch {b['batch']}", b["note"])
    run.res["kiln"].setdefault("decode_at", []).append({"context": context, "steps": steps, "rows": rows})
    log(f"kiln: decode after {context} tokens: " + ", ".join(
        f"batch {e['batch']} {e['ms_per_step_median']:.3f} ms/step ({e['tokens_per_s']:.0f} tokens/s)" for e in rows))
    run.save()


def kiln_cold_prefill(run, a, engine, T, reps):
    """kiln bench --prompts T --warmup 0 --reps reps: its prefill entry (ttft_ms_first is the
    process's first prefill)."""
    cmd = [a.kiln, "bench", engine, "--prompts", str(T), "--decode", "0", "--reps", str(reps), "--warmup", "0",
           "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1, run.left() - 10))
    if p.returncode != 0:
        raise RuntimeError(f"kiln bench failed (exit {p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])["prefill"][0]


def kiln_first_runs(run, a, engine, T, vocab):
    """kiln bench --prompts T --warmup 0 --reps 6 (its first run is the process's first prefill) and
    `kiln run` of the profile's prompt without --profile: res["kiln"]["first_runs"]."""
    e = kiln_cold_prefill(run, a, engine, T, 6)
    ids = ",".join(str((i * 7919 + 13) % vocab) for i in range(T))
    q = subprocess.run([a.kiln, "run", engine, "--ids", ids, "-n", "2"], capture_output=True, text=True,
                       timeout=max(1, run.left() - 10))
    m = re.search(r"time to first token ([0-9.]+) ms", q.stderr)
    r = {"tokens": T, "bench_first_ms": e["ttft_ms_first"], "bench_median_ms": e["ttft_ms_median"],
         "bench_min_ms": e["ttft_ms_min"], "bench_max_ms": e["ttft_ms_max"],
         "run_ttft_ms": float(m.group(1)) if m else None}
    run.res["kiln"]["first_runs"] = r
    log(f"kiln first prefills, {T} tokens: kiln bench (no warm-up, 6 runs) first {r['bench_first_ms']:.2f} ms, "
        f"median {r['bench_median_ms']:.2f}, min {r['bench_min_ms']:.2f}, max {r['bench_max_ms']:.2f}; "
        f"kiln run (no --profile) {r['run_ttft_ms']} ms")


def cold_pairs(run, torch, a, dev, engine, prefill, mark, lengths, rounds=3, rest_s=3.0):
    """Each side's prefill at the GPU's full clock: the H200 holds ~1980 MHz when idle and drops to
    ~1650 under sustained tensor-core work (its power cap, bench/RESULTS.md #10 step 10), so the
    medians above compare the two at the capped clock. Here, after rest_s seconds idle each, one
    peer prefill and one kiln prefill (kiln bench --warmup 0 --reps 1: the process's first)
    alternate, `rounds` times a length: res["cold"]."""
    g = torch.Generator().manual_seed(a.seed + 3)
    out = []
    for T in lengths:
        host = torch.randint(0, 1000, (1, T), generator=g)
        pk, kk = [], []
        for _ in range(rounds):
            if run.left() < 20:
                break
            time.sleep(rest_s)
            pk.append(peer_ttft_ms(torch, dev, prefill, mark, host))
            time.sleep(rest_s)
            kk.append(kiln_cold_prefill(run, a, engine, T, 1)["ttft_ms_first"])
        if pk and kk:
            e = {"tokens": T, "peer_ms": pk, "kiln_ms": kk, "peer_median_ms": statistics.median(pk),
                 "kiln_median_ms": statistics.median(kk)}
            out.append(e)
            log(f"cold prefills (after {rest_s:.0f} s idle each), {T} tokens: peer "
                f"{', '.join(f'{t:.2f}' for t in pk)} ms; kiln {', '.join(f'{t:.2f}' for t in kk)} ms; kiln / peer "
                f"{e['kiln_median_ms'] / e['peer_median_ms']:.3f}")
    run.res["cold"] = out
    run.save()


def kiln_profile(run, a, engine, T, vocab):
    ids = ",".join(str((i * 7919 + 13) % vocab) for i in range(T))
    cmd = [a.kiln, "run", engine, "--ids", ids, "-n", "2", "--profile"]
    # each kernel's TFLOP/s as a fraction of cuBLAS's best GEMM at T (or at any length measured)
    gemm = (run.res.get("ceilings") or {}).get("gemm") or []
    best = [e["tflops"] for e in gemm if e["t"] == T] or [e["tflops"] for e in gemm]
    if best and max(best) >= 0.001:  # kiln's least (a CPU's tiny GEMMs may fall below)
        cmd += ["--profile-ceiling", f"{max(best):.4g}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1, run.left() - 10))
    path = os.path.join(run.out, f"kiln_profile_{T}.txt")
    with open(path, "w") as f:
        f.write(p.stderr)
    run.res["kiln"]["profile"] = {"tokens": T, "file": os.path.basename(path), "exit": p.returncode}
    log(f"kiln run --profile ({T}-token prompt, exit {p.returncode}):\n" + "\n".join(p.stderr.splitlines()[-40:]))


# ---- the whole run -----------------------------------------------------------------------------
def gpu_info(torch, dev):
    import transformers
    info = {"name": "cpu", "driver": "-", "torch": torch.__version__, "cuda": torch.version.cuda or "-",
            "transformers": transformers.__version__}
    if dev == "cuda":
        info["name"] = torch.cuda.get_device_name(0)
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            info["driver"] = "unknown (no nvidia-smi)"
    return info


def new_results(a, cfg, config_name, gpu):
    """The results of a run, empty: what the stages fill, what report() reads (the JSON's schema;
    kiln's entries are kiln bench --json's, runtime/bench.h)."""
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv),
            "config_name": config_name, "config": cfg, "seed": a.seed, "budget_s": a.budget, "lengths": a.lengths,
            "reps": a.reps, "warmup": a.warmup, "gpu": gpu, "stage_s": {}, "skipped": [], "errors": [],
            "ceilings": None, "peer": {"prefill": [], "decode": None},
            "kiln": {"prefill": [], "decode": None, "decode_batch": [], "bench": []}}


def bench(a):
    import torch
    dev = a.device
    if dev == "cuda" and not torch.cuda.is_available():
        log("FAIL: no GPU here (torch.cuda.is_available() is False): use --tiny --device cpu")
        return 1
    cfg = TINY_CONFIG if a.tiny else json.load(open(a.config))
    res = new_results(a, cfg, "tiny (built in)" if a.tiny else os.path.basename(a.config), gpu_info(torch, dev))
    run = Run(a.out, a.budget, res)
    log(f"device: {res['gpu']}; budget {a.budget} s; lengths {a.lengths}")
    run.save()
    torch.manual_seed(a.seed)

    run.do("ceilings", 30 if dev == "cuda" else 5, ceilings, run, torch, cfg, a.lengths, dev)

    # the model: Hugging Face's, saved for kiln
    from llama8b_common import make_checkpoint, work_dirs
    n_bytes = 2.0 * (8.1e9 if not a.tiny else 1e6)
    work, engines = work_dirs(a.work, None, ckpt_bytes=n_bytes, engine_bytes=n_bytes * 1.1,
                              name="prefill_bench" + ("_tiny" if a.tiny else ""))
    ckpt, engine = os.path.join(work, "ckpt"), os.path.join(engines, "bf16.engine")
    made = run.do("model", 60 if dev == "cuda" else 5, make_checkpoint, cfg, ckpt, dev, a.seed)
    if made is None:
        report(res, a.out)
        return 1
    hf, n_params = made
    made = None
    res["parameters"] = n_params
    res["weight_bytes"] = 2 * n_params
    build = run.do("kiln build (start)", 30, start_kiln_build, run, a, ckpt, engine) if a.kiln else None
    if not a.kiln:
        run.skip("kiln", "no --kiln binary given")

    # the peer: checked, compiled, timed
    # gpt-fast: the cache holds the prompt and the new tokens, to a multiple of 8 (and the check's step)
    decode_len = -(-max(a.decode_prompt + a.decode + 1, CHECK_PROMPT + 1) // 8) * 8
    max_len = max([T for T in a.lengths if T <= cfg["max_position_embeddings"]] + [decode_len, CHECK_PROMPT + 1])
    checked = run.do("peer check", 30 if dev == "cuda" else 5, check_peer, run, torch, a, cfg, hf, dev, max_len,
                     decode_len)
    del hf
    gc.collect()
    if dev == "cuda":
        torch.cuda.empty_cache()

    # kiln first (the product: its numbers are in before the peer's compile spends the budget),
    # with the build's threads done and the GPU idle; the peer's weights wait in memory
    fits = [T for T in a.lengths if T <= cfg["max_position_embeddings"]]
    for T in a.lengths:
        if T not in fits:
            run.skip(f"prefill {T}", f"longer than the model's context ({cfg['max_position_embeddings']})")
    if build:
        run.do("kiln build (wait)", 10, wait_kiln_build, run, build)
    have_engine = build is not None and os.path.exists(engine) and "build_s" in res["kiln"]
    if have_engine:
        res["kiln"]["engine_bytes"] = os.path.getsize(engine)
        first = fits[:-1] if len(fits) > 1 else fits  # the longest alone: a slow one costs only itself
        run.do("kiln bench", 40, kiln_bench, run, a, engine, first, a.decode)
        if len(fits) > 1:
            run.do(f"kiln bench {fits[-1]}", 40, kiln_bench, run, a, engine, fits[-1:], 0)
    # decode after long prompts, at batch 1 and larger batches (issue #11's contexts of 512 and 4096), kiln's
    # before the peer's compile too (the peer's, peer_decode_at, after its timing)
    for C, batches in a.decode_at if have_engine else []:
        if C + decode_at_steps(a) > cfg["max_position_embeddings"]:
            run.skip(f"kiln decode after {C} tokens", "past the model's context")
            continue
        need = 15 + 2 * max(batches + [1]) * C / 30000  # two prefills of the batch's prompts at ~30k tokens/s
        run.do(f"kiln decode after {C} tokens", need, kiln_decode_at, run, a, engine, C, batches)

    compiled = None
    if checked:
        peer, ids, ref = checked
        compiled = run.do("peer compile", 150 if a.compile and dev == "cuda" else 10, compile_peer, run, torch, a,
                          peer, dev, ids, ref)
    if compiled:
        run.do("peer timing", 20, time_peer, run, torch, a, cfg, dev, *compiled)
        if a.decode_at and a.peer_batches:
            run.do("peer decode at contexts", 150 if dev == "cuda" else 10, peer_decode_at, run, torch, a, cfg, dev,
                   peer, compiled[2])
        cold = [T for T in fits if T in a.cold]
        if have_engine and dev == "cuda" and cold:
            run.do("cold prefills", 20 + 12 * len(cold), cold_pairs, run, torch, a, dev, engine, compiled[0],
                   compiled[2], cold)
    peer_timed = compiled is not None
    checked = compiled = peer = ids = ref = None  # the GPU's memory back for kiln's profile
    gc.collect()
    if dev == "cuda":
        torch._dynamo.reset()
        try:
            from torch._inductor.cudagraph_trees import reset_cudagraph_trees
            reset_cudagraph_trees()
        except ImportError:
            pass
        gc.collect()
        torch.cuda.empty_cache()

    done = sorted(e["tokens"] for e in res["kiln"]["prefill"])
    if have_engine and done and peer_timed:
        # kiln's prefill measured again after the peer, with the peer's memory given back: the state
        # in which `kiln run --profile` runs (step 6 measured the profile 5 ms under the first bench at
        # 2048 tokens: is it the GPU's state?)
        again = [T for T in done if T in (512, 2048)] or done[:1]
        run.do("kiln bench again", 20, kiln_bench, run, a, engine, again, 0, "prefill_after_peer")
        # and each kernel started only once the one before has ended (--no-kernel-overlap: no
        # programmatic dependent launch), prefill and decode: what the overlap gains
        run.do("kiln bench, no kernel overlap", 30, kiln_bench, run, a, engine, again, a.decode,
               "prefill_no_overlap", ("--no-kernel-overlap",))
    if have_engine and done and a.profile:
        T = max(t for t in done if t <= 2048) if any(t <= 2048 for t in done) else done[0]
        run.do("kiln run --profile", 45, kiln_profile, run, a, engine, T, cfg["vocab_size"])
        # the first prefills of a process against the bench's median (the profile's one prefill ran
        # ~3.4 ms under kiln bench's at 2048 tokens, 2026-12-02): kiln bench with no warm-up, and
        # kiln run without --profile
        run.do("kiln first prefills", 30, kiln_first_runs, run, a, engine, T, cfg["vocab_size"])
    shutil.rmtree(work, ignore_errors=True)
    if engines != work:
        shutil.rmtree(engines, ignore_errors=True)
    run.save()
    report(res, a.out)
    chk = res["peer"].get("check") or {}
    ok = not res["errors"] and chk.get("pass", False) and chk.get("compiled_pass", True)
    log("prefill_bench:", "done" if ok else "FAIL (see the errors above)")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--kiln", help="the kiln binary (without it kiln is skipped)")
    ap.add_argument("--config", default=CONFIG_8B, help="the model's config.json (default: Llama-3-8B's shape)")
    ap.add_argument("--tiny", action="store_true", help="a tiny built-in config, on the CPU unless --device cuda")
    ap.add_argument("--device", default=None, help="cuda (default) or cpu (default with --tiny)")
    ap.add_argument("--target", default=None, help="kiln build --target (default sm_90 on cuda, cpu on the CPU)")
    ap.add_argument("--lengths", default=None, help="prompt lengths (default 128,512,2048,8192; --tiny 16,64,200)")
    ap.add_argument("--decode", type=int, default=None, help="decode steps timed (default 128; --tiny 8)")
    ap.add_argument("--decode-prompt", type=int, default=16, help="tokens before them (default 16)")
    ap.add_argument("--batch", default="8,32",
                    help="kiln's batched decode, batch sizes (kiln bench --batch; default 8,32; '' for none)")
    ap.add_argument("--decode-at", default="512:8,32/4096:128",
                    help="kiln's decode after longer prompts: CONTEXT:BATCH,BATCH/... (batch 1 always; default "
                         "512:8,32/4096:128, issue #11's; --tiny 32:2; '' for none)")
    ap.add_argument("--reps", type=int, default=3, help="timed runs of each measurement (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="kiln build --max-tokens (default: the longest length, so each prompt is one step)")
    ap.add_argument("--kiln-build-args", default="", help="more kiln build arguments, e.g. '--precision exact'")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="torch.compile the peer (default: on cuda yes, on the CPU no)")
    ap.add_argument("--peer-prefill-mode", default="reduce-overhead",
                    help="torch.compile mode of the peer's prefill (default reduce-overhead: CUDA graphs per length)")
    ap.add_argument("--cold", default="2048",
                    help="lengths of the cold pairs (each side's prefill after 3 s idle; default 2048; '' for none)")
    ap.add_argument("--peer-batches", action=argparse.BooleanOptionalAction, default=True,
                    help="time the peer's decode at --decode-at's contexts and batches too (default on)")
    ap.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                    help="kiln run --profile of one prompt at the end (default on)")
    ap.add_argument("--budget", type=float, default=560, help="seconds for the whole run (default 560)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=None, help="where the checkpoint and engine go (default /dev/shm or /tmp)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="where the results go (default $OUT or .)")
    ap.add_argument("--chart", metavar="RESULTS_JSON",
                    help="only draw the chart and write the markdown from a run's prefill_bench.json")
    a = ap.parse_args()
    if a.chart:
        try:
            res = json.load(open(a.chart))
            res["kiln"], res["peer"], res["lengths"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--chart: {a.chart} is not a prefill_bench.json ({type(e).__name__}: {e})")
        os.makedirs(a.out, exist_ok=True)
        report(res, a.out)
        return 0
    a.device = a.device or ("cpu" if a.tiny else "cuda")
    a.target = a.target or ("sm_90" if a.device == "cuda" else "cpu")
    a.decode = a.decode if a.decode is not None else (8 if a.tiny else 128)
    try:
        a.lengths = [int(x) for x in (a.lengths or ("16,64,200" if a.tiny else "128,512,2048,8192")).split(",")]
    except ValueError:
        ap.error(f"--lengths: '{a.lengths}' is not a comma-separated list of integers")
    try:
        a.batch = [int(x) for x in a.batch.split(",")] if a.batch else []
        if a.tiny and a.decode_at == "512:8,32/4096:128":
            a.decode_at = "32:2"
        a.cold = [int(x) for x in a.cold.split(",") if x]
        a.decode_at = [(int(c), [int(b) for b in bs.split(",") if b]) for c, bs in
                       (e.split(":") if ":" in e else (e, "") for e in a.decode_at.split("/") if e)]
    except ValueError:
        ap.error("--batch and --cold take comma-separated lists of integers, --decode-at CONTEXT:BATCH,BATCH/...")
    if any(T < 1 for T in a.lengths) or a.reps < 1 or a.warmup < 0 or a.decode < 0 or a.decode_prompt < 1:
        ap.error("--lengths, --reps and --decode-prompt take integers from 1, --warmup and --decode from 0")
    a.max_tokens = a.max_tokens or max(a.lengths)
    a.compile = a.compile if a.compile is not None else a.device == "cuda"
    if a.kiln and not os.access(a.kiln, os.X_OK):
        ap.error(f"--kiln: {a.kiln} is not an executable")
    return bench(a)


if __name__ == "__main__":
    sys.exit(main())
