#!/usr/bin/env python3
"""An independent reader of a signed minirun artifact (docs/formats/signed-statement.md),
using only Python's standard library and OpenSSH's ssh-keygen.

Usage: tools/check_signed_statement.py ARTIFACT_DIR ALLOWED_SIGNERS PRINCIPAL

It checks, without any minirun code:
  1. the signature: `ssh-keygen -Y verify` in the namespace minirun-artifact;
  2. the statement's form: the magic line, repo and revision lines, then
     `<sha256> <size> <path>` lines in strictly increasing byte order of the path;
  3. every listed file's size and SHA-256;
  4. every payload file each listed unit manifest names, against the size and SHA-256 the
     manifest records;
  5. that the folder holds nothing else (the evidence folder .minirun/ aside).
Prints one line per check and exits 0 when all hold, 1 with the first failure otherwise.
"""

import hashlib
import json
import os
import re
import subprocess
import sys

STATEMENT = "minirun-statement.txt"
SIGNATURE = STATEMENT + ".sig"
NAMESPACE = "minirun-artifact"
LINE = re.compile(r"^([0-9a-f]{64}) (0|[1-9][0-9]*) (.+)$")


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_signature(root, allowed, principal):
    with open(os.path.join(root, STATEMENT), "rb") as statement:
        result = subprocess.run(
            ["ssh-keygen", "-Y", "verify", "-f", allowed, "-I", principal,
             "-n", NAMESPACE, "-s", os.path.join(root, SIGNATURE)],
            stdin=statement, capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"ssh-keygen refuses the signature: {result.stderr.strip() or result.stdout.strip()}")
    print(f"signature: {result.stdout.strip()}")


def read_statement(root):
    with open(os.path.join(root, STATEMENT), "rb") as f:
        text = f.read().decode("utf-8")
    if not text.endswith("\n") or "\r" in text:
        fail("the statement's lines do not all end in a lone line feed")
    lines = text[:-1].split("\n")
    if lines[0] != "minirun-statement/1":
        fail(f"first line {lines[0]!r} is not minirun-statement/1")
    if not (lines[1].startswith("repo ") and lines[2].startswith("revision ")):
        fail("lines 2 and 3 are not `repo ...` and `revision ...`")
    listed = {}
    previous = b""
    for number, line in enumerate(lines[3:], start=4):
        match = LINE.match(line)
        if not match:
            fail(f"line {number} is not `<sha256> <size> <path>`: {line!r}")
        sha, size, path = match.group(1), int(match.group(2)), match.group(3)
        if path.encode() <= previous:
            fail(f"line {number}: {path} is not after the previous path")
        previous = path.encode()
        listed[path] = (size, sha)
    print(f"statement: {lines[1]}, {lines[2]}, {len(listed)} files")
    return listed


def check_listed(root, listed):
    for path, (size, sha) in listed.items():
        full = os.path.join(root, path)
        if os.path.islink(full) or not os.path.isfile(full):
            fail(f"{path} is not a regular file")
        if os.path.getsize(full) != size or sha256_of(full) != sha:
            fail(f"{path} does not have the size and SHA-256 the statement lists")
    print(f"listed files: {len(listed)} match")


def payload_of(root, listed):
    payload = {}
    for path in listed:
        parts = path.split("/")
        if len(parts) != 2 or parts[1] != "manifest.json":
            continue
        with open(os.path.join(root, path), "rb") as f:
            manifest = json.load(f)
        for entry in manifest["files"]:
            payload[f"{parts[0]}/{entry['name']}"] = (entry["bytes"], entry["sha256"])
    if not payload:
        fail("the statement lists no unit manifest naming a payload file")
    return payload


def check_payload(root, payload):
    for path, (size, sha) in payload.items():
        full = os.path.join(root, path)
        if os.path.islink(full) or os.path.getsize(full) != size or sha256_of(full) != sha:
            fail(f"payload {path} does not have the size and SHA-256 its manifest records")
    print(f"payload files: {len(payload)} match their manifests")


def check_nothing_else(root, covered):
    present = set()
    for directory, folders, files in os.walk(root):
        relative = os.path.relpath(directory, root)
        if relative == ".minirun" or relative.startswith(".minirun" + os.sep):
            continue
        for name in files + [f for f in folders if os.path.islink(os.path.join(directory, f))]:
            present.add(name if relative == "." else f"{relative}/{name}")
    extra = sorted(present - covered)
    if extra:
        fail(f"files no statement or manifest covers: {extra}")
    print("folder: holds nothing else")


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        sys.exit(2)
    root, allowed, principal = sys.argv[1:]
    check_signature(root, allowed, principal)
    listed = read_statement(root)
    check_listed(root, listed)
    payload = payload_of(root, listed)
    check_payload(root, payload)
    check_nothing_else(root, set(listed) | set(payload) | {STATEMENT, SIGNATURE})
    print("OK")


if __name__ == "__main__":
    main()
