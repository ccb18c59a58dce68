#!/usr/bin/python3
"""Plots bench/autoscale.sh's `sluice status --json` samples.

usage: plot.py status.jsonl out.png join_seconds [simulated.csv]

Draws workers (registered, not draining), desired workers, throughput (elements/s returned to
the trainers, from batches/s x batch size) and mean trainer wait over time, and prints a summary:
for each load step (t=0 job A, t=join job B, the jobs' end) the seconds until the worker count
reached the count it then held.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    path, png, join = sys.argv[1], sys.argv[2], float(sys.argv[3])
    # The simulator's prediction for the same trace (autoscale_sim --bench-trace): per period,
    # the workers it provisioned (started or running) and its decision.
    sim_t, sim_workers = [], []
    if len(sys.argv) > 4:
        for row in list(open(sys.argv[4]))[1:]:
            f = row.strip().split(",")
            sim_t.append(float(f[0]))
            sim_workers.append(int(f[2]))
    t, workers, desired, throughput, wait = [], [], [], [], []
    demand_a = []  # job A's measured demand before B joins (its 40 ms step: 200 el/s)
    for line in open(path):
        row = json.loads(line)
        s = row["status"]
        t.append(row["t"])
        workers.append(sum(1 for w in s["workers"] if w["state"] != "draining"))
        desired.append(s["desired_workers"])
        thr, waits = 0.0, []
        for j in s["jobs"]:
            if j["job_name"] == "A" and 5 <= row["t"] < join:
                demand_a.append(j["demand_elements_per_second"])
            for c in j["consumers"]:
                if c["finished"]:
                    continue
                thr += c["batches_per_second"] * j["batch_size"]
                waits.append(c["wait_fraction"])
        throughput.append(thr)
        wait.append(100 * sum(waits) / len(waits) if waits else 0)
    fig, ax = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    ax[0].step(t, workers, where="post", label="workers (not draining)")
    ax[0].step(t, desired, where="post", linestyle="--", label="desired")
    if sim_t:
        ax[0].step(sim_t, sim_workers, where="post", linestyle=":", linewidth=2,
                   label="simulator's prediction (workers)")
    ax[0].set_ylabel("workers")
    ax[0].legend(loc="upper left")
    ax[1].plot(t, throughput)
    ax[1].set_ylabel("elements/s to trainers")
    ax[2].plot(t, wait)
    ax[2].set_ylabel("trainer wait %")
    ax[2].set_xlabel("seconds")
    for a in ax:
        a.axvline(join, color="grey", linewidth=0.8)
        a.grid(alpha=0.3)
    fig.suptitle("sluice local --autoscale: job A at 0 s, job B joins at %.0f s" % join)
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    # Convergence: after each change of desired, seconds until workers == desired.
    print("t(s)  desired  workers  wait%  el/s")
    last = None
    for i in range(len(t)):
        if (desired[i], workers[i]) != last:
            print("%5.1f  %7d  %7d  %5.1f  %6.0f" % (t[i], desired[i], workers[i], wait[i],
                                                    throughput[i]))
            last = (desired[i], workers[i])
    if demand_a:
        d = sorted(demand_a)
        # The dispatcher's demand measurement on real processes (cli_test checks only that it
        # is measured and never above the step's 200 el/s, as this is load-dependent).
        print("job A demand (t=5 s to the join, %d samples): median %.0f [%.0f-%.0f] el/s "
              "for a 40 ms step of 8 = 200 el/s" % (len(d), d[len(d) // 2], d[0], d[-1]))
    print("wrote", png)


if __name__ == "__main__":
    main()
