"""Summarize a raw (collapsed) py-spy profile: where the samples are, per thread and function.

`py-spy record --format raw` writes one line per distinct stack, ``frames;... count``
(leaf last; with ``--threads`` the first frame names the thread). This prints the share of
samples per thread, then the top functions by inclusive and by self (leaf) samples, either
over all threads or within ``--thread`` (a substring of the thread frame).

    .venv/bin/python bench/profile_top.py /tmp/prof-read.txt --top 25 [--thread entrylogger]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

_LINE = re.compile(r" \(([^)]*):\d+\)$")


def frame_name(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (file.py)``; line numbers dropped so that
    samples of one function add up."""
    m = _LINE.search(frame)
    if not m:
        return frame.strip()
    path = m.group(1)
    short = "/".join(path.split("/")[-2:])
    return f"{frame[: m.start()].strip()} ({short})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--thread", help="only stacks whose thread frame contains this")
    ap.add_argument("--contains", help="only stacks with a frame containing this")
    a = ap.parse_args()
    threads: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    self_: Counter[str] = Counter()
    total = 0
    with open(a.profile) as f:
        for line in f:
            line = line.rstrip("\n")
            stack, _, count_s = line.rpartition(" ")
            if not stack or not count_s.isdigit():
                continue
            n = int(count_s)
            frames = stack.split(";")
            thread = frames[0]
            if a.thread and a.thread not in thread:
                continue
            if a.contains and not any(a.contains in fr for fr in frames):
                continue
            total += n
            threads[thread] += n
            names = [frame_name(fr) for fr in frames[1:]]
            for name in set(names):
                incl[name] += n
            if names:
                self_[names[-1]] += n
    if not total:
        print("no samples")
        return 1
    print(f"{total} samples")
    print("\nper thread:")
    for t, n in threads.most_common(12):
        print(f"  {100 * n / total:5.1f}%  {t}")
    print(f"\ntop {a.top} inclusive:")
    for name, n in incl.most_common(a.top):
        print(f"  {100 * n / total:5.1f}%  {name}")
    print(f"\ntop {a.top} self:")
    for name, n in self_.most_common(a.top):
        print(f"  {100 * n / total:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
