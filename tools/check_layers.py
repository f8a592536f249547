#!/usr/bin/env python3
"""The include check of src/'s layers: every #include "..." of a .c, .h, .cu or .cuh file under src/ must name a
header of the file's own folder or of a lower layer (tools/layers.txt, lowest first; folders on one line are
siblings and may not include each other). So no include goes up a layer and no two folders include each other.

Today's exceptions are listed in tools/layers-baseline.txt, one per line: "FILE: HEADER" (paths relative to src/,
e.g. "mem/plan.c: pipeline/layout.h"). An exception that no longer occurs is an error too, so the list only
shrinks: delete its line.

Usage: check_layers.py [--src DIR] [--layers FILE] [--baseline FILE] [--print-baseline]
       check_layers.py --self-test    (shows the check finds an include that goes up, a loop and a stale entry)
Exit status: 0 clean, 1 a violation or a stale exception, 2 bad usage or an unreadable file. Python 3 standard
library only."""
import argparse
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SOURCES = (".c", ".h", ".cu", ".cuh")


def read_layers(path):
    """{folder: rank} from the layer file; siblings share a rank."""
    rank = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            line = line.split("#", 1)[0].split()
            for folder in line:
                if folder in rank:
                    raise ValueError(f"{path}: folder '{folder}' is listed twice")
                rank[folder] = n
    return rank


def read_baseline(path):
    allowed = set()
    if not os.path.exists(path):
        return allowed
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if ": " not in line:
                raise ValueError(f"{path}:{n}: expected 'FILE: HEADER', got '{line}'")
            a, b = line.split(": ", 1)
            allowed.add((a.strip(), b.strip()))
    return allowed


def includes(src):
    """(file, line number, header, header's folder) for every include of a src/ folder's header from another
    folder. Headers are resolved as the compiler does: beside the including file first, then from src/."""
    for root, _, files in sorted(os.walk(src)):
        for name in sorted(files):
            if not name.endswith(SOURCES):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src)
            folder = rel.split(os.sep)[0]
            with open(path, encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    header = m.group(1)
                    beside = os.path.normpath(os.path.join(root, header))
                    target = beside if os.path.exists(beside) else os.path.normpath(os.path.join(src, header))
                    trel = os.path.relpath(target, src)
                    if trel.startswith(".."):  # outside src/ (include/h3run.h, system headers)
                        continue
                    tfolder = trel.split(os.sep)[0]
                    if tfolder != folder and os.sep in trel:
                        yield rel.replace(os.sep, "/"), n, trel.replace(os.sep, "/"), folder, tfolder


def check(src, layers_file, baseline_file, out=sys.stdout):
    """Returns (violations, stale exceptions) as lists of lines; prints nothing."""
    rank = read_layers(layers_file)
    allowed = read_baseline(baseline_file)
    folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    problems = [f"src/{d}/ is not in {layers_file}: add it on the line of its layer" for d in folders
                if d not in rank]
    seen = set()
    for rel, n, header, folder, tfolder in includes(src):
        if folder not in rank or tfolder not in rank:
            continue
        if rank[tfolder] < rank[folder]:
            continue
        key = (rel, header)
        seen.add(key)
        if key in allowed:
            continue
        how = "on the same layer as" if rank[tfolder] == rank[folder] else "a layer above"
        problems.append(f"src/{rel}:{n}: includes \"{header}\": {tfolder}/ is {how} {folder}/ "
                        f"(layers, lowest first: {layers_file}); move what it needs down, or pass a callback")
    stale = [f"{baseline_file}: '{a}: {b}' no longer occurs: delete that line" for a, b in sorted(allowed - seen)]
    return problems, stale


def self_test():
    """A tiny tree with a clean include, an include that goes up, a sideways one, a loop and a stale exception:
    the check must report exactly those."""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "src")
        files = {
            "low/a.h": '#include "low/b.h"\n',
            "low/b.h": "",
            "low/c.c": '#include "high/h.h"\n',  # up
            "high/h.h": '#include "low/a.h"\n#include "mid/m.h"\n',  # mid is a sibling of high
            "mid/m.h": '#include "high/h.h"\n',  # ... and so a loop
            "high/ok.c": '#include "low/b.h"\n#include "h.h"\n#include <stdio.h>\n#include "h3run.h"\n',
        }
        for rel, text in files.items():
            os.makedirs(os.path.join(src, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(src, rel), "w") as f:
                f.write(text)
        layers = os.path.join(d, "layers.txt")
        with open(layers, "w") as f:
            f.write("# comment\nlow\nmid high\n")
        base = os.path.join(d, "baseline.txt")
        with open(base, "w") as f:
            f.write("high/h.h: mid/m.h\nlow/gone.c: high/h.h\n")
        problems, stale = check(src, layers, base)
        want = ["src/low/c.c:1: includes \"high/h.h\"", "src/mid/m.h:1: includes \"high/h.h\""]
        ok = len(problems) == 2 and all(any(p.startswith(w) for p in problems) for w in want)
        ok = ok and len(stale) == 1 and "low/gone.c: high/h.h" in stale[0]
        # a folder that is not declared
        os.makedirs(os.path.join(src, "new"))
        problems, _ = check(src, layers, base)
        ok = ok and any("src/new/ is not in" in p for p in problems)
        for p in problems + stale:
            print("  found: " + p)
        print("check_layers self-test: " + ("passed" if ok else "FAILED"))
        return 0 if ok else 1


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=os.path.join(here, "..", "src"))
    ap.add_argument("--layers", default=os.path.join(here, "layers.txt"))
    ap.add_argument("--baseline", default=os.path.join(here, "layers-baseline.txt"))
    ap.add_argument("--print-baseline", action="store_true",
                    help="print every include that goes up or sideways today, in the baseline's form")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    try:
        if a.print_baseline:
            rank = read_layers(a.layers)
            for rel, _, header, folder, tfolder in includes(a.src):
                if folder in rank and tfolder in rank and rank[tfolder] >= rank[folder]:
                    print(f"{rel}: {header}")
            return 0
        problems, stale = check(a.src, a.layers, a.baseline)
    except (OSError, ValueError) as e:
        print(f"check_layers: {e}", file=sys.stderr)
        return 2
    for p in problems + stale:
        print(p)
    n = len(read_baseline(a.baseline))
    if problems or stale:
        print(f"check_layers: {len(problems)} includes break the layers, {len(stale)} stale exceptions")
        return 1
    print(f"check_layers: every include of src/ goes down a layer ({n} listed exceptions in {a.baseline})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
