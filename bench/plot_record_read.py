#!/usr/bin/python3
"""Plots record_read_bench's --csv output: bench/plot_record_read.py IN.csv OUT.png

Uses Debian's matplotlib (/usr/bin/python3). One group of bars per (record size, threads)."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODES = [
    ("sequential", "sequential read(), 1 MiB, no checksum"),
    ("view", "random ShardReader::ReadView (verified, zero copy)"),
    ("encoded", "random ShardReader::ReadEncoded (verified copy)"),
    ("view_first_pass", "random ReadView, 1st pass after Open (page faults)"),
]


def main(src, dst):
    rows = [r for r in csv.DictReader(open(src)) if r["kind"] == "read"]
    groups = sorted({(int(r["record_bytes"]), int(r["threads"])) for r in rows})
    value = {(int(r["record_bytes"]), int(r["threads"]), r["mode"]): float(r["median"])
             for r in rows}
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(MODES)
    for m, (mode, label) in enumerate(MODES):
        xs = [g + (m - len(MODES) / 2 + 0.5) * width for g in range(len(groups))]
        ax.bar(xs, [value.get((rb, t, mode), 0) / 1000 for rb, t in groups], width, label=label)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{rb // 1024} KiB, {t} thr" for rb, t in groups])
    ax.set_ylabel("GB/s (warm page cache)")
    ax.set_title("Unirecord random record reads vs sequential read() (bench/record_read.sh)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
