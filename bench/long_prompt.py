#!/usr/bin/env python3
"""Helpers of bench/long_prompt.sh (standard library, plus tiktoken for `tiktoken`).

  long_prompt.py tiktoken TIKTOKEN_MODEL WORD BYTES...
      tiktoken 0.12.0 with Kimi K3's split pattern on TIKTOKEN_MODEL encodes WORD repeated to
      each BYTES; one JSON line per size, as crates/minirun-text/examples/encode_long_word.rs.
  long_prompt.py serve BASE_URL BYTES
      streams completions from `minirun serve` at BASE_URL one after another and, half a
      second in, posts a prompt of BYTES bytes (one word); prints one JSON line: the status and
      code of the long prompt's answer, the seconds it took, and the gaps between streamed
      tokens before (median, largest) and while the long prompt was in flight (largest).
"""

import base64
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

K3_PATTERN = "".join([
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+",
    r"|\s+(?!\S)",
    r"|\s+",
])


def tiktoken_sizes(model, word, sizes):
    import tiktoken

    ranks = {}
    with open(model, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    enc = tiktoken.Encoding(name="k3-bench", pat_str=K3_PATTERN, mergeable_ranks=ranks,
                            special_tokens={})
    for size in sizes:
        text = word * -(-int(size) // len(word))
        started = time.perf_counter()
        ids = enc.encode_ordinary(text)
        seconds = time.perf_counter() - started
        print(json.dumps({"bytes": len(text.encode()), "tokens": len(ids),
                          "seconds": round(seconds, 6)}), flush=True)


def post(base, path, body):
    url = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return conn.getresponse()


def serve(base, size):
    """Back-to-back streamed completions record their tokens' arrival times while the long
    prompt is posted once, half a second in."""
    stop = threading.Event()
    arrivals = []

    def stream():
        while not stop.is_set():
            response = post(base, "/v1/completions", {"prompt": "The clockmaker", "max_tokens": 64,
                                                      "temperature": 0, "stream": True})
            for line in response:
                if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                    arrivals.append(time.perf_counter())

    streamer = threading.Thread(target=stream)
    streamer.start()
    time.sleep(0.5)
    sent = time.perf_counter()
    response = post(base, "/v1/completions", {"prompt": "lock" * (int(size) // 4), "max_tokens": 1})
    answer = json.loads(response.read())
    answered = time.perf_counter()
    time.sleep(0.5)
    stop.set()
    streamer.join()
    pairs = list(zip(arrivals, arrivals[1:]))
    gaps_before = [b - a for a, b in pairs if b <= sent]
    gaps_during = [b - a for a, b in pairs if b > sent and a < answered]
    summary = {
        "prompt_bytes": int(size) // 4 * 4,
        "status": response.status,
        "code": answer.get("error", {}).get("code"),
        "refused_in_s": round(answered - sent, 4),
        "streamed_tokens": len(arrivals),
        "gap_median_before_s": round(statistics.median(gaps_before), 5) if gaps_before else None,
        "gap_max_before_s": round(max(gaps_before), 5) if gaps_before else None,
        "gap_max_during_s": round(max(gaps_during), 5) if gaps_during else None,
    }
    print(json.dumps(summary), flush=True)


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "tiktoken":
        tiktoken_sizes(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif len(sys.argv) == 4 and sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
