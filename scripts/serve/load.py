#!/usr/bin/env python3
"""Load test of an OpenAI-compatible server (turbospark serve, or llama.cpp's
llama-server for comparison): C concurrent streaming clients, each sending R
chat requests one after another, greedy, with stream_options.include_usage.

First every distinct prompt is asked by a single client (the reference
answers and the single-client speed), then all clients run at once; every
concurrent answer must equal its single-client answer (with exact numerics
the server's batching must not change a token).

Reports: total generated tok/s (all completion tokens over the wall time of
the concurrent phase), the single client's tok/s and the ratio, p50/p99 time
to first token, and the median per-stream decode tok/s (tokens after the
first over the time after the first). No dependencies beyond Python 3.

Usage: load.py BASE_URL [--clients 16] [--requests 4] [--max-tokens 64]
                        [--model NAME] [--key KEY] [--json]
"""

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

PROMPTS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write one sentence about the sea.",
    "What is 12 times 12?",
    "Give me a synonym for happy.",
    "Why is the sky blue? Answer briefly.",
    "List two planets.",
    "Say hello in Spanish.",
]


def stream_chat(base, model, key, prompt, max_tokens):
    """One streaming request: (text, completion_tokens, ttft_s, total_s)."""
    u = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    text, ttft, tokens, chunks = [], None, None, 0
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        v = json.loads(data)
        if v.get("usage"):
            tokens = v["usage"]["completion_tokens"]
        for c in v.get("choices") or []:
            piece = (c.get("delta") or {}).get("content")
            if piece:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                chunks += 1
                text.append(piece)
    total = time.perf_counter() - t0
    conn.close()
    return "".join(text), tokens if tokens is not None else chunks, ttft or total, total


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--model", default=None)
    ap.add_argument("--key", default=None)
    ap.add_argument("--label", default="server")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    # Single client: reference answers and speed.
    ref, single_tok, single_s = {}, 0, 0.0
    for p in PROMPTS:
        text, n, _, total = stream_chat(a.base, a.model, a.key, p, a.max_tokens)
        ref[p] = text
        single_tok += n
        single_s += total
    single_rate = single_tok / single_s

    results, errors = [], []
    lock = threading.Lock()

    def client(i):
        for r in range(a.requests):
            p = PROMPTS[(i + r) % len(PROMPTS)]
            try:
                out = stream_chat(a.base, a.model, a.key, p, a.max_tokens)
            except Exception as e:  # noqa: BLE001 - reported, not hidden
                with lock:
                    errors.append(f"client {i} request {r}: {e}")
                continue
            with lock:
                results.append((p,) + out)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    mixed = [(p, t) for p, t, *_ in results if t != ref[p]]
    total_tok = sum(n for _, _, n, _, _ in results)
    ttfts = [ttft for *_, ttft, _ in results]
    rates = [(n - 1) / (tot - ttft) for _, _, n, ttft, tot in results if n > 1 and tot > ttft]
    report = {
        "label": a.label,
        "clients": a.clients,
        "requests": a.requests,
        "completed": len(results),
        "errors": len(errors),
        "mismatched": len(mixed),
        "total_tok_per_s": total_tok / wall,
        "single_client_tok_per_s": single_rate,
        "ratio_vs_single": total_tok / wall / single_rate,
        "ttft_p50_s": pct(ttfts, 50) if ttfts else None,
        "ttft_p99_s": pct(ttfts, 99) if ttfts else None,
        "stream_decode_tok_per_s_median": statistics.median(rates) if rates else None,
        "wall_s": wall,
    }
    if a.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:32} {v:.3f}" if isinstance(v, float) else f"{k:32} {v}")
    for e in errors[:5]:
        print("error:", e, file=sys.stderr)
    for p, t in mixed[:5]:
        print(f"mismatch for {p!r}: {t!r} != {ref[p]!r}", file=sys.stderr)
    sys.exit(1 if errors or mixed else 0)


if __name__ == "__main__":
    main()
