#!/usr/bin/env python3
"""A streaming chat's latency while embedding clients keep the encoder busy.

Starts each given `gateway` binary on the default models, times 64-token streaming chats alone
and then while 4 clients send 64-input embedding requests back to back, and prints one markdown
row per binary (time to first token and whole reply, seconds).

    bench/chat_under_embeddings.py target/release/gateway [other-gateway ...] [--rounds 2]
"""
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

CHAT = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBED = "sentence-transformers/all-MiniLM-L6-v2"


def post(base, path, body, timeout=600):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def chat(base):
    t0 = time.time()
    first = None
    r = post(base, "/v1/chat/completions", {
        "model": CHAT, "messages": [{"role": "user", "content": "Tell me a long story about a cat."}],
        "max_tokens": 64, "ignore_eos": True, "stream": True})
    for line in r:
        if line.startswith(b"data: {"):
            d = json.loads(line[6:])
            if first is None and d["choices"] and d["choices"][0]["delta"].get("content"):
                first = time.time() - t0
    return first, time.time() - t0


def measure(binary, port):
    proc = subprocess.Popen([binary, "serve", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except Exception:
                time.sleep(0.2)
        stop = threading.Event()

        def embedder(i):
            n = 0
            while not stop.is_set():
                post(base, "/v1/embeddings", {"model": EMBED, "input": [
                    f"sentence {i} {n} {k} about the weather and the sea" for k in range(64)]}).read()
                n += 1

        alone = [chat(base) for _ in range(2)]
        threads = [threading.Thread(target=embedder, args=(i,), daemon=True) for i in range(4)]
        for t in threads:
            t.start()
        time.sleep(1)
        loaded = [chat(base) for _ in range(3)]
        stop.set()
        return alone, loaded
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def main():
    args = sys.argv[1:]
    rounds = 1
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds = int(args[i + 1])
        del args[i:i + 2]
    print("| round | binary | alone: TTFT / reply (s, median of 2) | with 4 embedding clients: TTFT / reply (s, median of 3) |")
    print("|---|---|---|---|")
    for r in range(1, rounds + 1):
        for b in args:
            alone, loaded = measure(b, 8731)
            med = lambda xs, k: statistics.median(x[k] for x in xs)
            print(f"| {r} | {os.path.basename(os.path.dirname(b)) or '.'}/{os.path.basename(b)} | "
                  f"{med(alone, 0):.2f} / {med(alone, 1):.2f} | {med(loaded, 0):.2f} / {med(loaded, 1):.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
