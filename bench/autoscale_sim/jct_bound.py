#!/usr/bin/python3
"""How much any division of a bounded pool can lower the mean job completion time of a trace.

    /usr/bin/python3 bench/autoscale_sim/jct_bound.py bench/autoscale_sim/traces/tune/multi_*.trace

For each multi-job trace (bench/autoscale_sim/trace.h describes the format) it computes, in the
fluid model of the simulator without its noise, start-up delay and cold workers (each job j needs
n_j = demand_j x cost_j workers to keep its trainers busy, runs at a_j / n_j of full speed on
a_j <= n_j workers, and completes after work_j x cost_j worker-seconds):

  fair share   the pool shared max-min fairly between the live jobs: what the peers' workers
               that serve every job in turn do (bench/autoscale_sim, tf.data, the HPA);
  best order   the lowest mean JCT of every schedule that, at each arrival and each completion,
               hands the pool to the live jobs in some order, each up to its need (an exhaustive
               search over the orders; for a trace of more than 5 jobs only a few rule orders,
               each applied at every event, and the output says so). Schedules that change
               between events or split the pool otherwise are not searched; with linear
               speed-up up to the need, moving work of the job that completes later behind that
               of the one that completes sooner delays neither, which is why we expect no such
               schedule to do better;
  by priority  the same search over the orders that serve a higher `priority=` first, as
               sluice must (its allocation honours priority; the peers ignore it): the bound for
               sluice on a trace with priorities (a `priority` directive that changes one later
               is not modelled);
  no waiting   each job's completion if it had its need from arrival: a bound no schedule meets
               when the pool is short.

and the ratios fair share / best order and fair share / by priority: the most any allocation, and
any allocation that serves priorities first, can gain over a peer that shares the pool fairly.
Directives that change the load after the start (demand, cost, lose_worker, slow_worker, stop)
are not modelled: the trace is flagged and its figures are approximate.
Trace errors name the file and line.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass


@dataclass
class Job:
    id: int
    arrival: float
    need: float  # workers
    work: float  # worker-seconds
    priority: int = 0


def parse(path: str) -> tuple[list[Job], float, list[str]]:
    """Returns the trace's jobs with work, its pool and the directives not modelled.

    Raises ValueError naming the file and line of a job directive that cannot be read.
    """
    jobs: list[Job] = []
    pool = 128.0
    ignored: list[str] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            words = line.split("#")[0].split()
            if not words:
                continue
            if words[0] == "max_workers":
                pool = float(words[1])
            elif words[0] == "at" and len(words) > 3 and words[2] == "job":
                try:
                    kv = dict(w.split("=", 1) for w in words[4:])
                    demand = int(kv["consumers"]) * float(kv["batch"]) / float(kv["step"])
                    cost = 1 / float(kv["rate"]) if "rate" in kv else float(kv["cost"])
                    if "work" in kv:
                        jobs.append(Job(int(words[3]), float(words[1]), demand * cost,
                                        float(kv["work"]) * cost, int(kv.get("priority", 0))))
                except (KeyError, ValueError) as e:
                    raise ValueError(f"{path}:{number}: cannot read job directive: {e}") from e
            elif words[0] == "at":
                ignored.append(" ".join(words))
    return jobs, pool, ignored


def fair_share(live: list[Job], pool: float) -> dict[int, float]:
    """Max-min fair shares of `pool`, each job at most its need."""
    share = {j.id: 0.0 for j in live}
    active = list(live)
    left = pool
    while active and left > 1e-12:
        each = left / len(active)
        still = []
        for j in active:
            given = min(each, j.need - share[j.id])
            share[j.id] += given
            left -= given
            if j.need - share[j.id] > 1e-12:
                still.append(j)
        if len(still) == len(active):
            break
        active = still
    return share


def fill(order: tuple[Job, ...], pool: float) -> dict[int, float]:
    """The pool to the jobs in `order`, each up to its need."""
    share = {}
    left = pool
    for j in order:
        share[j.id] = min(j.need, left)
        left -= share[j.id]
    return share


def advance(jobs: list[Job], t: float, left: dict[int, float], share: dict[int, float],
            done: dict[int, float]) -> tuple[float, dict[int, float], dict[int, float]]:
    """Runs `share` from `t` to the next arrival or completion."""
    end = min([j.arrival for j in jobs if j.arrival > t + 1e-9] + [float("inf")])
    for job_id, a in share.items():
        if a > 1e-12:
            end = min(end, t + left[job_id] / a)
    left = dict(left)
    done = dict(done)
    arrival = {j.id: j.arrival for j in jobs}
    for job_id, a in share.items():
        left[job_id] -= a * (end - t)
        if left[job_id] <= 1e-7 and job_id not in done:
            done[job_id] = end - arrival[job_id]
    return end, left, done


def live_jobs(jobs: list[Job], t: float, done: dict[int, float]) -> list[Job]:
    return [j for j in jobs if j.arrival <= t + 1e-9 and j.id not in done]


def run_fair(jobs: list[Job], pool: float) -> dict[int, float]:
    """Each job's completion time under fair shares."""
    t, left, done = 0.0, {j.id: j.work for j in jobs}, {}
    while len(done) < len(jobs):
        t, left, done = advance(jobs, t, left, fair_share(live_jobs(jobs, t, done), pool), done)
    return done


# With more jobs than this, the exhaustive search takes hours; best_order then tries RULES only.
EXHAUSTIVE_JOBS = 5

# Orders applied at every event, each a sort key of a live job given the worker-seconds left per
# job: fewest remaining worker-seconds first, least remaining time at full speed first, smallest
# need first, arrival order.
RULES = [
    lambda j, left: left[j.id],
    lambda j, left: left[j.id] / j.need,
    lambda j, left: j.need,
    lambda j, left: j.arrival,
]


def run_rule(jobs: list[Job], pool: float, rule, by_priority: bool) -> float:
    """Mean JCT when the pool goes to the live jobs in the order `rule` gives at every event
    (within each priority, higher first, when `by_priority`)."""
    t, left, done = 0.0, {j.id: j.work for j in jobs}, {}
    while len(done) < len(jobs):
        order = sorted(live_jobs(jobs, t, done),
                       key=lambda j: (-j.priority if by_priority else 0, rule(j, left), j.id))
        t, left, done = advance(jobs, t, left, fill(tuple(order), pool), done)
    return sum(done.values()) / len(jobs)


def best_order(jobs: list[Job], pool: float, by_priority: bool = False) -> tuple[float, bool]:
    """The lowest mean JCT over every order at every event (every order that serves a higher
    priority first, when `by_priority`), and whether it was searched exhaustively: with more than
    EXHAUSTIVE_JOBS jobs only the RULES are tried (the result is then an upper bound on the best
    order's mean JCT, and fair / best may understate the headroom)."""
    if len(jobs) > EXHAUSTIVE_JOBS:
        return min(run_rule(jobs, pool, rule, by_priority) for rule in RULES), False

    def allowed(order: tuple[Job, ...]) -> bool:
        return not by_priority or all(a.priority >= b.priority for a, b in zip(order, order[1:]))

    def search(t: float, left: dict[int, float], done: dict[int, float]) -> float:
        if len(done) == len(jobs):
            return sum(done.values())
        live = live_jobs(jobs, t, done)
        return min(search(*advance(jobs, t, left, fill(order, pool), done))
                   for order in itertools.permutations(live) if allowed(order))

    return search(0.0, {j.id: j.work for j in jobs}, {}) / len(jobs), True


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    for path in paths:
        try:
            jobs, pool, ignored = parse(path)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        if len(jobs) < 2:
            continue
        fair = run_fair(jobs, pool)
        fair_mean = sum(fair.values()) / len(fair)
        best, exhaustive = best_order(jobs, pool)
        alone = sum(j.work / j.need for j in jobs) / len(jobs)
        prioritized = len({j.priority for j in jobs}) > 1
        print(f"{path} (pool {pool:g}, need {sum(j.need for j in jobs):.1f})")
        for j in jobs:
            print(f"  job {j.id}: arrives {j.arrival:g} s, need {j.need:.2f} workers, "
                  f"{j.work:.0f} worker-s, {j.work / j.need:.1f} s at full speed"
                  + (f", priority {j.priority}" if j.priority else ""))
        print(f"  mean JCT: fair share {fair_mean:.1f} s, best order {best:.1f} s, "
              f"no waiting {alone:.1f} s; fair share / best order = {fair_mean / best:.2f}x")
        if prioritized:
            ranked, _ = best_order(jobs, pool, by_priority=True)
            print(f"  by priority: best order serving higher priority first {ranked:.1f} s; "
                  f"fair share / by priority = {fair_mean / ranked:.2f}x")
        if not exhaustive:
            print(f"  not exhaustive: more than {EXHAUSTIVE_JOBS} jobs, only the rule orders were "
                  "tried at every event (the best order may be lower, the headroom larger)")
        if ignored:
            print(f"  approximate: not modelled: {'; '.join(ignored)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
