#!/usr/bin/env python3
"""serve_gpu.py — `kiln serve` of an 8B-shaped engine under load (issue #14's H200 figures), one device call.

    python3 bench/serve_gpu.py --kiln build-gpu/gpu/bin/kiln [--layers 32] [--levels 1,16,64,256]
        [--prompt-tokens 512] [--max-tokens 128] [--soak SECONDS] [--out DIR]
    python3 bench/serve_gpu.py --kiln build-dev/cli/kiln --engine ts.engine ...   (an engine at hand: no
                                                                                 checkpoint, no GPU needed)

Makes the Llama-3-8B-shaped checkpoint (random bf16, bench/llama8b_common.py) and its engine (`kiln build
--dtype bf16 --precision fast --target sm_90`), starts `kiln serve` (--max-batch 256), and runs
bench/serve_bench.py at each concurrency of --levels (streamed requests of --prompt-tokens random ids and
--max-tokens new tokens, greedy, ignore_eos): throughput, P50/P99 time to first token, inter-token latency and
end-to-end latency; with --soak, then keeps --levels' last concurrency busy that long while it samples the
server's RSS and the device memory (RSS and device growth from the first to the last quarter: the issue's bar
< 1 %). Writes DIR/serve_gpu.json and prints the table (bench/RESULTS.md's form). The peer's batched decode rate
to hold it against is bench/prefill_bench.py's (`--decode` batches).
"""
import argparse, json, os, re, shutil, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))


def log(*a):
    print(*a, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--engine", default=None, help="serve this engine instead of building the 8B shape")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--levels", default="1,16,64,256")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--soak", type=float, default=0)
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = "/dev/shm/serve_gpu" if os.path.isdir("/dev/shm") else "/tmp/serve_gpu"
    engine = a.engine
    res = {"levels_args": vars(a)}
    if not engine:
        import torch
        sys.path.insert(0, HERE)
        from llama8b_common import make_checkpoint
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        cfg = json.load(open(os.path.join(HERE, "..", "tests", "data", "llama3-8b-config.json")))
        model, res["parameters"] = make_checkpoint(dict(cfg, num_hidden_layers=a.layers), os.path.join(work, "ckpt"),
                                                   "cuda", 0, shard="4GB")
        del model
        torch.cuda.empty_cache()
        res["device"] = torch.cuda.get_device_name()
        engine = os.path.join(work, "bf16.engine")
        t0 = time.time()
        p = subprocess.run([a.kiln, "build", os.path.join(work, "ckpt"), "--dtype", "bf16", "--precision", "fast",
                            "--target", "sm_90", "--max-tokens", "2048", "-o", engine], capture_output=True, text=True)
        if p.returncode:
            log(f"FAIL kiln build (exit {p.returncode}): {p.stderr[-3000:]}")
            sys.exit(1)
        log(f"kiln build: {time.time() - t0:.1f} s")
        shutil.rmtree(os.path.join(work, "ckpt"), ignore_errors=True)
    srv = subprocess.Popen([a.kiln, "serve", engine, "--port", "0", "--max-batch", str(a.max_batch), "--max-queue",
                            "100000"], stderr=subprocess.PIPE, text=True)
    try:
        line = srv.stderr.readline()
        while line and "listening" not in line:
            log("serve: " + line.rstrip())
            line = srv.stderr.readline()
        m = re.search(r"http://([\d.]+):(\d+)", line or "")
        if not m:
            log("FAIL kiln serve did not start: " + (line or "") + srv.stderr.read()[-3000:])
            sys.exit(1)
        url = f"http://{m.group(1)}:{m.group(2)}"
        bench = [sys.executable, os.path.join(HERE, "serve_bench.py"), "--url", url, "--prompt-tokens",
                 str(a.prompt_tokens), "--max-tokens", str(a.max_tokens)]
        levels_json = os.path.join(a.out, "serve_levels.json")
        p = subprocess.run(bench + ["--concurrency", a.levels, "--out", levels_json], text=True, capture_output=True)
        log(p.stdout + p.stderr[-2000:])
        res["levels"] = json.load(open(levels_json))["levels"] if os.path.exists(levels_json) else None
        if a.soak:
            soak_json = os.path.join(a.out, "serve_soak.json")
            p = subprocess.run(bench + ["--concurrency", a.levels.split(",")[-1], "--soak", str(a.soak), "--pid",
                                        str(srv.pid), "--sample", "5", "--out", soak_json], text=True, capture_output=True)
            log(p.stdout + p.stderr[-2000:])
            res["soak"] = json.load(open(soak_json)).get("soak") if os.path.exists(soak_json) else None
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.kill()
        shutil.rmtree(work, ignore_errors=True)
    json.dump(res, open(os.path.join(a.out, "serve_gpu.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
