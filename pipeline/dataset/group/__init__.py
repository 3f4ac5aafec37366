"""group: many traces flattened in one task into one set of tables keyed by `trace_id`, each
trace's rows exactly those `flatten` gives it alone.

A small trace costs `flatten` ~90 ms, almost all of it fixed costs (a few hundred polars queries
to link and cost it, seven Parquet files to write), while its bytes take ~1 ms. So the small
traces of a task are read one by one but decoded together (their events texts joined into one
chunk, a sentinel event between two: `decode`), linked and costed together (`link`) and written
together, and every per-trace result of the single-trace path is kept:

* linking runs over the group's events with every id a join matches on made unique per trace:
  pid (a thread is (pid, tid)), correlation, External id and flow ids are moved to the trace's
  band (`bands.BAND` apart; a trace whose ids do not fit a band goes alone) and event_idx is
  offset. What linking decides once per trace (whether External ids are trustworthy, whether
  every GPU op carries a correlation id: `link._link_facts`) splits the group so that each part
  agrees on it;
* kernels are costed against their own trace's devices (traces with the same devices together);
* counts (links, costs, problems), facts and the run tables are computed per trace: `steps` by
  one query keyed by trace for every trace with kernels; the collectives of NCCL/RCCL kernels by
  one `runs.collectives` call over the ranks together (their ids moved to their bands, each
  trace's rank, numbering and steps its own: `run_tables`); those of CPU-only gloo ranks the same
  way (each trace's runloop threads given its own process groups), their steps measured by them
  in the one steps query; a trace these cannot take (a gloo trace with kernels or HCCL ops) gets
  its run tables from `runs.tables` alone.

A trace that is not small after all (a long text, truncated, an oversized value), that fails to
decode, or a large one (`run_group(small=False)`) is flattened alone by `flatten` into a scratch
directory and copied in. Part files hold whole traces in trace_id order, each trace's rows in
their `flatten` order (`PartWriter`). `tests/test_scale.py` checks, table by table, that a trace
flattened in a group equals it flattened alone, on real and synthetic traces.

One module per stage of a task (`task.run_group`): decode (the group's tables), bands, link (and
cost), run_tables, facts (and a trace flattened alone), task (the group, then the part files).
"""

from pipeline.dataset.group.facts import flatten_alone
from pipeline.dataset.group.task import run_group

__all__ = ["flatten_alone", "run_group"]
