"""An agent-like session with `tracepipe mcp DATASET`, driven by the MCP SDK's client over stdio, printed
as the Markdown transcript in docs/guides/mcp.md: what changed between two runs, and why.

    python scripts/mcp_transcript.py DATASET BASE NEW

Each answer is shown in part (the regressed rows of the comparison, the first rows of a query).
"""

from __future__ import annotations

import asyncio
import json
import sys


def short(text: str, keep: int = 700) -> str:
    return text if len(text) <= keep else text[:keep] + f" … ({len(text):,} characters in all)"


async def main(ds: str, base: str, new: str) -> None:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    async with (
        stdio_client(StdioServerParameters(command="tracepipe", args=["mcp", ds])) as (r, w),
        ClientSession(r, w) as s,
    ):
        await s.initialize()
        tools = [t.name for t in (await s.list_tools()).tools]
        print(f"tools: {', '.join(tools)}\n")

        async def call(tool: str, args: dict, show=short) -> dict | None:
            res = await s.call_tool(tool, args)
            text = "\n".join(getattr(c, "text", "") for c in res.content or [])
            print(f"**{tool}** `{json.dumps(args)}`" + (" → tool error" if res.is_error else ""))
            print("```json" if not res.is_error else "```")
            print(show(text) if not res.is_error else text)
            print("```\n")
            return None if res.is_error else json.loads(text)

        def traces(text: str) -> str:
            keys = ("trace_id", "stem", "run", "rank", "devices", "n_kernels")
            rows = [{k: t[k] for k in keys} for t in json.loads(text)["traces"]]
            return json.dumps(rows, indent=1)

        await call("list_traces", {}, traces)

        def regressed(text: str) -> str:
            doc = json.loads(text)
            keys = ("level", "name", "verdict", "delta_pct", "base_us", "new_us", "q", "base_count", "new_count")
            rows = [{k: r[k] for k in keys} for r in doc["rows"] if r["verdict"] == "regressed"]
            return json.dumps({"summary": doc["summary"], "rows (regressed only)": rows}, indent=1)

        await call("compare", {"base": base, "new": new, "level": ["kernel", "category"]}, regressed)
        sql = (
            "SELECT t.stem, g.cpu_op_name, count(*) AS copies, sum(g.dur_ns) / 1e3 AS us "
            "FROM gpu_ops g JOIN trace t USING (trace_id) WHERE g.name LIKE 'Memcpy DtoD%' "
            "GROUP BY 1, 2 ORDER BY us DESC LIMIT 4"
        )
        await call("query", {"sql": sql}, lambda t: json.dumps(json.loads(t)["rows"], indent=1))
        found = await call("list_traces", {"run": new, "device": "v100"}, lambda t: short(t, 160))
        tid = found["traces"][0]["trace_id"] if found else ""

        def transfers(text: str) -> str:
            keys = ("name", "count", "dur_us", "pct", "bytes", "achieved_bw_pct")
            rows = [{k: r.get(k) for k in keys} for d in json.loads(text)["devices"] for r in d["transfers"]]
            return json.dumps(rows, indent=1)

        await call("analyze", {"trace": tid, "section": "transfers", "top": 2}, transfers)
        await call("findings", {"trace": tid}, lambda t: short(t, 1500))
        await call("query", {"sql": f"COPY gpu_ops TO '{ds}/../copy.csv'"})


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
