#!/usr/bin/env python3
"""Checks every relative link in README.md and docs/**/*.md: the file it names exists, and an
anchor into a Markdown file names one of that file's headings (GitHub's slugs). Exits 1 naming
each broken link."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading):
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    found, fenced = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def markdown_files():
    yield os.path.join(ROOT, "README.md")
    for folder, _, files in os.walk(os.path.join(ROOT, "docs")):
        for name in sorted(files):
            if name.endswith(".md"):
                yield os.path.join(folder, name)


def broken_links(path):
    fenced = False
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(resolved):
                yield number, target, "no such file"
            elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                yield number, target, "no such heading"


def main():
    broken = 0
    for path in markdown_files():
        for number, target, why in broken_links(path):
            print(f"{os.path.relpath(path, ROOT)}:{number}: {target}: {why}")
            broken += 1
    if broken:
        print(f"{broken} broken links")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
