#!/usr/bin/env python3
"""bench_script.py — bench/prefill_bench.py's reader of `kiln bench --json` and its report (prefill_report.py),
against the real kiln on a CPU engine, without torch or a GPU: the JSON's field names have one
owner (runtime/bench.c), and this fails when the script stops reading them. Times are not
checked (tests assert no speed), only what lands where.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import prefill_bench as pb  # noqa: E402
import prefill_report as pr  # noqa: E402

passed = failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name}" + (f": {detail}" if detail else ""))


def main():
    kiln, shared = os.environ["KILN_BIN"], os.environ["KILN_SHARED"]
    model = os.path.join(shared, "models", "tinystories-656k")
    cfg = json.load(open(os.path.join(model, "config.json")))
    with tempfile.TemporaryDirectory() as work:
        eng = os.path.join(work, "ts.engine")
        subprocess.run([kiln, "build", model, "--max-tokens", "64", "-o", eng], check=True, capture_output=True)
        a = argparse.Namespace(kiln=kiln, decode_prompt=4, reps=2, warmup=0, seed=0, budget=60,
                               lengths=[8, 100, 1000], batch=[2], decode=3)
        res = pb.new_results(a, cfg, "tinystories-656k", {"name": "cpu", "driver": "-", "torch": "-", "cuda": "-",
                                                           "transformers": "-"})
        run = pb.Run(work, 60, res)
        run.do("kiln bench", 1, pb.kiln_bench, run, a, eng, [8, 100], 3)  # as the script's stages call it
        run.do("kiln bench 1000", 1, pb.kiln_bench, run, a, eng, [1000], 0)
        run.do("kiln decode after 16 tokens", 1, pb.kiln_decode_at, run, a, eng, 16, [2])
        check("no errors", res["errors"] == [], str(res["errors"]))
        k = res["kiln"]
        check("kiln prefill read", [(e["tokens"], e["steps"]) for e in k["prefill"]] == [(8, 1), (100, 2)],
              str(k["prefill"]))
        check("times are numbers", all(isinstance(e["ttft_ms_median"], float) and e["ttft_ms_min"] > 0
                                       for e in k["prefill"]), str(k["prefill"]))
        check("the several-step note kept", "prefilled in 2 steps of at most 64 tokens" in (k["prefill"][1]["note"] or ""),
              str(k["prefill"]))
        check("kiln decode read", k["decode"] and k["decode"]["tokens"] == 3 and k["decode"]["prompt_tokens"] == 4
              and k["decode"]["ms_per_token_median"] > 0, str(k["decode"]))
        check("kiln batched decode read", [(b["batch"], b["steps"]) for b in k["decode_batch"]] == [(2, 3)]
              and k["decode_batch"][0]["ms_per_step_median"] > 0, str(k["decode_batch"]))
        check("the skipped length said", res["skipped"] == ["kiln prefill 1000: skipped: longer than the context of "
                                                            "512 positions"], str(res["skipped"]))
        check("device", k["device"] == "cpu", k.get("device"))
        check("two calls kept", len(k["bench"]) == 2 and k["bench"][0]["result"]["kiln_bench"] == 1)
        check("decode after a longer prompt read", [(e["context"], e["steps"], [r["batch"] for r in e["rows"]])
                                                    for e in k.get("decode_at", [])] == [(16, 3, [1, 2])]
              and all(r["ms_per_step_median"] > 0 for r in k["decode_at"][0]["rows"]), str(k.get("decode_at")))
        # a batch whose sequences outgrow the KV cache (kiln bench's "ran": false, on a GPU too small for it):
        # skipped with kiln's note, the other batch read (kiln through a wrapper that gives it 9 blocks of 16)
        small = os.path.join(work, "kiln-small-cache")
        with open(small, "w") as f:
            f.write(f'#!/bin/sh\nexec "{kiln}" "$@" --kv-blocks 9\n')
        os.chmod(small, 0o755)
        a2 = argparse.Namespace(**{**vars(a), "kiln": small})
        run.do("kiln decode after 30 tokens", 1, pb.kiln_decode_at, run, a2, eng, 30, [5, 2])
        e = k.get("decode_at", [])[-1]
        check("a batch over the cache skipped", (e["context"], [r["batch"] for r in e["rows"]]) == (30, [1, 2])
              and res["skipped"][-1] == "kiln decode after 30 tokens, batch 5: skipped: 5 sequences of 33 positions "
              "need 15 KV-cache blocks of 16 (240.0 KiB); the session's cache holds 9 (144.0 KiB)",
              str(e) + str(res["skipped"]))
        res["skipped"].pop()
        k["decode_at"].pop()
        run.save()
        check("the cold start read", k.get("cold_start", {}).get("prompt_tokens") == 8, str(k.get("cold_start")))
        saved = json.load(open(os.path.join(work, "prefill_bench.json")))
        check("the results file is what was measured", saved["kiln"]["prefill"] == k["prefill"])

        # the report without ceilings or a peer: dashes where nothing was measured
        table = pr.render_table(res)
        rows = [l for l in table.splitlines() if l.startswith(("time to first token", "decode, batch"))]
        got = [re.sub(r"[0-9]+\.[0-9]+", "N", " ".join(l.split())) for l in rows]
        want = ["time to first token, 8 tokens (ms) N - - - -", "time to first token, 100 tokens (ms) N - - - -",
                "time to first token, 1000 tokens (ms) - - - - -", "decode, batch 1 (ms/token) N - - - -",
                "decode, batch 2 (ms/step) N - - - -"]
        check("table rows", got == want, "\n".join(got))
        md = pr.render_markdown(res)
        check("markdown heading", md.startswith("## kiln against the ceilings and a compiled PyTorch peer "
                                                "(bench/prefill_bench.py) — "), md[:200])
        check("markdown table", "| time to first token, 100 tokens (ms) | " in md and "| decode, batch 1 (ms/token) | "
              in md, md)
        check("markdown notes", "100 tokens prefilled in 2 steps" in md and "Skipped: kiln prefill 1000" in md, md)
        check("markdown: decode after longer prompts", "| 16 | 1 | " in md and "| 16 | 2 | " in md, md)

        # --chart: the same report from the JSON, in another folder (no matplotlib needed)
        out = os.path.join(work, "chart")
        p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "prefill_bench.py"), "--chart",
                            os.path.join(work, "prefill_bench.json"), "--out", out], capture_output=True, text=True)
        check("--chart runs", p.returncode == 0, p.stderr[-2000:])
        check("--chart writes the markdown", os.path.exists(os.path.join(out, "prefill_bench.md"))
              and open(os.path.join(out, "prefill_bench.md")).read() == md)
        p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "prefill_bench.py"), "--chart",
                            os.path.join(work, "ts.engine")], capture_output=True, text=True)
        check("--chart refuses what is not a results file", p.returncode == 2 and "is not a prefill_bench.json"
              in p.stderr, p.stderr[-500:])
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
