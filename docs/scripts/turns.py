import json, random, sys, time, urllib.request
url = sys.argv[1]
rounds = int(sys.argv[2])
def ttft(prompt):
    body = json.dumps({"model": "small", "prompt": prompt, "max_tokens": 2, "stream": True,
                       "stream_options": {"include_usage": True}, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.time(); first = None; cached = None
    with urllib.request.urlopen(req) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            d = json.loads(line[5:])
            if first is None and d.get("choices"):
                first = time.time() - t0
            if d.get("usage"):
                cached = d["usage"].get("prompt_tokens_details", {}).get("cached_tokens")
    return first, cached
for r in range(rounds):
    rnd = random.Random(100 + r)
    history = [rnd.randrange(3, 2775) for _ in range(1024)]
    t1, c1 = ttft(history)
    t2, c2 = ttft(history + [rnd.randrange(3, 2775) for _ in range(16)])
    print(f"round {r+1}: first turn TTFT {t1:.3f} s (cached {c1}), second turn {t2:.3f} s (cached {c2}), ratio {t2/t1:.3f}")
