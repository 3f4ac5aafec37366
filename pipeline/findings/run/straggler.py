"""straggler: a rank the others wait for in their collectives.

Premise: a rank started last in collectives (by at least 1 µs; `ranks`' stragglers) and its lag
behind the next-latest rank there, summed, is at least [straggler] min_step of the run's time.
That lag is what the whole job loses to it (had it arrived with the next-latest rank, every rank
would have gone on that much earlier). Saving: [low, high] of the lag.
"""

from __future__ import annotations

from pipeline.findings.finding import Evidence, Finding, ms, pct
from pipeline.findings.run.facts import RunFacts

ID = "straggler"


def straggler(r: RunFacts) -> Finding | None:
    lim = r.limits(ID)
    if not r.stragglers or not r.window_us:
        return None
    worst = r.stragglers[0]
    rank = worst["rank"]
    lag = sum(r.lags.get(rank, []))
    if lag < lim["min_step"] * r.window_us:
        return None
    wall = r.bounded((lag * lim["low"], lag * lim["high"]))
    if not r.worth(wall):
        return None
    evidence = [
        Evidence(
            "rank",
            f"rank {s['rank']}",
            s["times_last"],
            s["wait_caused_us"],
            None,
            note=f"last in {s['times_last']} of {r.collectives} collectives; the others' wait it caused"
            + (f"; lag behind the next-latest rank {ms(sum(r.lags[s['rank']]))}" if s["rank"] in r.lags else ""),
        )
        for s in r.stragglers[:3]
    ]
    mine = r.per_rank.get(rank)
    if mine and mine["device"] and mine["step_us"]:
        busy = mine["compute_us"] + mine["exposed_comm_us"]
        evidence.append(
            Evidence(
                "rank",
                f"rank {rank}: device busy in its steps",
                mine["steps"],
                busy,
                pct(busy, mine["step_us"]),
                of="its steps",
            )
        )
    return Finding(
        ID,
        f"Rank {rank} is the straggler: last to arrive in {worst['times_last']} of {r.collectives} collectives, "
        f"{ms(lag)} behind the next-latest rank; the others waited {ms(worst['wait_caused_us'])} for it",
        wall,
        None,
        f"Find what delays rank {rank}: open its own trace (tracepipe analyze <rank {rank}'s trace>: its host "
        "time, data loading, syncs before the collectives) and balance the work across ranks (uneven "
        "batches or sequence lengths, embedding-table sharding, a slower host or GPU, a noisy neighbour)",
        "stragglers",
        tuple(evidence),
        f"{lim['low']:.0%}-{lim['high']:.0%} of its lag behind the next-latest rank, summed over the "
        "collectives it was last in",
    )
