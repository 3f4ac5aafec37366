"""Hostile but fair input and environments: usage errors, permissions, deep nesting, a full disk,
the end of a document, SQL paths, secrets, bombs, FIFOs, huge values, faults in batch."""

from __future__ import annotations

import gzip
import io
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import PROJECT, shared_memory_folders, shared_memory_left
from pipeline import synthetic as synth
from pipeline.dataset import batch, inputs, layout
from pipeline.flatten import flatten
from pipeline.read import limits, tame

TOKEN = "hf_" + "Q7x" * 12


def cli(*args, cwd=None, env=None, preexec=None, timeout=300) -> subprocess.CompletedProcess:
    """The CLI in a subprocess where `import click` fails, as in a clean environment with typer 0.29
    (which vendors click and no longer installs it)."""
    blocker = Path(__file__).with_name("no_click")
    env = {
        **{k: v for k, v in os.environ.items() if k != "TRACEPIPE_DEBUG"},
        **(env or {}),
        "PYTHONPATH": f"{blocker}{os.pathsep}{PROJECT}",
    }
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd or PROJECT,
        env=env,
        preexec_fn=preexec,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def one_line(p: subprocess.CompletedProcess, rc: int) -> bool:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    return p.returncode == rc and "Traceback" not in p.stderr and len(lines) == 1


def small_trace(tmp_path: Path, name="t.json", **top) -> Path:
    trace = synth.make_trace(n_steps=2)
    trace.update(top)
    tmp_path.mkdir(parents=True, exist_ok=True)
    return synth.write_trace(trace, tmp_path / name)


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


# ------------------------------------------------------------------ usage errors
@pytest.mark.parametrize(
    "args, says",
    [
        (["flatten", "x.json.gz"], "Missing option '-o'"),
        (["analyse", "x"], "Did you mean 'analyze'"),
        (["schema", "kernels"], "no table 'kernels'"),
        (["analyze", "x", "-q"], "No such option: -q"),
        (["flatten", "x", "-o", "y", "--bogus"], "No such option: --bogus"),
        (["analyze", "x", "--top", "many"], "'--top'"),
    ],
)
def test_usage_errors_are_one_line_exit_2_without_click(args, says):
    p = cli(*args)
    assert one_line(p, 2), p.stderr
    assert says in p.stderr and "--help" in p.stderr


def test_no_click_blocker_works():
    p = subprocess.run(
        [sys.executable, "-c", "import click"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).with_name("no_click"))},
    )
    assert p.returncode != 0 and "ModuleNotFoundError" in p.stderr


# ------------------------------------------------------------------ permissions
def test_outputs_follow_the_umask(tmp_path):
    src = small_trace(tmp_path / "src")
    wrong = []
    for umask, dmode, fmode in ((0o022, 0o755, 0o644), (0o077, 0o700, 0o600), (0o002, 0o775, 0o664)):
        out, ds = tmp_path / f"flat{umask:o}", tmp_path / f"ds{umask:o}"
        set_umask = lambda u=umask: os.umask(u)
        assert cli("flatten", src, "-o", out, "-q", preexec=set_umask).returncode == 0
        assert cli("batch", src.parent, "-o", ds, "-q", preexec=set_umask).returncode == 0
        assert cli("augment", src, "-o", tmp_path / f"aug{umask:o}.json", "-q", preexec=set_umask).returncode == 0
        for p in [out, ds, *out.rglob("*"), *ds.rglob("*"), tmp_path / f"aug{umask:o}.json"]:
            want = dmode if p.is_dir() else fmode
            if stat.S_IMODE(p.stat().st_mode) != want and p.name != ".lock":
                wrong.append(f"{p.relative_to(tmp_path)} {stat.S_IMODE(p.stat().st_mode):o} (umask {umask:o})")
    assert not wrong, wrong[:5]


# ------------------------------------------------------------------ deep nesting
def test_deeply_nested_args_are_kept_as_text_by_every_command(tmp_path):
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"op{i}",
            "pid": 1,
            "tid": 1,
            "ts": i,
            "dur": 1,
            "args": {"x": "DEEP" if i == 3 else i},
        }
        for i in range(10)
    ]
    deep = "[" * 5000 + "]" * 5000
    path = tmp_path / "deep.json"
    path.write_text(json.dumps({"traceEvents": events}).replace('"DEEP"', deep))
    r = flatten(path, tmp_path / "flat")
    args = pq.read_table(r.out_dir / "events.parquet").column("args_json").to_pylist()
    kept, levels = json.loads(args[3])["x"], 0  # the first levels as values, the rest as its text
    while isinstance(kept, list):
        kept, levels = kept[0], levels + 1
    assert len(args) == 10 and 0 < levels < tame.MAX_DEPTH and kept == deep[levels:-levels]
    assert r.problems == {f"coerced:{tame.TOO_DEEP}": 1}
    for cmd in (
        ["augment", path, "-o", tmp_path / "a.json"],
        ["combine", path, path, "-o", tmp_path / "c.json"],
        ["analyze", path, "-f", "json"],
    ):
        p = cli(*cmd)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    a = json.loads((tmp_path / "a.json").read_text())["traceEvents"]
    names = [e["name"] for e in a[: len(events)]]  # then augment's tracks (rewrite.tracks)
    assert a[3]["args"]["x"] == json.loads(args[3])["x"] and names == [e["name"] for e in events]


def test_tame_deep_replaces_only_what_is_too_deep():
    text = b'{"a": [[1, "]"], {"b": "[["}]}, {"c": ' + b"[" * 10 + b'"x"' + b"]" * 10 + b"}"
    out, n = tame.tame_deep(text, max_depth=4)
    assert n == 1
    events = json.loads(b"[" + out + b"]")
    assert events[0] == {"a": [[1, "]"], {"b": "[["}]}
    assert events[1]["c"][0][0][0] == "[" * 7 + '"x"' + "]" * 7


# ------------------------------------------------------------------ a full disk
def _file_size_limit(n: int):
    def limit():  # writes past n bytes fail with EFBIG, as on a full disk, instead of killing us
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))

    return limit


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    src = tmp_path / "big.json"
    synth.write_big_trace(src, 3 << 20)
    before = shared_memory_folders()
    for cmd, out in (
        (["flatten", src, "-o", tmp_path / "flat"], tmp_path / "flat"),
        (["flatten", src, "-j", "2", "-o", tmp_path / "flat2"], tmp_path / "flat2"),  # writes in a thread
        (["augment", src, "-o", tmp_path / "aug.json"], tmp_path / "aug.json"),
        (["analyze", src, "-f", "json", "-o", tmp_path / "r.json"], tmp_path / "r.json"),
    ):
        p = cli(*cmd, preexec=_file_size_limit(200_000))
        assert one_line(p, 2), (cmd[0], p.returncode, p.stderr)
        assert "File too large" in p.stderr or "No space" in p.stderr
        assert not files_under(out) and not out.is_file(), cmd[0]
    assert not shared_memory_left(before)


def test_bad_input_leaves_no_output_folder(tmp_path):
    """A file that is no trace is one line, exit 2, and the -o folder flatten would have made is not
    left behind empty; a folder that was there before stays."""
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip")
    (tmp_path / "notrace.json").write_text('{"a": 1}')
    for name in ("bad.json.gz", "notrace.json"):
        out = tmp_path / f"out-{name}"
        p = cli("flatten", tmp_path / name, "-o", out)
        assert one_line(p, 2) and name in p.stderr, p.stderr
        assert not out.exists(), name
    kept = tmp_path / "kept"
    kept.mkdir()
    assert one_line(cli("flatten", tmp_path / "notrace.json", "-o", kept), 2)
    assert kept.is_dir() and not any(kept.iterdir())


# ------------------------------------------------------------------ the end of a document
def test_a_document_cut_after_the_events_is_truncated(tmp_path):
    events = synth.make_trace(n_steps=1)["traceEvents"]
    text = json.dumps({"traceEvents": events, "deviceProperties": [synth.DEVICE_PROPS]})
    cut = tmp_path / "cut.json"
    cut.write_text(text[: text.index(', "deviceProperties"')])
    p = cli("flatten", cut, "-o", tmp_path / "out")
    assert p.returncode == 1 and "truncated" in p.stderr and "after traceEvents" in p.stderr
    assert pq.read_table(tmp_path / "out/cut/events.parquet").num_rows == len(events)
    assert pq.read_table(tmp_path / "out/cut/trace.parquet").column("truncated")[0].as_py() is True


@pytest.mark.parametrize("where", ["before", "after"])
def test_nan_in_metadata_is_read_as_json_load_reads_it(tmp_path, where):
    events = json.dumps(synth.make_trace(n_steps=1)["traceEvents"])
    body = (
        f'{{"x": NaN, "y": -Infinity, "traceEvents": {events}}}'
        if where == "before"
        else f'{{"traceEvents": {events}, "x": NaN, "y": -Infinity}}'
    )
    path = tmp_path / "nan.json"
    path.write_text(body)
    p = cli("flatten", path, "-o", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    meta = json.loads(pq.read_table(tmp_path / "out/nan/trace.parquet").column("metadata_json")[0].as_py())
    assert "x" in meta and "y" in meta


# ------------------------------------------------------------------ SQL
@pytest.fixture(scope="module")
def flat_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("sql")
    return flatten(small_trace(tmp), tmp / "flat").out_dir


def test_query_errors_are_one_line(flat_dir, tmp_path):
    for sql in ("select * from read_csv('/nonexistent/x.csv')", "select nonsense from", "select * from nope"):
        p = cli("query", flat_dir, sql)
        assert one_line(p, 2), (sql, p.stderr)


def test_sandbox_allows_only_the_dataset(flat_dir, tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("a\n1\n")
    sql = f"select * from read_csv('{other}')"
    assert cli("query", flat_dir, sql, "-f", "json").returncode == 0  # typed by the user: their files
    p = cli("query", flat_dir, sql, "--sandbox")
    assert one_line(p, 2) and "sandbox" in p.stderr
    f = tmp_path / "q.sql"
    f.write_text(sql)
    assert one_line(cli("query", flat_dir, "-F", f), 2)  # from a file: sandboxed by default
    assert cli("query", flat_dir, "-F", f, "--no-sandbox").returncode == 0
    f.write_text("select count(*) as n from events -- read_csv('x') in a comment is no call")
    assert cli("query", flat_dir, "-F", f).returncode == 0


def test_query_output_is_atomic(flat_dir, tmp_path):
    out = tmp_path / "r.csv"
    p = cli("query", flat_dir, "select * from events", "-f", "csv", "-o", out, preexec=_file_size_limit(2000))
    assert one_line(p, 2) and not out.exists() and not files_under(tmp_path)


# ------------------------------------------------------------------ secrets
def test_shared_outputs_carry_no_secret(tmp_path):
    src = small_trace(tmp_path, metadata={"system": {"env": {"HF_TOKEN": TOKEN, "HOME": "/root"}}})
    for cmd, out in (
        (["augment", src, "-o", tmp_path / "a.json"], tmp_path / "a.json"),
        (["combine", src, src, "-o", tmp_path / "c.json.gz"], tmp_path / "c.json.gz"),
    ):
        assert cli(*cmd).returncode == 0
        text = gzip.open(out, "rt").read() if out.suffix == ".gz" else out.read_text()
        assert TOKEN not in text and "/root" in text
        assert cli(*cmd, "--keep-secrets").returncode == 0
        text = gzip.open(out, "rt").read() if out.suffix == ".gz" else out.read_text()
        assert TOKEN in text


# ------------------------------------------------------------------ bombs, FIFOs, huge values
def test_a_zip_member_declaring_a_bomb_is_quarantined_unread(tmp_path):
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z, z.open("bomb.json", "w", force_zip64=True) as f:
        f.write(b'{"traceEvents": [')
        for _ in range(1100):
            f.write(b" " * (1 << 20))
        f.write(b"]}")
    p = cli("batch", bomb, "-o", tmp_path / "ds")
    assert p.returncode == 1 and "decompression bomb" in p.stderr
    assert not [f for f in files_under(tmp_path / "ds") if f.stat().st_size > 1 << 20]


def test_a_member_inflating_past_its_limit_is_stopped_and_removed(tmp_path):
    """A zip header may lie about the size: the bytes are counted as they are extracted."""
    item = inputs.extract_member(
        io.BytesIO(b"x" * 5000), "a.zip!m.json", "m.json", tmp_path / "x", 1, limit=4096, compressed=20
    )
    assert "decompression bomb" in item.rejected and item.path is None
    assert not files_under(tmp_path / "x")
    item = inputs.extract_member(
        io.BytesIO(b"x" * 4096), "a.zip!m.json", "m.json", tmp_path / "x", 2, limit=4096, compressed=20
    )
    assert item.rejected is None and Path(item.path).stat().st_size == 4096


def test_a_gzip_bomb_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "INFLATE_FLOOR", 1 << 20)
    path = tmp_path / "bomb.json.gz"
    with gzip.open(path, "wb") as f:
        f.write(b'{"traceEvents": [' + b" " * (8 << 20) + b"]}")
    from pipeline.errors import BadTrace

    with pytest.raises(BadTrace, match="decompression bomb"):
        flatten(path, tmp_path / "out")
    assert not files_under(tmp_path / "out")
    assert flatten(path, tmp_path / "out", max_inflate=0).n_events == 0


def test_fifos_and_devices_are_not_read(tmp_path):
    src = tmp_path / "src"
    small_trace(src, "good.json")
    os.mkfifo(src / "pipe.json")
    p = cli("batch", src, "-o", tmp_path / "ds", timeout=60)
    assert p.returncode == 1 and "pipe.json: quarantined: not a regular file (a FIFO)" in p.stderr
    p = cli("flatten", src / "pipe.json", "-o", tmp_path / "flat", timeout=60)
    assert one_line(p, 2) and "not a regular file" in p.stderr


def test_huge_values_are_cut_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(tame, "VALUE_LIMIT", 1 << 20)
    events = synth.make_trace(n_steps=3)["traceEvents"]
    events[5]["name"] = "N" * (3 << 20)
    events[7].setdefault("args", {})["shape"] = list(range(600_000))
    path = synth.write_trace({"traceEvents": events}, tmp_path / "huge.json")
    for compressed in (False, True):
        src = path if not compressed else synth.write_trace({"traceEvents": events}, tmp_path / "huge.json.gz", gz=True)
        r = flatten(src, tmp_path / f"out{compressed}")
        t = pq.read_table(r.out_dir / "events.parquet")
        assert t.num_rows == len(events)
        assert t.column("name")[5].as_py() == "N" * tame.KEEP_BYTES
        assert json.loads(t.column("args_json")[7].as_py())["shape"].startswith("[0, 1, 2")
        assert r.problems[f"coerced:{tame.TOO_LARGE}"] == 2
        assert t.column("name").to_pylist()[8:] == [e.get("name") for e in events[8:]]


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64])
def test_squeezer_keeps_small_values_whatever_the_blocks(block):
    ev = {"ph": "X", "name": "a" * 100, "args": {"x": [1, 2, 3] * 40, "y": 'b\\"' * 30, "é": {"q": "é" * 30}}}
    text = json.dumps(ev, ensure_ascii=False).encode()

    def squeeze(data, **kw):
        sq, pos = tame.EventSqueezer(**kw), 0
        while not sq.done and pos < len(data):
            pos += sq.feed(data[pos : pos + block])
        return sq, data[pos:]

    sq, rest = squeeze(text + b', {"next": 1}', value_limit=10**6)
    assert sq.text == text and rest == b', {"next": 1}' and sq.cut == 0
    sq, rest = squeeze(text + b"]}", value_limit=60, keep=10)
    cut = json.loads(sq.text)
    assert rest == b"]}" and sq.cut >= 2 and cut["name"] == "a" * 10 and isinstance(cut["args"], str)


@pytest.mark.slow
def test_a_200_mb_string_stays_in_bounded_memory(tmp_path):
    path = tmp_path / "big_string.json"
    events = synth.make_trace(n_steps=2)["traceEvents"]
    with open(path, "wb") as f:
        f.write(b'{"traceEvents": [' + b",".join(json.dumps(e).encode() for e in events))
        f.write(b', {"ph": "X", "cat": "cpu_op", "name": "')
        for _ in range(200):
            f.write(b"S" * (1 << 20))
        f.write(b'", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}')
    peak = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); assert p.returncode == 0; "
                "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
            ),
            sys.executable,
            "-m",
            "pipeline",
            "flatten",
            str(path),
            "-o",
            str(tmp_path / "out"),
            "-q",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(peak.stdout) < 600 << 10, f"peak RSS {int(peak.stdout) >> 10} MB for a 200 MB string"
    assert pq.read_table(tmp_path / "out/big_string/events.parquet").num_rows == len(events) + 1


# ------------------------------------------------------------------ faults in batch
def test_a_worker_killed_mid_trace(tmp_path):
    src = tmp_path / "src"
    for i in range(4):
        small_trace(src, f"rank{i}.json", n=i)
    p = cli("batch", src, "-o", tmp_path / "ds", "-j", "2", env={batch.FAULT_KILL: "rank2"}, timeout=120)
    assert p.returncode == 1 and "rank2.json: quarantined: the worker flattening it died" in p.stderr
    assert sorted(
        layout.read_manifest(tmp_path / "ds")[t]["status"] for t in layout.committed_ids(tmp_path / "ds")
    ) == ["ok", "ok", "ok", "quarantined"]


def test_a_full_disk_mid_commit_touches_nothing_else(tmp_path, monkeypatch):
    src = tmp_path / "src"
    for i in range(3):
        small_trace(src, f"rank{i}.json", n=i)
    real = batch.commit

    def commit(ds, stage, cid, rows):  # a task of one trace each (group_bytes=1): rank1's commit fails midway
        if any("rank1" in r["path"] for r in rows):
            (ds / "events").mkdir(exist_ok=True)
            os.rename(stage / "events.parquet", ds / "events" / layout.part_name(cid))
            raise OSError(28, "No space left on device")
        return real(ds, stage, cid, rows)

    monkeypatch.setattr(batch, "commit", commit)
    r = batch.run_batch(src, tmp_path / "ds", jobs=1, group_bytes=1, compact=False)
    assert (r.added, r.failed) == (2, 1) and "cannot commit: No space left on device" in r.problems[0]
    named = {r["part"] for r in layout.read_manifest(tmp_path / "ds").values()}
    parts = [p for p in (tmp_path / "ds").rglob("part-*.parquet") if p.parent.name != "traces"]
    leftovers = [p for p in parts if p.name not in named]
    assert not leftovers
    monkeypatch.setattr(batch, "commit", real)
    assert batch.run_batch(src, tmp_path / "ds", jobs=1).added == 1  # retried by the next run


def test_an_unreadable_file_is_quarantined_with_its_reason(tmp_path, monkeypatch):
    src = tmp_path / "src"
    small_trace(src, "ok.json")
    small_trace(src, "secret.json", n=1)

    def file_hash(path):
        if "secret" in path:
            raise PermissionError(13, "Permission denied")
        return real(path)

    real = inputs.file_hash
    monkeypatch.setattr(inputs, "file_hash", file_hash)
    r = batch.run_batch(src, tmp_path / "ds", jobs=1)
    assert (r.added, r.quarantined) == (1, 1)
    assert r.problems == [f"{src / 'secret.json'}: quarantined: cannot read: Permission denied"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_for_real(tmp_path):
    src = tmp_path / "src"
    small_trace(src, "secret.json").chmod(0)
    p = cli("batch", src, "-o", tmp_path / "ds")
    assert p.returncode == 1 and "Permission denied" in p.stderr
