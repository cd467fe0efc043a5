#!/usr/bin/env python3
"""Make a tiny Kimi K3 tiktoken tokenizer and its reference encodings, for minirun-runtime's tests.

What it makes
-------------
Under crates/minirun-runtime/tests/data/kimi-k3/tiktoken/ (or --out):

  tiktoken.model  a K3-format vocabulary: UTF-8 lines `base64(token bytes) SP rank`, ranks 0, 1,
                  2, ... without gaps. The 256 single bytes (rank = byte value), then MERGES
                  byte-pair merges learned from CORPUS below (split with K3's pattern first). The
                  256 reserved special ids follow the mergeable ones, as in the published
                  163,584 + 256 = 163,840 vocabulary.
  cases.json      the pattern, the special tokens, and for each case text the ids that
                  tiktoken 0.12.0 (`tiktoken.Encoding(..., pat_str=K3_PATTERN)`, which compiles
                  the pattern with the Rust fancy-regex engine) gives with `encode_ordinary`,
                  and each chat case's ids: K3's no-thinking template, its control tokens as
                  ids and its text segments encoded one at a time.

How to rerun
------------
From the repository root:

    tools/python-venv.sh oracle tools/make_k3_tokenizer_fixture.py

Two runs give byte-identical files. The script refuses to run with tiktoken != 0.12.0.
"""

import argparse
import base64
import collections
import json
import os
import random
import sys

import regex
import tiktoken

MERGES = 420

# K3's split pattern: Han runs; two case-shaped letter runs (Han subtracted) with optional
# English contractions; up to three digits; punctuation runs; newline runs; trailing spaces;
# spaces.
K3_PATTERN = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

# The named reserved ids, as offsets past the mergeable tokens; the others are
# <|reserved_token_ID|>.
NAMED_SPECIALS = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|end_of_msg|>",
    3: "<|open|>",
    4: "<|close|>",
    5: "<|sep|>",
    6: "[start_header_id]",
    7: "[end_header_id]",
    9: "[EOT]",
    18: "<|media_begin|>",
    19: "<|media_content|>",
    20: "<|media_end|>",
    21: "<|media_pad|>",
    65: "<osagent_mode>",
    254: "[UNK]",
    255: "[PAD]",
}

CORPUS = """\
The clockmaker opened his shop at seven, as he had every morning for forty years.
He didn't hurry; he'd learned that a clock you're rushing is a clock you'll repair twice.
"Good morning," said the baker. "It's cold today, isn't it?" They'll say it's 12 degrees.
Numbers like 3.14159, 2026-12-01 and 1,000,000 appear in ledgers; so do IDs such as X9-42b.
钟表匠每天早上七点开门。他从不着急，因为他知道匆忙修好的钟表往往要修两次。
今天很冷，面包师说。温度是十二度。中文English混合的句子也会出现。
    indented code: fn main() { println!("hello, world"); }
Tabs\tand  double  spaces,   trailing spaces   
and blank lines


end. ÉCOLE Über naïve café — em dash… ellipsis! Question? Yes!!
"""

CASES = [
    "Hello world",
    "Hello, world!",
    "The clockmaker opened his shop at seven.",
    "He didn't hurry; they'll say it's COLD. I'M SURE THEY'RE",
    "你好世界",
    "中文English混合",
    "汉字abc 北京市 Pascal",
    "1234567890 and 3.14159",
    "  leading spaces and trailing spaces   ",
    "line one\nline two\r\n\n\nline five\n",
    "tabs\there\t\tand there",
    "ÉCOLE Über naïve café — em dash… ellipsis!",
    "fn main() { println!(\"hello, world\"); }",
    "emoji 🙂 and symbols ∑ ≠ ∞",
    "",
    " ",
    "\n",
    "a" * 300,
    # Long single pieces: the merges must give tiktoken's ids however long a run of letters is
    # (minirun's encoder is linear in a piece, tiktoken's quadratic; same ids).
    "lock" * 1000,
    "clockmaker" * 300,
    "LOCK" * 500,
    "".join(random.Random(0).choice("clockmakerCLOCKMAKERtheTHE") for _ in range(5000)),
]

CHATS = [
    [("user", "Hello world")],
    [("user", "What time is it?"), ("assistant", "Seven o'clock."), ("user", "Thanks!")],
    [("system", "You are \"terse\" & exact."), ("user", "钟表匠")],
    [("user", "")],
]


def learn_merges(corpus, count):
    splitter = regex.compile("(?V1)" + K3_PATTERN)
    words = collections.Counter(
        tuple(bytes([b]) for b in piece.encode("utf-8"))
        for piece in splitter.findall(corpus)
    )
    ranks = {bytes([b]): b for b in range(256)}
    for _ in range(count):
        pairs = collections.Counter()
        for word, n in words.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merged = best[0] + best[1]
        if merged in ranks:
            break
        ranks[merged] = len(ranks)
        new_words = collections.Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new_words[tuple(out)] += n
        words = new_words
    return ranks


def specials(base):
    return {
        NAMED_SPECIALS.get(k, f"<|reserved_token_{base + k}|>"): base + k for k in range(256)
    }


def chat_ids(enc, special, messages):
    ids = []

    def text(s):
        ids.extend(enc.encode_ordinary(s))

    def control(name):
        ids.append(special[name])

    def attribute(value):
        return value.replace("&", "&amp;").replace('"', "&quot;")

    for role, content in messages:
        control("<|open|>")
        text("message")
        text(f' role="{attribute(role)}"')
        control("<|sep|>")
        if role == "assistant":
            control("<|open|>")
            text("response")
            control("<|sep|>")
            if content:
                text(content)
            control("<|close|>")
            text("response")
            control("<|sep|>")
        elif content:
            text(content)
        control("<|close|>")
        text("message")
        control("<|sep|>")
        control("<|end_of_msg|>")
    control("<|open|>")
    text("message")
    text(' role="assistant"')
    control("<|sep|>")
    control("<|open|>")
    text("response")
    control("<|sep|>")
    return ids


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument(
        "--out",
        default=os.path.join(root, "crates/minirun-runtime/tests/data/kimi-k3/tiktoken"),
    )
    args = parser.parse_args()
    if tiktoken.__version__ != "0.12.0":
        sys.exit(f"tiktoken {tiktoken.__version__} is installed; this fixture is made with 0.12.0")
    ranks = learn_merges(CORPUS, MERGES)
    special = specials(len(ranks))
    enc = tiktoken.Encoding(
        name="k3-tiny", pat_str=K3_PATTERN, mergeable_ranks=ranks, special_tokens=special
    )
    os.makedirs(args.out, exist_ok=True)
    lines = [
        f"{base64.b64encode(token).decode()} {rank}"
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])
    ]
    with open(os.path.join(args.out, "tiktoken.model"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    cases = {
        "tiktoken": tiktoken.__version__,
        "pattern": K3_PATTERN,
        "mergeable_tokens": len(ranks),
        "special_tokens": special,
        "encodings": [{"text": t, "ids": enc.encode_ordinary(t)} for t in CASES],
        "chats": [
            {
                "messages": [{"role": r, "content": c} for r, c in m],
                "ids": chat_ids(enc, special, m),
            }
            for m in CHATS
        ],
    }
    for case in cases["encodings"]:
        assert enc.decode(case["ids"]) == case["text"], case["text"]
    with open(os.path.join(args.out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(ranks)} mergeable tokens, {len(CASES)} cases, {len(CHATS)} chats -> {args.out}")


if __name__ == "__main__":
    main()
