#!/usr/bin/env python3
"""The measuring half of bench/decode_vs_llamacpp.sh: minirun (exact f32 and 8-bit
activations) against llama.cpp on the same weights, in interleaved rounds.

Each round times, for every format and thread count, the three sides one after another in an
order rotated each round (minirun f32, minirun int8, llama.cpp; then int8, llama.cpp, f32; ...):
`minirun bench model` and `llama-bench` with the same -p, -n and -r, each giving a prompt and a
decode rate. Beside each command the foreign load is recorded (bench/rounds.py: CPU used by
other processes and stolen by the hypervisor, in cores). A round in which any of a block's
three commands ran beside more foreign load than --max-foreign cores is marked and left out
of that block's summary. The summary gives medians and ranges over the kept rounds; a row's
ratio is the median of its rounds' ratios (each round's minirun rate over the same round's
llama.cpp rate).

Each round also measures the machine's memory read rate on the same thread count (`minirun bench
memory`, rotated with the engines), and minirun reports the weight bytes a decoded token reads.
Decoding a model that outgrows the CPU's caches reads every weight it uses from memory once per
token, so memory rate / weight bytes per token is the fastest any engine could decode there:
each decode row gives minirun's share of that ceiling and the ceiling's ratio to llama.cpp's
rate (`ratio_ceiling`, computed with minirun's weight bytes per token: the formats compared
store the same bits per weight, 4.5 for Q4_0 and affine 4-bit in groups of 64, 8.5 for Q8_0 and
affine 8-bit, 4.25 for MXFP4 beside the same BF16 tensors). A ratio goal above the ceiling
cannot be met on that machine by any engine that reads those bytes.

minirun's own greedy ids must agree: the same ids on every thread count, for each format and
arithmetic, before the rounds and again after them. A mismatch exits 1. (The two engines run
different quantizations of the same draws, so their tokens are not expected to agree and are
not compared.) Exit 1 too when a row kept no round: the machine was never quiet enough.

Prints a table per format with the CPU model, and ends with one JSON line:
{"cpu": ..., "rows": [{format, activations, threads, test, minirun_tok_s, llamacpp_tok_s,
ratio, ratio_min, ratio_max, rounds_kept, rounds_left_out, weight_bytes_per_token,
memory_bytes_per_s, minirun_share_of_memory, ratio_ceiling}, ...]} (the last three on decode
rows; medians over the kept rounds, each round's own memory rate beside its own rates).
Every measurement, foreign load included, goes to WORK/rounds.jsonl.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rounds  # noqa: E402

ENGINES = ["minirun-f32", "minirun-int8", "llama.cpp"]
MEMORY = "memory"
TESTS = ["decode", "prompt"]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--work", required=True, type=Path, help="folder for outputs")
    ap.add_argument("--minirun", required=True)
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--format", nargs=3, action="append", required=True,
                    metavar=("NAME", "ARTIFACT", "GGUF"),
                    help="a format row: its name, minirun's artifact and llama.cpp's GGUF")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--runs", type=int, default=3, help="passes per command (-r)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=19)
    ap.add_argument("--prompt", required=True, help="the prompt of the greedy-id check")
    ap.add_argument("--max-foreign", type=float, default=0.1,
                    help="foreign load, in cores, above which a round is left out (default 0.1)")
    return ap.parse_args()


def greedy_ids(a, artifact, threads, activations):
    done = subprocess.run([a.minirun, "run", artifact, "--unverified", "--json", "--prompt", a.prompt,
                           "--max-tokens", str(a.tokens + 1), "--ignore-eos", "--threads", str(threads),
                           "--activations", activations], capture_output=True, check=True)
    return json.loads(done.stdout)["generated_token_ids"]


def check_ids(a, threads, when):
    """minirun's greedy ids per (format, activations): the same on every thread count."""
    problems, seen = [], {}
    for name, artifact, _ in a.format:
        for activations in ("f32", "int8"):
            ids = {t: greedy_ids(a, artifact, t, activations) for t in threads}
            first = ids[threads[0]]
            seen[f"{name}-{activations}"] = first
            for t in threads[1:]:
                if ids[t] != first:
                    problems.append(f"{name} {activations}: {when}, greedy ids on {t} threads differ "
                                    f"from {threads[0]} thread(s): {ids[t][:8]}... vs {first[:8]}...")
    return problems, seen


def command(a, engine, artifact, gguf, threads):
    p, n, r = str(a.prompt_tokens), str(a.tokens), str(a.runs)
    if engine == MEMORY:
        return [a.minirun, "bench", "memory", "--json", "-r", r, "--threads", str(threads)]
    if engine == "llama.cpp":
        return [a.llama_bench, "-m", gguf, "-p", p, "-n", n, "-t", str(threads), "-r", r, "-o", "json"]
    return [a.minirun, "bench", "model", artifact, "--unverified", "--json", "-p", p, "-n", n,
            "-r", r, "--threads", str(threads), "--activations", engine.split("-")[1]]


def rates(a, engine, path):
    """{"decode": tok/s, "prompt": tok/s} from one command's output (minirun's with the weight
    bytes per decoded token; the memory benchmark's: {"bytes_per_s": median})."""
    doc = json.loads(path.read_text())
    if engine == MEMORY:
        return {"bytes_per_s": doc["median_bytes_per_second"]}
    if engine == "llama.cpp":
        pick = lambda prompt: next(x["avg_ts"] for x in doc if (x["n_prompt"] > 0) == prompt)
        return {"decode": pick(False), "prompt": pick(True)}
    by = {t["test"]: t for t in doc["tests"]}
    decode, prompt = by[f"tg{a.tokens}"], by[f"pp{a.prompt_tokens}"]
    return {"decode": decode["mean_tokens_per_second"], "prompt": prompt["mean_tokens_per_second"],
            "decode_weight_bytes_per_token": decode["weight_bytes_per_token"]}


def run_rounds(a, threads, log):
    """{(format, threads): [round, ...]}, each round {engine: rates, "foreign": cores, "kept": bool}."""
    blocks = {}
    for index in range(a.rounds):
        for name, artifact, gguf in a.format:
            for t in threads:
                block = {"round": index + 1, "format": name, "threads": t, "order": []}
                foreign = 0.0
                for engine in rounds.rotated(ENGINES + [MEMORY], index):
                    out = a.work / "out.json"
                    seen = rounds.measure(command(a, engine, artifact, gguf, t), out)
                    block[engine] = rates(a, engine, out)
                    block["order"].append(engine)
                    foreign = max(foreign, seen["foreign_cores"])
                    log.write(json.dumps({"round": index + 1, "format": name, "threads": t,
                                          "engine": engine, **block[engine], **seen}) + "\n")
                    log.flush()
                block["foreign"] = foreign
                block["kept"] = foreign <= a.max_foreign
                blocks.setdefault((name, t), []).append(block)
                mark = "" if block["kept"] else f"  LEFT OUT (foreign load {foreign:.2f} > {a.max_foreign} cores)"
                print(f"round {index + 1}/{a.rounds} {name} {t}t: "
                      + ", ".join(f"{e} tg {block[e]['decode']:.1f} pp {block[e]['prompt']:.1f}" for e in ENGINES)
                      + f", memory {block[MEMORY]['bytes_per_s'] / 1e9:.1f} GB/s"
                      + f", foreign {foreign:.2f} cores{mark}", file=sys.stderr)
    return blocks


def rounded(summary, digits):
    return summary and round(summary["median"], digits)


def memory_bound(kept, engine, test):
    """The decode row's memory figures: weight bytes per token, the memory rate, minirun's
    share of the rate and the ceiling's ratio to llama.cpp (medians over the rounds, each
    round's figures against its own memory rate); None for a prompt row."""
    if test != "decode" or not kept:
        return {"weight_bytes_per_token": None, "memory_bytes_per_s": None,
                "minirun_share_of_memory": None, "ratio_ceiling": None}
    per_token = kept[0][engine]["decode_weight_bytes_per_token"]
    memory = [r[MEMORY]["bytes_per_s"] for r in kept]
    share = [r[engine]["decode"] * per_token / r[MEMORY]["bytes_per_s"] for r in kept]
    ceiling = [r[MEMORY]["bytes_per_s"] / per_token / r["llama.cpp"]["decode"] for r in kept]
    return {"weight_bytes_per_token": per_token,
            "memory_bytes_per_s": rounded(rounds.summary(memory), 0),
            "minirun_share_of_memory": rounded(rounds.summary(share), 3),
            "ratio_ceiling": rounded(rounds.summary(ceiling), 3)}


def summarize(blocks):
    rows = []
    for (name, t), rs in blocks.items():
        kept = [r for r in rs if r["kept"]]
        for activations in ("int8", "f32"):
            engine = f"minirun-{activations}"
            for test in TESTS:
                ours = rounds.summary([r[engine][test] for r in kept])
                theirs = rounds.summary([r["llama.cpp"][test] for r in kept])
                ratio = rounds.summary([r[engine][test] / r["llama.cpp"][test] for r in kept])
                rows.append({
                    "format": name, "activations": activations, "threads": t, "test": test,
                    "minirun_tok_s": ours and round(ours["median"], 2),
                    "llamacpp_tok_s": theirs and round(theirs["median"], 2),
                    "ratio": ratio and round(ratio["median"], 3),
                    "ratio_min": ratio and round(ratio["min"], 3),
                    "ratio_max": ratio and round(ratio["max"], 3),
                    "minirun_tok_s_range": ours and [round(ours["min"], 2), round(ours["max"], 2)],
                    "llamacpp_tok_s_range": theirs and [round(theirs["min"], 2), round(theirs["max"], 2)],
                    "rounds_kept": len(kept), "rounds_left_out": len(rs) - len(kept),
                    **memory_bound(kept, engine, test),
                })
    return rows


def print_table(a, cpu, rows):
    print(f"\nCPU: {cpu}")
    print(f"{a.rounds} interleaved rounds, each command -p {a.prompt_tokens} -n {a.tokens} -r {a.runs}; "
          f"a round with more than {a.max_foreign} cores of foreign load is left out")
    print("decode rows: minirun's weight bytes per token, the memory read rate on the same threads "
          "(minirun bench memory), minirun's share of it, and the ceiling (memory rate / bytes per "
          "token) over llama.cpp's rate")
    print("\n| format | activations | threads | test | llama.cpp tok/s | minirun tok/s | ratio (median) | ratio range | rounds kept / left out | weights a token | memory GB/s | share of memory | ceiling ratio |")
    print("|---|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    fmt = lambda v, spec: "n/a" if v is None else format(v, spec)
    for r in rows:
        span = "n/a" if r["ratio"] is None else f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}x"
        memory = ["", "", "", ""]
        if r["weight_bytes_per_token"] is not None:
            memory = [f"{r['weight_bytes_per_token'] / 2**20:.1f} MiB", f"{r['memory_bytes_per_s'] / 1e9:.1f}",
                      f"{100 * r['minirun_share_of_memory']:.0f}%", f"{r['ratio_ceiling']:.2f}x"]
        print(f"| {r['format']} | {r['activations']} | {r['threads']} | {r['test']} | "
              f"{fmt(r['llamacpp_tok_s'], '.1f')} | {fmt(r['minirun_tok_s'], '.1f')} | "
              f"{fmt(r['ratio'], '.2f')}x | {span} | {r['rounds_kept']} / {r['rounds_left_out']} | "
              + " | ".join(memory) + " |")


def main():
    try:
        measure_all(parse_args())
    except subprocess.CalledProcessError as e:
        sys.stderr.write(e.stderr.decode(errors="replace")[-4000:] if e.stderr else "")
        sys.exit(f"failed (exit {e.returncode}): {' '.join(map(str, e.cmd))}")


def measure_all(a):
    a.work.mkdir(parents=True, exist_ok=True)
    threads = [int(t) for t in a.threads.split(",")]
    cpu = rounds.cpu_model()
    problems, before = check_ids(a, threads, "before the rounds")
    with open(a.work / "rounds.jsonl", "w") as log:
        blocks = run_rounds(a, threads, log)
    later, after = check_ids(a, threads, "after the rounds")
    problems += later
    problems += [f"{key}: greedy ids after the rounds differ from those before them"
                 for key in before if before[key] != after[key]]
    rows = summarize(blocks)
    print_table(a, cpu, rows)
    problems += [f"{r['format']} {r['activations']} {r['threads']}t {r['test']}: no round was quiet enough"
                 for r in rows if r["rounds_kept"] == 0]
    for p in problems:
        print(f"!! {p}")
    print(json.dumps({"cpu": cpu, "rows": rows}))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
