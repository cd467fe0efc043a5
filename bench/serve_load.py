#!/usr/bin/env python3
"""Load test of `dormouse serve`: concurrent streamed completions, latency and throughput.

Python standard library only (http.client, threading). Every request is
POST /v1/completions with {"prompt", "max_tokens", "temperature", "seed": its index,
"stream": true}; all requests of the first wave start together (a barrier), at most
--concurrency are in flight at once. Each SSE stream is read to `data: [DONE]`.

Per request: latency (request sent to [DONE]), time to first piece (to the first event with
non-empty text; the server holds back an unfinished UTF-8 character or a possible stop
sequence, so that can be later than the first byte generated), bytes, finish_reason.
Bytes are counted from the streamed text pieces, as the UTF-8 length of their text: a stream
carries no `usage` (only the non-stream answer does), and where the model emits bytes that
are not valid UTF-8 the server sends U+FFFD (3 bytes) instead, so this count can differ from
the bytes the model generated (max_tokens per request unless a stop sequence ends it).
Errors: a status other than 200, a connection failure or timeout, an event that is not JSON
or has no choices[0].text, an error event, a missing final event with finish_reason, or a
stream that ends without [DONE].

Usage:
    python3 bench/serve_load.py --url http://127.0.0.1:8000 --concurrency 64 --max-tokens 64 \\
        --prompt "And God said"

Prints one JSON line (the summary, with every request's numbers under "requests_detail"
when --detail is given), then a markdown table: requests, errors, p50/p99 latency,
p50/p99 time to first piece, text bytes (all pieces' UTF-8 bytes, failed requests' too),
aggregate text bytes/s over the wall time from the first request sent to the last [DONE],
and model bytes/s: max_tokens for each successful completion that ended for "length" (it
generated exactly that many bytes), over the same wall time. Exit status 1 if any request
failed.
"""

import argparse
import http.client
import json
import math
import sys
import threading
import time
import urllib.parse


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight at once")
    p.add_argument("--requests", type=int, default=None,
                   help="requests in all (default: --concurrency, one wave)")
    p.add_argument("--max-tokens", type=int, default=64, help="bytes per completion")
    p.add_argument("--prompt", default="And God said")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--timeout", type=float, default=300.0,
                   help="socket timeout: seconds without a byte from the server")
    p.add_argument("--detail", action="store_true", help="every request's numbers in the JSON")
    return p.parse_args()


class Result:
    def __init__(self, index):
        self.index = index
        self.status = None
        self.latency = None
        self.first_piece = None
        self.bytes = 0
        self.pieces = 0
        self.finish_reason = None
        self.error = None

    def as_dict(self):
        return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in vars(self).items()}


def events(response):
    """The SSE events' data fields (multi-line data joined with newlines), as they arrive."""
    data = []
    while True:
        line = response.readline()
        if not line:
            if data:
                yield "\n".join(data)
            return
        line = line.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith(":"):
            continue  # a comment (keep-alive)
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
        # other fields (event:, id:, retry:) are not used by this server


def one_request(target, body, result, timeout):
    """Sends one streamed completion and reads it to [DONE], filling `result`."""
    conn = None
    t0 = time.perf_counter()
    try:
        conn_cls = http.client.HTTPSConnection if target.scheme == "https" else \
            http.client.HTTPConnection
        conn = conn_cls(target.hostname, target.port, timeout=timeout)
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Content-Type": "application/json",
                              "Accept": "text/event-stream"})
        response = conn.getresponse()
        result.status = response.status
        if response.status != 200:
            result.error = f"HTTP {response.status}: {response.read(300)!r}"
            return
        done = False
        for data in events(response):
            if done:
                result.error = f"an event after [DONE]: {data[:100]!r}"
                return
            if data == "[DONE]":
                done = True
                result.latency = time.perf_counter() - t0
                continue
            try:
                event = json.loads(data)
            except ValueError:
                result.error = f"an event that is not JSON: {data[:100]!r}"
                return
            if "error" in event:
                result.error = f"error event: {event['error']}"
                return
            try:
                choice = event["choices"][0]
                text = choice["text"]
            except (KeyError, IndexError, TypeError):
                result.error = f"an event without choices[0].text: {data[:100]!r}"
                return
            if not isinstance(text, str):
                result.error = f"text is not a string: {data[:100]!r}"
                return
            if text:
                if result.first_piece is None:
                    result.first_piece = time.perf_counter() - t0
                result.pieces += 1
                result.bytes += len(text.encode("utf-8"))
            if choice.get("finish_reason") is not None:
                if result.finish_reason is not None:
                    result.error = "two events with a finish_reason"
                    return
                result.finish_reason = choice["finish_reason"]
        if not done:
            result.error = "the stream ended without data: [DONE]"
        elif result.finish_reason is None:
            result.error = "no event carried a finish_reason"
    except (OSError, http.client.HTTPException, UnicodeDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"
    finally:
        if conn is not None:
            conn.close()


def percentile(values, p):
    """Nearest rank: the smallest value with at least p% of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(p / 100 * len(ordered)), 1) - 1]


def main():
    a = parse_args()
    target = urllib.parse.urlsplit(a.url)
    if target.scheme not in ("http", "https") or not target.hostname:
        sys.exit(f"--url {a.url!r}: expected http://HOST:PORT")
    total = a.requests if a.requests is not None else a.concurrency
    if total < 1 or a.concurrency < 1:
        sys.exit("--requests and --concurrency must be at least 1")
    results = [Result(i) for i in range(total)]
    bodies = [json.dumps({"prompt": a.prompt, "max_tokens": a.max_tokens,
                          "temperature": a.temperature, "seed": i, "stream": True})
              for i in range(total)]
    workers = min(a.concurrency, total)
    start = threading.Barrier(workers + 1)
    lock = threading.Lock()
    queue = iter(range(total))

    def worker():
        start.wait()
        while True:
            with lock:
                i = next(queue, None)
            if i is None:
                return
            one_request(target, bodies[i], results[i], a.timeout)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    ok = [r for r in results if r.error is None]
    failed = [r for r in results if r.error is not None]
    latencies = [r.latency for r in ok]
    firsts = [r.first_piece for r in ok if r.first_piece is not None]
    total_bytes = sum(r.bytes for r in results)
    model_bytes = a.max_tokens * sum(r.finish_reason == "length" for r in ok)

    def ms(x):
        return None if x is None else round(1000 * x, 1)

    summary = {
        "url": a.url,
        "requests": total,
        "concurrency": a.concurrency,
        "max_tokens": a.max_tokens,
        "temperature": a.temperature,
        "prompt": a.prompt,
        "ok": len(ok),
        "errors": len(failed),
        "error_examples": sorted({r.error for r in failed})[:5],
        "wall_s": round(wall, 4),
        "latency_ms_p50": ms(percentile(latencies, 50)),
        "latency_ms_p99": ms(percentile(latencies, 99)),
        "latency_ms_max": ms(max(latencies, default=None)),
        "first_piece_ms_p50": ms(percentile(firsts, 50)),
        "first_piece_ms_p99": ms(percentile(firsts, 99)),
        "bytes": total_bytes,
        "bytes_counted_as": "UTF-8 bytes of the streamed text pieces (no usage in a stream)",
        "bytes_per_s": round(total_bytes / wall, 1) if wall > 0 else None,
        # A completion that ends for "length" generated exactly max_tokens bytes (the model's
        # bytes, whatever the text pieces' UTF-8 length); no request here sends a stop.
        "model_bytes": model_bytes,
        "model_bytes_per_s": round(model_bytes / wall, 1) if wall > 0 else None,
        "finish_reasons": {k: sum(r.finish_reason == k for r in ok)
                           for k in sorted({r.finish_reason for r in ok})},
    }
    if a.detail:
        summary["requests_detail"] = [r.as_dict() for r in results]
    print(json.dumps(summary), flush=True)

    def cell(x):
        return "-" if x is None else f"{x}"

    print()
    print("| requests | errors | p50 latency ms | p99 latency ms | p50 first piece ms "
          "| p99 first piece ms | text bytes | text bytes/s | model bytes/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {total} | {len(failed)} | {cell(summary['latency_ms_p50'])} "
          f"| {cell(summary['latency_ms_p99'])} | {cell(summary['first_piece_ms_p50'])} "
          f"| {cell(summary['first_piece_ms_p99'])} | {total_bytes} "
          f"| {cell(summary['bytes_per_s'])} | {cell(summary['model_bytes_per_s'])} |")
    for r in failed[:5]:
        print(f"request {r.index}: {r.error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
