"""`tracepipe mcp DATASET`: an MCP server over a dataset, driven by the MCP SDK's own client over
stdio. Its answers equal the commands'; nothing a client sends reads or writes outside the
dataset, runs past its time limit or comes back unbounded; the server keeps serving after an error."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from conftest import PROJECT, run_cli

pytest.importorskip("mcp")
pytest.importorskip("duckdb")

from pipeline.dataset.sandbox import Refused, check
from pipeline.integrations.mcp import bounded

TOOLS = {"list_traces", "schema", "query", "analyze", "findings", "compare", "ranks"}
SECRET = "outside-the-dataset-4711"


def session(args: list[str], calls: list[tuple[str, dict]]):
    """Start `tracepipe mcp ARGS` and make `calls` in one session: (tool names, the server's
    instructions, [(is_error, text, seconds)])."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = {k: v for k, v in os.environ.items() if k != "TRACEPIPE_DEBUG"}

    async def go():
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "pipeline", "mcp", *args], env=env, cwd=PROJECT
        )
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            init = await s.initialize()
            names = {t.name for t in (await s.list_tools()).tools}
            out = []
            for tool, a in calls:
                t0 = time.perf_counter()
                res = await asyncio.wait_for(s.call_tool(tool, a), 120)
                text = "\n".join(getattr(c, "text", "") for c in res.content or [])
                out.append((bool(res.is_error), text, time.perf_counter() - t0))
            return names, init.instructions, out

    return asyncio.run(asyncio.wait_for(go(), 600))


def same(a, b) -> bool:
    """Equal JSON values, floats to 1e-9 relative: two runs of `compare` itself differ in the last
    digits of a p-value (parallel float sums add in any order)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == pytest.approx(b, rel=1e-9)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def cli_json(*args):
    p = run_cli(args)
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    """A dataset of two synthetic runs of 2 ranks each (`demo-run`), the second with a late rank."""
    tmp = tmp_path_factory.mktemp("mcp")
    for name, delay in (("monday", 1.0), ("tuesday", 4000.0)):
        args = ["--world", "2", "--collectives", "8", "--straggler", "1", "--delayed", "3", "--delay-us", delay]
        p = run_cli(["demo-run", tmp / "src" / name, *args])
        assert p.returncode == 0, p.stderr
    (tmp / "src" / "broken").mkdir()
    (tmp / "src" / "broken" / "cut.json").write_text('{"traceEvents": 7}')  # quarantined by batch
    p = run_cli(["batch", tmp / "src", "-o", tmp / "ds", "-q", "-j", "1"])
    assert p.returncode == 1, p.stderr
    return tmp / "ds"


@pytest.fixture(scope="module")
def real_ds(shared_traces, tmp_path_factory) -> Path:
    """Two real traces of different runs (an A100 control, a V100 test) batched into one dataset."""
    tmp = tmp_path_factory.mktemp("mcp_real")
    for run, name in (("control", "diff_control_a100"), ("test", "diff_test_v100")):
        (tmp / "src" / run).mkdir(parents=True)
        shutil.copy(shared_traces / "hta" / f"{name}.json.gz", tmp / "src" / run)
    p = run_cli(["batch", tmp / "src", "-o", tmp / "ds", "-q", "-j", "1"])
    assert p.returncode == 0, p.stderr
    return tmp / "ds"


# ---------------------------------------------------------------- the parse-level wall, alone
@pytest.mark.parametrize(
    "sql, said",
    [
        ("copy (select 1) to '/tmp/x.csv'", "COPY is refused"),
        ("attach '/tmp/x.db' as x", "ATTACH is refused"),
        ("install httpfs", "INSTALL is refused"),
        ("load httpfs", "LOAD is refused"),
        ("pragma database_list", "PRAGMA is refused"),
        ("set threads = 8", "SET is refused"),
        ("drop view gpu_ops", "DROP is refused"),
        ("create table t as select 1", "CREATE is refused"),
        ("select 1; select 2", "one statement at a time"),
        ("select * from read_csv('/etc/passwd')", "table function read_csv() is refused"),
        ("select * from read_text('/etc/hostname')", "table function read_text() is refused"),
        ("with a as (select * from glob('/etc/*')) select * from a", "table function glob() is refused"),
        ("select (select count(*) from query('select 1'))", "table function query() is refused"),
        ("select * from '/etc/passwd'", "no table '/etc/passwd'"),
        ("select * from other.main.gpu_ops", "no table 'other.main.gpu_ops'"),
        ("select * from duckdb_settings()", "table function duckdb_settings() is refused"),
    ],
)
def test_check_refuses_all_but_a_select_over_the_tables(sql, said):
    with pytest.raises(Refused, match=said.replace("(", r"\(").replace(")", r"\)")):
        check(sql, ("gpu_ops", "events"))


def test_check_passes_selects_ctes_and_safe_table_functions():
    tables = ("gpu_ops", "events")
    for sql in (
        "select count(*) from gpu_ops;",
        "with k as (select name from gpu_ops) select * from k join events using (name)",
        "from gpu_ops select name",
        "select * from range(3)",
        "describe gpu_ops",
        "select unnest([1, 2])",
    ):
        assert check(sql, tables) == sql.rstrip(";")


def test_bounded_cuts_the_longest_lists_and_says_so():
    doc = {"rows": [{"name": "k" * 90, "us": i} for i in range(1000)], "small": [1, 2]}
    text = bounded(doc, 10_000)
    got = json.loads(text)
    assert len(text) <= 10_000 and len(doc["rows"]) == 1000  # the answer itself stays whole
    assert 50 < len(got["rows"]) < 1000 and got["rows"] == doc["rows"][: len(got["rows"])]
    assert got["cut"]["lists"] == {"$.rows": f"{len(got['rows'])} of 1000"}
    assert bounded({"a": 1}, 1000) == '{"a": 1}'


# ---------------------------------------------------------------- the server over stdio
def test_every_tool_answers_as_the_command_does(two_runs):
    ds = two_runs
    tid = cli_json("query", ds, "select trace_id from trace order by trace_id", "-f", "json")[0]["trace_id"]
    calls = [
        ("list_traces", {}),
        ("list_traces", {"run": "tuesday", "rank": 1}),
        ("schema", {"table": "gpu_ops"}),
        ("query", {"sql": "select kind, count(*) as n, sum(dur_ns) as ns from gpu_ops group by kind order by kind"}),
        ("analyze", {"trace": tid, "section": "kernels"}),
        ("analyze", {}),
        ("findings", {"trace": tid}),
        ("compare", {"base": "monday", "new": "tuesday"}),
        ("ranks", {"run": str(ds.parent / "src" / "tuesday")}),
        ("findings", {"run": str(ds.parent / "src" / "tuesday")}),
        ("analyze", {"trace": tid, "section": "no-such-section"}),
        ("query", {"sql": "select count(*) as n from trace"}),  # still serving after an error
    ]
    names, instructions, res = session([str(ds), "--max-chars", "10000000"], calls)
    assert names == TOOLS and "list_traces" in instructions
    (e_list, t_list, _), (e_some, t_some, _), (e_schema, t_schema, _), (e_q, t_q, _) = res[:4]
    want = cli_json("query", ds, "select trace_id, stem, rank from trace order by trace_id", "-f", "json")
    listed = json.loads(t_list)
    assert not e_list and listed["count"] == 4
    assert sorted((t["trace_id"], t["stem"], t["rank"]) for t in listed["traces"]) == [
        (w["trace_id"], w["stem"], w["rank"]) for w in want
    ]
    assert all(t["devices"] and t["run"].endswith(("monday", "tuesday")) for t in listed["traces"])
    (bad,) = listed["not_read"]
    assert bad["path"].endswith("broken/cut.json") and bad["status"] == "quarantined" and bad["error"]
    some = json.loads(t_some)["traces"]
    assert not e_some and [(t["run"].rsplit("/", 1)[-1], t["rank"]) for t in some] == [("tuesday", 1)]
    cols = {c["name"]: c for c in json.loads(t_schema)["tables"][0]["columns"]}
    assert not e_schema and cols["dur_ns"]["type"] == "BIGINT" and cols["dur_ns"]["unit"] == "ns"
    sql = calls[3][1]["sql"]
    q = json.loads(t_q)
    assert not e_q and q["truncated"] is False and q["rows"] == cli_json("query", ds, sql, "-f", "json")
    e, text, _ = res[4]
    p = run_cli(["analyze", ds, "-t", tid, "--section", "kernels", "-f", "json"])
    assert not e and text == p.stdout  # byte for byte
    e, text, _ = res[5]
    assert not e and "kernels" in [s["name"] for s in json.loads(text)["sections"]]
    e, text, _ = res[6]
    p = run_cli(["analyze", ds, "-t", tid, "--section", "findings", "-f", "json"])
    assert not e and json.loads(text) == json.loads(p.stdout)  # exit 1: the dataset has a quarantined file
    e, text, _ = res[7]
    p = run_cli(["compare", ds, "--base", "monday", "--new", "tuesday", "-f", "json"])
    assert not e and same(json.loads(text), json.loads(p.stdout))
    e, text, _ = res[8]
    p = run_cli(["ranks", ds, "--run", str(ds.parent / "src" / "tuesday"), "-f", "json"])
    assert not e and same(json.loads(text), json.loads(p.stdout))
    e, text, _ = res[9]
    run = json.loads(p.stdout)["runs"][0]
    assert "findings" in run  # ranks gives a run's findings across its ranks: the tool gives the same
    assert not e and same(json.loads(text), {"run": run["run"], "findings": run["findings"]})
    e, text, _ = res[10]
    assert e and "unknown section 'no-such-section'; sections: " in text and "\n" not in text.strip()
    e, text, _ = res[11]
    assert not e and json.loads(text)["rows"] == [{"n": 4}]


def test_hostile_requests_are_refused_and_nothing_is_read_or_written(two_runs, tmp_path):
    secret, leak, db = tmp_path / "outside.txt", tmp_path / "leak.csv", tmp_path / "x.db"
    secret.write_text(SECRET + "\n")
    before = sorted(p.name for p in two_runs.rglob("*"))
    hostile = [
        ("query", {"sql": f"copy (select * from gpu_ops) to '{leak}'"}),
        ("query", {"sql": f"select * from read_csv('{secret}')"}),
        ("query", {"sql": f"select * from read_text('{secret}')"}),
        ("query", {"sql": f"select * from '{secret}'"}),
        ("query", {"sql": f"attach '{db}' as x"}),
        ("query", {"sql": "install httpfs"}),
        ("query", {"sql": "load httpfs"}),
        ("query", {"sql": "drop table gpu_ops"}),
        ("query", {"sql": "set enable_external_access = true"}),
        ("query", {"sql": f"select * from read_parquet('{two_runs}/../../**/*.parquet')"}),
        ("analyze", {"trace": "../../../../etc/passwd", "section": "kernels"}),
        ("analyze", {"trace": str(secret), "section": "kernels"}),
        ("findings", {"run": "../../etc"}),
        ("ranks", {"run": "/etc"}),
        ("query", {"sql": "select count(*) as n from gpu_ops"}),
    ]
    _, _, res = session([str(two_runs)], hostile)
    for (tool, a), (err, text, _) in zip(hostile[:-1], res[:-1]):
        assert err, f"{tool} {a} was not refused: {text[:200]}"
        assert SECRET not in text and "Traceback" not in text and len(text.strip().splitlines()) == 1
    assert not leak.exists() and not db.exists()
    assert sorted(p.name for p in two_runs.rglob("*")) == before
    err, text, _ = res[-1]
    assert not err and json.loads(text)["rows"][0]["n"] > 0  # the dataset is whole, the server serving


@pytest.mark.slow
def test_a_runaway_query_is_stopped_and_a_large_one_cut(two_runs):
    calls = [  # 132 events: 132^5 = 4e10 rows to count
        ("query", {"sql": "select count(*) from events a, events b, events c, events d, events e"}),
        ("query", {"sql": "select * from events"}),
        ("query", {"sql": "select * from events", "max_rows": 5}),
        ("query", {"sql": "select count(*) as n from events"}),
    ]
    _, _, res = session([str(two_runs), "--time-limit", "3", "--max-chars", "20000"], calls)
    err, text, sec = res[0]
    assert err and "time limit of 3 s" in text and sec < 30
    err, text, _ = res[1]
    got = json.loads(text)
    assert not err and len(text) <= 20_000 and got["truncated"] is True and "first" in got["note"]
    assert got["cut"]["lists"]["$.rows"].endswith("of 100")  # 100 rows asked, fewer fit
    err, text, _ = res[2]
    assert not err and json.loads(text)["row_count"] == 5 and json.loads(text)["truncated"] is True
    err, text, _ = res[3]
    n = cli_json("query", two_runs, "select count(*) as n from events", "-f", "json")[0]["n"]
    assert not err and json.loads(text)["rows"] == [{"n": n}]


@pytest.mark.real
@pytest.mark.slow
def test_real_traces_answers_equal_the_cli(real_ds):
    """On two real traces of two runs: the trace list, row counts, a section, and the comparison
    of the runs (which an agent reads to find the regression) are what the commands give."""
    ids = [r["trace_id"] for r in cli_json("query", real_ds, "select trace_id from trace order by 1", "-f", "json")]
    sql = "select t.stem, count(*) as n from gpu_ops g join trace t using (trace_id) group by 1 order by 1"
    calls = [
        ("list_traces", {"device": "v100"}),
        ("query", {"sql": sql}),
        ("analyze", {"trace": ids[0], "section": "devices"}),
        ("compare", {"base": "control", "new": "test", "level": ["category"]}),
    ]
    _, _, res = session([str(real_ds), "--max-chars", "10000000"], calls)
    err, text, _ = res[0]
    assert not err and [t["stem"] for t in json.loads(text)["traces"]] == ["diff_test_v100"]
    err, text, _ = res[1]
    assert not err and json.loads(text)["rows"] == cli_json("query", real_ds, sql, "-f", "json")
    err, text, _ = res[2]
    assert not err and text == run_cli(["analyze", real_ds, "-t", ids[0], "--section", "devices", "-f", "json"]).stdout
    err, text, _ = res[3]
    want = cli_json("compare", real_ds, "--base", "control", "--new", "test", "--level", "category", "-f", "json")
    assert not err and same(json.loads(text), want)


def test_a_folder_of_trace_files_is_refused_at_start(tmp_path):
    p = run_cli(["mcp", tmp_path])
    assert p.returncode == 2 and "not a batch dataset" in p.stderr and "tracepipe batch" in p.stderr
