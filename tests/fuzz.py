"""Mutation fuzzing of the commands that read traces: flatten, augment, analyze, combine.

Each case takes a seed trace (synthetic, or a small real one from ../shared/traces), applies one to
three mutations (byte flips, cuts, duplicated spans, deep nesting, huge numbers and strings, invalid
UTF-8, NaN/Infinity, a wrong type in some field, a key dropped, the top level broken), writes it
plain or gzipped and runs each command in-process. A case passes when every command exits as the
README documents (0 ok, 1 problems reported, 2 bad input; never 3, an internal error, and never an
exception), says at most a few lines on stderr, and leaves its output complete (it reads back) or
absent.

    python tests/fuzz.py --n 1000 [--seed 1] [--seconds 600]   # `make fuzz N=100000` for a long run
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS), str(TESTS.parent)]

from pipeline import cli  # noqa: E402
from pipeline import synthetic as synth  # noqa: E402

SMALL_REAL = ("hta/mi250_rocm62_minitoy", "hta/triton_example", "hta/cpu_only", "hta/old_capitalized_cats")
FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args", "bp", "s")
ARG_FIELDS = (
    "correlation",
    "External id",
    "device",
    "stream",
    "Input Dims",
    "Input type",
    "Concrete Inputs",
    "grid",
    "block",
    "bytes",
    "Collective name",
    "In msg nelems",
)
WRONG = (
    "",
    "x",
    "12",
    "1e400",
    "NaN",
    None,
    True,
    [],
    [1, "a"],
    {},
    {"a": [1]},
    -1,
    0,
    2**63,
    2**70,
    -(2**63),
    1.5,
    -0.0,
    1e308,
    "\ud800",
    "é" * 20,
    [[[[]]]],
)


# ------------------------------------------------------------------ seeds
def seeds(shared: Path | None) -> list[tuple[str, bytes]]:
    """(name, JSON text) of the traces mutated: synthetic layouts, and small real traces when present."""
    out = [
        (f"synth-{layout}", synth.dumps_trace(synth.make_trace(n_steps=2, layout=layout, tricky=True)))
        for layout in ("new", "old", "oldest")
    ]
    out.append(("synth-after", synth.dumps_trace(synth.make_trace(n_steps=2, metadata_after=True))))
    out.append(("synth-ns", synth.dumps_trace(synth.make_trace(n_steps=1, ns_digits=True))))
    for name in SMALL_REAL if shared else ():
        p = shared / f"{name}.json.gz"
        if p.is_file():
            out.append((name, gzip.open(p, "rb").read()))
    return out


# ------------------------------------------------------------------ mutations (bytes -> bytes)
def flip_bytes(r: random.Random, b: bytes) -> bytes:
    a = bytearray(b)
    for _ in range(r.randint(1, 8)):
        a[r.randrange(len(a))] = r.randrange(256)
    return bytes(a)


def cut(r: random.Random, b: bytes) -> bytes:
    return b[: r.randrange(len(b))]


def duplicate_span(r: random.Random, b: bytes) -> bytes:
    i = r.randrange(len(b))
    j = min(len(b), i + r.randint(1, 400))
    k = r.randrange(len(b))
    return b[:k] + b[i:j] + b[k:]


def invalid_utf8(r: random.Random, b: bytes) -> bytes:
    i = b.find(b'"name": "', r.randrange(len(b)))
    i = i + 9 if i >= 0 else r.randrange(len(b))
    return b[:i] + r.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\\ud800"]) + b[i:]


def nan_infinity(r: random.Random, b: bytes) -> bytes:
    for _ in range(r.randint(1, 3)):
        i = b.find(b'"ts": ', r.randrange(len(b)))
        if i < 0:
            break
        j = i + 6
        end = j
        while end < len(b) and b[end : end + 1] in b"0123456789.-eE+":
            end += 1
        b = b[:j] + r.choice([b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b"1" * 40]) + b[end:]
    return b


def _events(b: bytes) -> dict | None:
    try:
        d = json.loads(b)
    except (ValueError, RecursionError):
        return None
    return d if isinstance(d, dict) and isinstance(d.get("traceEvents"), list) and d["traceEvents"] else None


def _dump(d) -> bytes:
    return json.dumps(d, ensure_ascii=False).encode("utf-8", "surrogatepass")


def wrong_type(r: random.Random, b: bytes) -> bytes:
    d = _events(b)
    if d is None:
        return flip_bytes(r, b)
    for _ in range(r.randint(1, 5)):
        e = r.choice(d["traceEvents"])
        if not isinstance(e, dict):
            continue
        if r.random() < 0.5 or not isinstance(e.get("args"), dict):
            e[r.choice(FIELDS)] = r.choice(WRONG)
        else:
            e["args"][r.choice(ARG_FIELDS)] = r.choice(WRONG)
    return _dump(d)


def drop_key(r: random.Random, b: bytes) -> bytes:
    d = _events(b)
    if d is None:
        return cut(r, b)
    for e in r.sample(d["traceEvents"], min(5, len(d["traceEvents"]))):
        if isinstance(e, dict) and e:
            e.pop(r.choice(list(e)))
    return _dump(d)


def deep_nesting(r: random.Random, b: bytes) -> bytes:
    d = _events(b)
    if d is None:
        return b
    n = r.choice([100, 300, 1100, 5000])
    e = r.choice([x for x in d["traceEvents"] if isinstance(x, dict)] or [{}])
    text = _dump(d)
    marker = "@@DEEP@@"
    e.setdefault("args", {}) if isinstance(e.get("args"), dict) else e.__setitem__("args", {})
    e["args"]["deep"] = marker
    text = _dump(d)
    return text.replace(
        f'"{marker}"'.encode(), (r.choice("[{") == "[" and b"[" * n + b"]" * n) or (b'{"a":' * n + b"1" + b"}" * n)
    )


def huge_values(r: random.Random, b: bytes) -> bytes:
    d = _events(b)
    if d is None:
        return b
    e = r.choice([x for x in d["traceEvents"] if isinstance(x, dict)] or [{}])
    e[r.choice(("name", "cat", "ts", "dur", "pid"))] = r.choice(
        ["S" * r.choice([10_000, 300_000]), 10 ** r.randint(19, 60), -(10**25), 1e300, list(range(50_000))]
    )
    return _dump(d)


def break_top(r: random.Random, b: bytes) -> bytes:
    d = _events(b)
    if d is None:
        return b
    choice = r.randrange(6)
    if choice == 0:
        d["traceEvents"] = r.choice([{}, "x", None, 3])
    elif choice == 1:
        d["deviceProperties"] = r.choice([{}, "x", [1, None, {"id": "a"}], [{"id": 2**70, "name": 5}]])
    elif choice == 2:
        d["distributedInfo"] = r.choice([[], "x", {"rank": "3", "world_size": -1}, {"rank": 2**80}])
    elif choice == 3:
        return _dump(d["traceEvents"])  # a bare list
    elif choice == 4:
        d["traceEvents"].insert(r.randrange(len(d["traceEvents"])), r.choice(WRONG))
    else:
        return _dump({k: d[k] for k in reversed(list(d))})  # traceEvents first or last
    return _dump(d)


MUTATIONS = (
    flip_bytes,
    cut,
    duplicate_span,
    invalid_utf8,
    nan_infinity,
    wrong_type,
    drop_key,
    deep_nesting,
    huge_values,
    break_top,
)


# ------------------------------------------------------------------ running the commands
@dataclass
class Outcome:
    cases: int = 0
    by_exit: Counter = field(default_factory=Counter)  # (command, exit code) -> runs
    failures: list = field(default_factory=list)  # (case, command, what)

    def summary(self) -> str:
        per = Counter()
        for (_, rc), n in self.by_exit.items():
            per[rc] += n
        codes = ", ".join(f"exit {rc}: {n}" for rc, n in sorted(per.items()))
        return f"{self.cases} cases, {sum(per.values())} runs ({codes}), {len(self.failures)} failures"


def _run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = cli.run(argv)
        except BaseException as e:
            return -1, f"{type(e).__name__}: {e}"
    return rc, err.getvalue()


def _complete(kind: str, out: Path) -> bool:
    """Whether an output reads back whole: a flattened directory's tables, a trace's JSON."""
    try:
        if kind == "flatten":
            import pyarrow.parquet as pq

            d = next(p for p in out.iterdir() if p.is_dir())
            return all(
                pq.read_table(d / f"{t}.parquet") is not None
                for t in ("events", "gpu_ops", "flows", "devices", "trace")
            )
        opener = gzip.open if out.name.endswith(".gz") else open
        with opener(out, "rt") as f:
            return isinstance(json.load(f).get("traceEvents"), list)
    except Exception:
        return False


def _leftovers(root: Path) -> list[str]:
    return [p.name for p in root.rglob("*") if ".tmp-" in p.name or ".old-" in p.name]


def check_case(path: Path, work: Path, case: str, outcome: Outcome):
    runs = {
        "flatten": (["flatten", str(path), "-o", str(work / "flat"), "-q"], work / "flat"),
        "augment": (["augment", str(path), "-o", str(work / "aug.json.gz"), "-q"], work / "aug.json.gz"),
        "analyze": (["analyze", str(path), "-f", "json", "-o", str(work / "r.json")], work / "r.json"),
        "combine": (["combine", str(path), str(path), "-o", str(work / "comb.json"), "-q"], work / "comb.json"),
    }
    for kind, (argv, out) in runs.items():
        rc, said = _run(argv)
        outcome.by_exit[(kind, rc)] += 1
        lines = [ln for ln in said.splitlines() if ln.strip()]
        problem = None
        if rc not in (0, 1, 2):
            problem = f"exit {rc}: {said.strip()[:300]}"
        elif "Traceback" in said or len(lines) > 6:
            problem = f"stderr of {len(lines)} lines: {said.strip()[:300]}"
        elif rc == 2 and out.exists() and (out.is_file() or any(out.iterdir())):
            problem = "exit 2 but output written"
        elif rc in (0, 1) and kind != "analyze" and not _complete(kind, out):
            problem = "output missing or incomplete"
        elif _leftovers(work):
            problem = f"temporary files left: {_leftovers(work)[:3]}"
        if problem:
            outcome.failures.append((case, kind, problem))
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()


def fuzz(
    n: int,
    seed: int = 0,
    seconds: float | None = None,
    shared: Path | None = None,
    keep: Path | None = None,
    at_least: int = 0,
) -> Outcome:
    """Run n cases (or until `seconds` pass, once `at_least` have run: a loaded machine runs
    fewer in the time, not a smaller suite); failing inputs are copied into `keep` if given."""
    r = random.Random(seed)
    pool = seeds(shared)
    outcome = Outcome()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tracepipe-fuzz-") as tmp:
        for i in range(n):
            if seconds is not None and i >= at_least and time.monotonic() - start > seconds:
                break
            name, text = r.choice(pool)
            applied = r.sample(MUTATIONS, r.randint(1, 3))
            for m in applied:
                text = m(r, text) if text else text
            gz = r.random() < 0.3
            case = f"{i}:{name}:{'+'.join(m.__name__ for m in applied)}{':gz' if gz else ''}"
            work = Path(tmp) / f"c{i}"
            work.mkdir()
            path = work / ("case.json.gz" if gz else "case.json")
            path.write_bytes(gzip.compress(text, 1) if gz else text)
            before = len(outcome.failures)
            check_case(path, work, case, outcome)
            if keep is not None and len(outcome.failures) > before:
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, keep / f"case{i}{''.join(path.suffixes)}")
            shutil.rmtree(work)
            outcome.cases += 1
    return outcome


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--keep", type=Path, default=Path("fuzz-failures"), help="where failing inputs are copied")
    a = ap.parse_args()
    shared = TESTS.parents[1] / "shared" / "traces"
    out = fuzz(a.n, a.seed, a.seconds, shared if shared.is_dir() else None, a.keep)
    for case, kind, what in out.failures[:50]:
        print(f"FAIL {case} {kind}: {what}")
    print(out.summary())
    sys.exit(1 if out.failures else 0)


if __name__ == "__main__":
    main()
