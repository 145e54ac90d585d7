"""llama8b_common.py — what the GPU scripts share: the random-weight Llama checkpoint, where its
files go, running kiln, comparing logits.

bench/llama8b_check.py (kiln against Hugging Face) and bench/prefill_bench.py (kiln against the
ceilings and a compiled PyTorch peer) import it; it is not run by itself.
"""
import os
import shutil
import subprocess
import time

import numpy as np
import torch


def log(*a):
    print(*a, flush=True)


def rel_l2(a, b):
    """|a - b| / |b| over all elements, in float64 (numpy arrays or tensors)."""
    if isinstance(a, torch.Tensor):
        a = a.detach().float().cpu().numpy()
    if isinstance(b, torch.Tensor):
        b = b.detach().float().cpu().numpy()
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def make_checkpoint(cfg, ckpt, dev, seed, arch=("LlamaConfig", "LlamaForCausalLM"), shard=None):
    """The model (transformers' arch: config and model class names) in bf16 on dev, weights drawn with a
    fixed seed (every matrix N(0, 0.02), norm weights 1), saved to ckpt with save_pretrained (bf16
    safetensors, shards of at most `shard`, e.g. "4GB"). Returns (model, parameters)."""
    import transformers
    config_cls, model_cls = getattr(transformers, arch[0]), getattr(transformers, arch[1])
    config = config_cls(**cfg)
    t0 = time.time()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev):
        model = model_cls(config)
    torch.set_default_dtype(torch.float32)
    gen = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.dim() >= 2:
                p.normal_(0.0, 0.02, generator=gen)
            else:
                p.fill_(1.0)
    if dev == "cuda":
        torch.cuda.synchronize()
    t1 = time.time()
    model.save_pretrained(ckpt, safe_serialization=True, **({"max_shard_size": shard} if shard else {}))
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e9:.3f} B parameters, made in {t1 - t0:.1f} s, saved (bf16) in {time.time() - t1:.1f} s")
    return model.eval(), n_params


def work_dirs(work, engines, ckpt_bytes, engine_bytes, name="llama8b"):
    """Folders for the checkpoint (work, emptied) and the engines: given ones, else /dev/shm when
    it has room for both (tmpfs: fast to write and read back), else /tmp, with the engines in
    /dev/shm when only they fit there. Returns (work, engines)."""
    shm_free = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
    if work is None:
        work = f"/dev/shm/{name}" if shm_free > ckpt_bytes + engine_bytes else f"/tmp/{name}"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if engines is None:
        engines = work
        if not work.startswith("/dev/shm") and shm_free > engine_bytes:
            engines = f"/dev/shm/{name}-engines"
    os.makedirs(engines, exist_ok=True)
    log(f"checkpoint in {work}, engines in {engines} (/dev/shm free: {shm_free / 1e9:.0f} GB, "
        f"{work}: {shutil.disk_usage(work).free / 1e9:.0f} GB, {engines}: {shutil.disk_usage(engines).free / 1e9:.0f} GB)")
    return work, engines


def run(cmd, timeout, what):
    """Run cmd; its CompletedProcess and seconds. A failure is logged and raised (RuntimeError)."""
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    dt = time.time() - t0
    if p.returncode != 0:
        log(f"FAIL {what} (exit {p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
        raise RuntimeError(what)
    return p, dt
