#!/usr/bin/env python3
"""End-to-end check of a running gateway (scripts/gpu-check.sh starts it on the GPU): chat
completions (plain and streamed), completions, and concurrent streams, each response checked
for the OpenAI shape. Standard library only. Exit status 0 when every check passed.

    python3 scripts/gpu_http_check.py --base-url http://127.0.0.1:8765 --model M [--streams 32]
        [--expect-device cuda]   (the model card's device must start with it; `cpu` to try the
                                  script against a CPU deployment)
"""

import argparse
import json
import sys
import threading
import time
import urllib.request

FAILURES = []


def fail(what):
    FAILURES.append(what)
    print(f"FAIL {what}", flush=True)


def post(base, path, body, stream=False, timeout=300):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    resp = urllib.request.urlopen(req, timeout=timeout)
    if not stream:
        return resp.status, json.loads(resp.read())
    events = []
    for raw in resp:
        line = raw.decode().strip()
        if line.startswith("data: "):
            events.append(line[len("data: "):])
    return resp.status, events


def check_usage(what, usage, completion_max):
    if not isinstance(usage, dict):
        return fail(f"{what}: no usage")
    p, c, t = usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens")
    if not (isinstance(p, int) and p > 0 and isinstance(c, int) and 0 < c <= completion_max
            and t == p + c):
        fail(f"{what}: usage {usage}")


def chat(base, model, max_tokens):
    what = "chat"
    status, r = post(base, "/v1/chat/completions", {
        "model": model, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": "Name a colour."}]})
    if status != 200 or r.get("object") != "chat.completion":
        return fail(f"{what}: {status} {r}")
    ch = r["choices"][0]
    if ch["message"]["role"] != "assistant" or not isinstance(ch["message"]["content"], str):
        fail(f"{what}: message {ch['message']}")
    if ch["finish_reason"] not in ("stop", "length"):
        fail(f"{what}: finish_reason {ch['finish_reason']}")
    check_usage(what, r.get("usage"), max_tokens)
    return r


def chat_stream(base, model, max_tokens, seed=None, tag="chat stream"):
    body = {"model": model, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"Tell a story #{seed}."}]}
    if seed is not None:
        body.update(temperature=0.8, top_p=0.95, seed=seed)
    status, events = post(base, "/v1/chat/completions", body, stream=True)
    if status != 200 or not events or events[-1] != "[DONE]":
        return fail(f"{tag}: {status}, last event {events[-1:] if events else None}")
    chunks = [json.loads(e) for e in events[:-1]]
    text, finish, usage = "", None, None
    for c in chunks:
        if c.get("object") != "chat.completion.chunk":
            return fail(f"{tag}: chunk object {c.get('object')}")
        for ch in c.get("choices", []):
            text += ch.get("delta", {}).get("content") or ""
            finish = ch.get("finish_reason") or finish
        usage = c.get("usage") or usage
    if finish not in ("stop", "length"):
        fail(f"{tag}: finish_reason {finish}")
    check_usage(tag, usage, max_tokens)
    return text, usage


def completions(base, model, max_tokens):
    what = "completions"
    status, r = post(base, "/v1/completions", {
        "model": model, "prompt": "The capital of France is", "max_tokens": max_tokens,
        "temperature": 0, "logprobs": 3})
    if status != 200 or r.get("object") != "text_completion":
        return fail(f"{what}: {status} {r}")
    ch = r["choices"][0]
    if not isinstance(ch.get("text"), str) or ch.get("finish_reason") not in ("stop", "length"):
        fail(f"{what}: choice {ch}")
    lp = ch.get("logprobs") or {}
    if len(lp.get("tokens", [])) != r["usage"]["completion_tokens"]:
        fail(f"{what}: {len(lp.get('tokens', []))} logprob entries")
    if any(len(t) > 3 or not t for t in lp.get("top_logprobs", [])):
        fail(f"{what}: top_logprobs {lp.get('top_logprobs')}")
    check_usage(what, r.get("usage"), max_tokens)


def concurrent(base, model, n, max_tokens):
    results = [None] * n

    def one(i):
        try:
            results[i] = chat_stream(base, model, max_tokens, seed=i, tag=f"stream {i}")
        except Exception as e:  # noqa: BLE001 - every failure is reported
            fail(f"stream {i}: {e}")

    t0 = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    tokens = sum(r[1]["completion_tokens"] for r in results if r)
    done = sum(1 for r in results if r)
    print(json.dumps({"concurrent_streams": n, "completed": done, "completion_tokens": tokens,
                      "wall_s": round(wall, 2), "tok_s": round(tokens / wall, 1)}), flush=True)
    if done != n:
        fail(f"{n - done} of {n} concurrent streams did not complete")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--expect-device", default="cuda")
    a = p.parse_args()
    base = a.base_url.rstrip("/")
    with urllib.request.urlopen(base + "/v1/models", timeout=30) as r:
        models = json.loads(r.read())
    card = next((m for m in models["data"] if m["id"] == a.model), None)
    print(json.dumps({"model_card": card}), flush=True)
    if not card or not str(card.get("device", "")).startswith(a.expect_device):
        fail(f"model card does not say a {a.expect_device} device serves it: {card}")
    for name, f in [("chat", lambda: chat(base, a.model, a.max_tokens)),
                    ("chat stream", lambda: chat_stream(base, a.model, a.max_tokens)),
                    ("completions", lambda: completions(base, a.model, a.max_tokens)),
                    ("concurrent", lambda: concurrent(base, a.model, a.streams, a.max_tokens))]:
        try:
            f()
            print(f"ok {name}", flush=True)
        except Exception as e:  # noqa: BLE001
            fail(f"{name}: {e}")
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        metrics = r.read().decode()
    wanted = ['vllm:cache_config_info{', f'device="{card["device"] if card else "?"}"']
    if a.expect_device == "cuda":
        wanted.append("vllm:gpu_cache_usage_perc")
    for series in wanted:
        if series not in metrics:
            fail(f"/metrics has no {series}")
    info = [l for l in metrics.splitlines() if l.startswith("vllm:cache_config_info")]
    print(json.dumps({"cache_config_info": info}), flush=True)
    print(json.dumps({"failures": FAILURES}), flush=True)
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
