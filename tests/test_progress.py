"""Progress on stderr (`pipeline.progress`): drawn only on a terminal, never with -q, never on stdout;
flatten's stages and % of the file's own bytes (compressed ones for .gz/.zst); batch's done/total."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
from rich.console import Console

import pipeline
from conftest import PROJECT, run_cli
from pipeline import synthetic as synth
from pipeline.dataset import batch as B
from pipeline.progress import BatchProgress, FileProgress, byte_figures, count_figures, size

DRAWN = re.compile("[\r\x1b━⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]")  # what a progress line is made of
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NOT_JSON = "quarantined: not JSON: a trace starts with '{' or '['"  # what batch says of a text file


def frames(text: str) -> list[str]:
    """The lines a terminal was sent, escape codes removed."""
    return [f.strip() for f in re.split(r"[\r\n]", ANSI.sub("", text)) if f.strip()]


def fake_terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=120, color_system=None), out


def gz_trace(path: Path, steps: int = 6) -> Path:
    return synth.write_trace(synth.make_trace(n_steps=steps, ops_per_step=6), path, gz=True, indent=1)


def tracepipe() -> list[str]:
    """The console script beside this interpreter (else the same entry point as a module)."""
    script = Path(sys.executable).with_name("tracepipe")
    return [str(script)] if script.exists() else [sys.executable, "-m", "pipeline"]


def run_on_terminal(args) -> tuple[int, str, str]:
    """The console script with stderr on a pseudo-terminal: (exit code, stdout, what the terminal got)."""
    if not hasattr(os, "openpty"):
        pytest.skip("no pseudo-terminals here")
    master, slave = os.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("TRACEPIPE_DEBUG", "NO_COLOR")}
    env.update(COLUMNS="120", LINES="30", TERM="xterm-256color")
    proc = subprocess.Popen(
        [*tracepipe(), *map(str, args)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
        cwd=PROJECT,
    )
    os.close(slave)
    got: list[bytes] = []

    def drain():
        while True:
            try:
                b = os.read(master, 1 << 16)
            except OSError:  # EIO: the other end is closed
                return
            if not b:
                return
            got.append(b)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=300)
    reader.join(timeout=30)
    os.close(master)
    return proc.returncode, out.decode(), b"".join(got).decode(errors="replace")


# ------------------------------------------------------------------ silent: not a terminal, or -q
def test_flatten_silent_when_stderr_is_not_a_terminal(tmp_path):
    p = gz_trace(tmp_path / "t.json.gz")
    cp = run_cli(["flatten", p, "-o", tmp_path / "out"])
    assert cp.returncode == 0, cp.stderr
    assert cp.stderr == ""
    assert not DRAWN.search(cp.stdout)


def test_flatten_silent_on_a_terminal_with_q(tmp_path):
    p = gz_trace(tmp_path / "t.json.gz")
    code, out, terminal = run_on_terminal(["flatten", "-q", p, "-o", tmp_path / "out"])
    assert code == 0
    assert out == "" and terminal == ""


def test_batch_silent_when_stderr_is_not_a_terminal(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for k in range(2):
        gz_trace(src / f"r{k}.json.gz", steps=2 + k)
    (src / "bad.json").write_text("not json")
    cp = run_cli(["batch", src, "-o", tmp_path / "ds", "-j", "1"])
    assert cp.returncode == 1
    assert cp.stderr.splitlines() == [f"tracepipe: {src / 'bad.json'}: {NOT_JSON}"]
    assert not DRAWN.search(cp.stderr + cp.stdout)


def test_no_display_costs_nothing():
    """Off, a display imports nothing (not rich) and its calls do nothing."""
    code = (
        "import sys; from pipeline.progress import FileProgress, BatchProgress\n"
        "with FileProgress('t', 10, quiet=True) as p:\n"
        "    p.stage('read'); p.advance_to(5)\n"
        "with BatchProgress() as b:\n"  # stderr is a pipe: off
        "    b.start(2); b.finished('ok')\n"
        "print(p.on, b.on, 'rich' in sys.modules)\n"
    )
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT)
    assert (cp.stdout.strip(), cp.stderr) == ("False False False", "")


# ------------------------------------------------------------------ on a terminal
def test_flatten_on_a_terminal_shows_stages_and_percent_of_the_gz(tmp_path):
    p = gz_trace(tmp_path / "t.json.gz")
    code, out, terminal = run_on_terminal(["flatten", p, "-o", tmp_path / "out"])
    assert code == 0, terminal
    shown = frames(terminal)
    assert any(" read " in f and "100%" in f and size(p.stat().st_size, p.stat().st_size) in f for f in shown), shown
    assert any(" link+cost " in f for f in shown), shown
    assert any(" write " in f for f in shown), shown
    assert terminal.rstrip().endswith("\x1b[2K")  # the line removed at the end (transient)
    # stdout: the summary only, untouched by the display
    assert out.startswith("t.json.gz: ") and out.count("\n") == 1 and not DRAWN.search(out)


def test_batch_on_a_terminal_counts_done_of_total(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for k in range(3):
        gz_trace(src / f"r{k}.json.gz", steps=2 + k)
    (src / "bad.json").write_text("not json")
    code, out, terminal = run_on_terminal(["batch", src, "-o", tmp_path / "ds", "-j", "2"])
    assert code == 1
    shown = frames(terminal)
    assert any("0/4 traces" in f for f in shown), shown  # the total before any input is done
    assert any("4/4 traces" in f and "traces/s" in f and "1 quarantined" in f for f in shown), shown  # the last frame
    # the problem is one whole line above the progress line
    assert f"tracepipe: {src / 'bad.json'}: {NOT_JSON}" in shown
    assert out.startswith("batch: 3 traces added") and not DRAWN.search(out)


# ------------------------------------------------------------------ the library: % of the file's bytes, stages
@pytest.mark.parametrize("kind", ["gz", "zst", "plain"])
def test_flatten_progress_counts_the_files_own_bytes(tmp_path, kind):
    t = synth.make_trace(n_steps=8, ops_per_step=8)
    if kind == "zst":
        pytest.importorskip("zstandard")
    path = synth.write_trace(
        t, tmp_path / f"t.json{'.' + kind if kind != 'plain' else ''}", gz=kind == "gz", zstd=kind == "zst"
    )
    seen: list[int] = []
    stages: list[str] = []
    pipeline.flatten(path, tmp_path / "out", workers=1, chunk_bytes=2048, progress=seen.append, stage=stages.append)
    assert stages == ["read", "link+cost", "write"]
    assert len(seen) > 1 and seen == sorted(seen)
    assert seen[-1] == path.stat().st_size  # compressed bytes for .gz/.zst: 100% of the file


def test_flatten_progress_callback_alone_still_works(tmp_path):
    """A library caller's progress(int) without a stage callback, as before."""
    p = gz_trace(tmp_path / "t.json.gz")
    seen: list[int] = []
    r = pipeline.flatten(p, tmp_path / "out", progress=seen.append)
    assert r.n_events > 0 and seen and all(isinstance(n, int) for n in seen)


def test_file_progress_rendered_on_a_fake_terminal(tmp_path):
    p = gz_trace(tmp_path / "t.json.gz")
    console, drawn = fake_terminal()
    with FileProgress(p.name, p.stat().st_size, console=console) as shown:
        assert shown.on
        pipeline.flatten(p, tmp_path / "out", workers=1, chunk_bytes=2048, progress=shown.advance_to, stage=shown.stage)
    lines = frames(drawn.getvalue())
    read = [f for f in lines if " read " in f]
    assert read and read[-1].split(" read ")[1].split()[1] == "100%", read
    assert any(" link+cost " in f for f in lines) and any(" write " in f for f in lines)
    assert drawn.getvalue().rstrip().endswith("\x1b[2K")  # removed at the end


def test_batch_progress_rendered_on_a_fake_terminal():
    console, drawn = fake_terminal()
    with BatchProgress(console=console) as shown:
        shown.start(3)
        for kind in ("ok", "quarantined", "skipped"):
            shown.finished(kind)
        shown.echo("tracepipe: x.json: quarantined: not JSON")
    lines = frames(drawn.getvalue())
    assert "tracepipe: x.json: quarantined: not JSON" in lines
    assert any("3/3 traces" in f and "1 quarantined" in f and "traces/s" in f for f in lines), lines


def test_figures():
    assert byte_figures(8.4e6, 17.5e6, 6.3e6) == " 48%   8.4/17.5 MB    6.3 MB/s  ETA 0:01"
    assert byte_figures(17.5e6, 17.5e6, 6.3e6) == "100%  17.5/17.5 MB    6.3 MB/s"  # no ETA once done
    assert byte_figures(2_000, None, None) == "2.0 kB"  # no total: no % and no ETA
    assert count_figures(12, 40, 6.0, 3) == "12/40 traces  2.00 traces/s  3 quarantined  ETA 0:14"
    assert count_figures(0, None, 1.0, 0) == "0 traces  0 quarantined"
    assert count_figures(12, 40, 6.0, 3, nbytes=18_000_000) == (
        "12/40 traces  2.00 traces/s  3.0 MB/s  3 quarantined  ETA 0:14"
    )
    assert count_figures(41, 40, 1.0, 0, failed=2) == "41/40 traces  41 traces/s  0 quarantined  2 failed"


def test_a_failing_display_never_stops_the_job():
    class Broken(io.StringIO):
        def write(self, s):
            raise OSError(5, "Input/output error")

    stderr = sys.stderr
    with FileProgress("t.json.gz", 100, console=Console(file=Broken(), force_terminal=True)) as shown:
        shown.stage("read")
        shown.advance_to(50)
        shown.stage("link+cost")
    assert not shown.on and sys.stderr is stderr


# ------------------------------------------------------------------ batch: the total up front
def test_run_batch_says_the_total_before_the_first_input(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for k in range(3):
        gz_trace(src / f"r{k}.json.gz", steps=2)  # the same content thrice: two duplicates
    (src / "notes.txt").write_text("not a trace name")
    events: list = []
    B.run_batch(
        src,
        tmp_path / "ds",
        jobs=1,
        started=lambda total: events.append(("started", total)),
        report=lambda kind, source, msg, nbytes: events.append(kind),
    )
    assert events[0] == ("started", 3) and len(events) == 4


def test_count_inputs(tmp_path):
    ds = tmp_path / "ds"
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    for name in ("a.json", "sub/b.json.gz", "sub/c.txt"):
        (d / name).write_text("{}")
    assert B.count_inputs(d, ds) == 2
    (d / "ds").mkdir()
    (d / "ds" / "x.json").write_text("{}")
    assert B.count_inputs(d, d / "ds") == 2  # not the dataset's own files
    z = tmp_path / "a.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for name in ("x/a.json", "x/b.json.gz", "x/readme.md"):
            zf.writestr(name, "{}")
    assert B.count_inputs(z, ds) == 2
    listing = tmp_path / "list.txt"
    listing.write_text("# traces\na.json\n\nb.json\n")
    assert B.count_inputs(listing, ds) == 2
    assert B.count_inputs(d / "a.json", ds) == 1
    tar = tmp_path / "a.tar"
    import tarfile

    with tarfile.open(tar, "w") as tf:
        tf.add(d / "a.json", "a.json")
    assert B.count_inputs(tar, ds) is None  # streamed: not known up front
    assert B.count_inputs(tmp_path / "missing", ds) is None
