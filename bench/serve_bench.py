#!/usr/bin/env python3
"""serve_bench.py — load on `kiln serve` (issue #14): latencies and throughput by concurrency, and a soak.

    python3 bench/serve_bench.py --url http://127.0.0.1:8000 [--concurrency 1,16,64,256] [--requests N]
        [--prompt-tokens 512] [--max-tokens 128] [--dist fixed|lognormal] [--out FILE.json]
    python3 bench/serve_bench.py --url ... --soak SECONDS --pid SERVER_PID [--concurrency 32]

Each client sends streamed /v1/completions (prompts as token ids, so their lengths are exact; greedy,
ignore_eos so that every request generates its max_tokens) one after another; at each concurrency it reports
P50/P99 time to first token (request sent to the first text chunk), inter-token latency (between chunks, each
chunk's gap divided by the tokens it carried — chunks carry one token or more), end-to-end latency, and
throughput (generated tokens a second over the level's wall time). --dist lognormal draws prompt and output
lengths from log-normal distributions with those medians (sigma 0.6, clipped to the context). The soak keeps
--concurrency clients busy for SECONDS while it samples the server's RSS (/proc/PID/status) and, where
nvidia-smi is, the device memory in use, every --sample seconds, and reports the growth between the first and
the last quarter of the samples after the first tenth (warm-up) (the issue's bar: < 1 %). Standard library only (asyncio streams).
"""
import argparse, asyncio, json, math, os, random, statistics, subprocess, sys, time
from urllib.parse import urlparse


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))]


async def http(url, method, path, body=None):
    u = urlparse(url)
    r, w = await asyncio.open_connection(u.hostname, u.port or 80)
    data = json.dumps(body).encode() if body is not None else b""
    w.write(f"{method} {path} HTTP/1.1\r\nHost: {u.hostname}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    await w.drain()
    return r, w


async def models(url):
    r, w = await http(url, "GET", "/v1/models")
    raw = await r.read()
    w.close()
    return json.loads(raw.split(b"\r\n\r\n", 1)[1].decode())["data"][0]


async def one(url, ids, max_tokens, out):
    t0 = time.perf_counter()
    r, w = await http(url, "POST", "/v1/completions", {"prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                                                       "ignore_eos": True, "stream": True})
    status = (await r.readline()).split()[1]
    while (await r.readline()) not in (b"\r\n", b""):
        pass
    t_first, last, gaps, tokens, buf = None, None, [], 0, b""
    while True:
        chunk = await r.read(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            line = ev.split(b"data: ", 1)[-1].strip()
            if not line.startswith(b"{") and not line.startswith(b"data"):
                # chunked transfer encoding: sizes between events
                line = line.split(b"\r\n")[-1]
            if line == b"[DONE]" or line.endswith(b"[DONE]"):
                break
            try:
                j = json.loads(line[line.index(b"{"):])
            except ValueError:
                continue
            now = time.perf_counter()
            c = j["choices"][0]
            if c.get("finish_reason"):
                tokens = j["usage"]["completion_tokens"]
                continue
            if t_first is None:
                t_first = now
            elif last is not None:
                gaps.append(now - last)
            last = now
    w.close()
    t1 = time.perf_counter()
    if status != b"200" or t_first is None:
        out["errors"] += 1
        return
    out["ttft"].append(t_first - t0)
    n_chunks = len(gaps) + 1
    per = max(1, tokens - 1) / max(1, n_chunks - 1) if n_chunks > 1 else 1
    out["itl"].extend(g / per for g in gaps)
    out["e2e"].append(t1 - t0)
    out["tokens"] += tokens


def lengths(a, rng, ctx):
    if a.dist == "fixed":
        return a.prompt_tokens, a.max_tokens
    p = int(min(ctx // 2, max(1, rng.lognormvariate(math.log(a.prompt_tokens), 0.6))))
    o = int(min(ctx - p - 1, max(1, rng.lognormvariate(math.log(a.max_tokens), 0.6))))
    return p, o


async def level(a, conc, n_requests, vocab, ctx, deadline=None):
    rng = random.Random(conc)
    out = {"ttft": [], "itl": [], "e2e": [], "tokens": 0, "errors": 0}
    left = [n_requests]

    async def client(k):
        crng = random.Random(1000 * conc + k)
        while (left[0] > 0) if deadline is None else (time.perf_counter() < deadline):
            left[0] -= 1
            p, o = lengths(a, crng, ctx)
            await one(a.url, [3 + crng.randrange(vocab - 3) for _ in range(p)], o, out)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(conc)))
    wall = time.perf_counter() - t0
    return {"concurrency": conc, "requests": len(out["e2e"]), "errors": out["errors"], "wall_s": wall,
            "tokens_per_s": out["tokens"] / wall,
            **{f"{k}_{q}_ms": pct(out[k], q) * 1e3 for k in ("ttft", "itl", "e2e") for q in (50, 99)}}


def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def device_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return float(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


async def soak(a, vocab, ctx):
    samples, deadline = [], time.perf_counter() + a.soak

    async def sampler():
        while time.perf_counter() < deadline:
            samples.append((time.perf_counter(), rss_kb(a.pid), device_mib()))
            await asyncio.sleep(a.sample)

    conc = int(a.concurrency.split(",")[0])
    res, _ = await asyncio.gather(level(a, conc, 0, vocab, ctx, deadline=deadline), sampler())
    # the first tenth is warm-up (threads and their buffers, the first batches): left out of the quarters
    kept = samples[max(1, len(samples) // 10):] or samples
    q = max(1, len(kept) // 4)
    first, last = kept[:q], kept[-q:]
    growth = lambda i: (statistics.mean(s[i] for s in last) / statistics.mean(s[i] for s in first) - 1) \
        if all(s[i] for s in kept) else None
    res.update(soak_s=a.soak, samples=len(samples), rss_growth=growth(1), device_growth=growth(2),
               series=[(round(t - samples[0][0], 2), rss, dev) for t, rss, dev in samples],
               rss_kb_first=first[0][1], rss_kb_last=last[-1][1])
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--concurrency", default="1,16,64,256")
    ap.add_argument("--requests", type=int, default=0, help="a level's requests (default 4 x its concurrency, >= 16)")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--dist", choices=("fixed", "lognormal"), default="fixed")
    ap.add_argument("--soak", type=float, default=0, help="seconds of soak instead of the levels")
    ap.add_argument("--pid", type=int, default=0, help="the server's pid (the soak samples its RSS)")
    ap.add_argument("--sample", type=float, default=5.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    m = asyncio.run(models(a.url))
    vocab, ctx = int(m.get("vocab_size", 32000)), int(m.get("max_model_len", 4096))
    results = {"model": m["id"], "args": vars(a), "levels": []}
    if a.soak:
        r = asyncio.run(soak(a, vocab, ctx))
        results["soak"] = r
        print(f"soak {a.soak:.0f} s at concurrency {r['concurrency']}: {r['requests']} requests, {r['errors']} errors, "
              f"RSS {r['rss_kb_first']} -> {r['rss_kb_last']} kB, growth first to last quarter "
              f"{r['rss_growth'] * 100 if r['rss_growth'] is not None else float('nan'):.2f} % (device "
              f"{r['device_growth'] * 100 if r['device_growth'] is not None else float('nan'):.2f} %)", flush=True)
    else:
        print("| concurrency | requests | tokens/s | TTFT P50 / P99 (ms) | ITL P50 / P99 (ms) | e2e P50 / P99 (ms) | errors |")
        print("|---:|---:|---:|---|---|---|---:|")
        for conc in [int(c) for c in a.concurrency.split(",")]:
            n = a.requests or max(16, 4 * conc)
            r = asyncio.run(level(a, conc, n, vocab, ctx))
            results["levels"].append(r)
            print(f"| {conc} | {r['requests']} | {r['tokens_per_s']:.1f} | {r['ttft_50_ms']:.1f} / {r['ttft_99_ms']:.1f} | "
                  f"{r['itl_50_ms']:.2f} / {r['itl_99_ms']:.2f} | {r['e2e_50_ms']:.0f} / {r['e2e_99_ms']:.0f} | "
                  f"{r['errors']} |", flush=True)
    if a.out:
        json.dump(results, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
