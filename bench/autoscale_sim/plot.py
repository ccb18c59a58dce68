#!/usr/bin/python3
"""Plots autoscale_sim's --series output: plot.py IN.csv OUT.png

Uses Debian's matplotlib (/usr/bin/python3). Top: workers provisioned by each policy and the
oracle; bottom: the trainers' mean wait per control period."""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STEPS = [(41, "demand x2"), (81, "2nd job"), (121, "cost x3"), (161, "worker lost"),
         (201, "all stop")]
STYLE = {"sluice": ("tab:blue", 2.2), "cachew": ("tab:red", 1.2), "cachew-up": ("tab:orange", 1.2),
         "tf.data": ("tab:green", 1.2), "hpa-cpu": ("tab:purple", 1.2)}


def main(src: str, dst: str) -> None:
    series = defaultdict(lambda: defaultdict(list))
    for row in csv.DictReader(open(src)):
        s = series[row["policy"]]
        for key in ("time", "provisioned", "oracle", "wait"):
            s[key].append(float(row[key]))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
    first = next(iter(series.values()))
    top.step(first["time"], first["oracle"], where="post", color="black", linestyle="--",
             linewidth=1, label="oracle: ceil(true need)")
    for name, s in series.items():
        color, width = STYLE.get(name, (None, 1.2))
        top.step(s["time"], s["provisioned"], where="post", color=color, linewidth=width,
                 label=name)
        bottom.plot(s["time"], [100 * w for w in s["wait"]], color=color, linewidth=width,
                    label=name)
    for at, label in STEPS:
        for ax in (top, bottom):
            ax.axvline(at, color="grey", linewidth=0.6, linestyle=":")
        bottom.text(at + 1, 0.97, label, fontsize=8, va="top",
                    transform=bottom.get_xaxis_transform())
    top.set_ylabel("workers (provisioned)")
    top.legend(loc="upper left", fontsize=8, bbox_to_anchor=(0.0, 0.88))
    bottom.set_ylabel("trainer wait (%)")
    bottom.set_xlabel("time (s); control period 2 s, worker start-up 4 s")
    top.set_title("autoscale_sim: one trace, five policies (bench/autoscale_sim.sh)")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
