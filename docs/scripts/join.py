# Other requests keep flowing while a long prompt joins (issue 33):
# 3 clients send one-token requests (8-token prompts) back to back; after
# a warm-up a 4th sends a 1024-token prompt. Reports the slowest of the
# others' requests that overlap the join, over their median before it, as
# a share of the joiner's time.
import json, random, statistics, sys, threading, time, urllib.request
url, rounds = sys.argv[1], int(sys.argv[2])
vocab = 2775
def complete(prompt):
    body = json.dumps({"model": "small", "prompt": prompt, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req) as r:
        json.load(r)
    return t0, time.time()
for rnd in range(rounds):
    stop = threading.Event()
    done = [[] for _ in range(3)]
    def client(i):
        rng = random.Random(1000 * rnd + i)
        while not stop.is_set():
            done[i].append(complete([rng.randrange(3, vocab) for _ in range(8)]))
    threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
    for t in threads: t.start()
    time.sleep(4)
    rng = random.Random(77 + rnd)
    js, je = complete([rng.randrange(3, vocab) for _ in range(1024)])
    time.sleep(1)
    stop.set()
    for t in threads: t.join()
    reqs = [r for d in done for r in d]
    before = [e - s for s, e in reqs if e < js]
    overlap = [e - s for s, e in reqs if s < je and e > js]
    med, worst, joiner = statistics.median(before), max(overlap), je - js
    print(f"round {rnd+1}: joiner {joiner:.3f} s; others before: {len(before)} requests, median {med:.3f} s; overlapping: {len(overlap)}, slowest {worst:.3f} s; (slowest - median) / joiner = {(worst - med) / joiner:.3f}")
