"""The documentation's runnable examples: every ```console block of README.md and docs/.

In a ```console block each line starting with `$ ` is a command (a trailing `\\` continues it on the
next line) and the lines after it, up to the next command, are what it prints. The commands name
the shared real traces by their file name (`b200_eager.json.gz`) and the shared runs by their
folder (`dlrm8_v100/`): they run in a directory where every one of them is linked under that name
(`workdir`), one page's commands in order, so a later one reads what an earlier one wrote.
Blocks of other languages (```bash) are not run: they show commands on the reader's own files.

tests/test_docs.py runs every example (a doc example that breaks fails a test);
`python scripts/doc_examples.py --refresh PAGE.md...` writes each example's real output into the page
(after a change of what a command prints).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
BLOCK = re.compile(r"^```console\n(.*?)^```$", re.S | re.M)
CONTINUED = re.compile(r"\\\n\s*")


@dataclass
class Example:
    command: str  # as run by bash (continuation lines joined)
    output: list[str]  # what the page shows it printing
    raw: list[str]  # the command's lines in the page
    span: tuple[int, int]  # the block's body in the page text


def examples(text: str) -> list[Example]:
    """The commands of the page's console blocks, in order."""
    out: list[Example] = []
    for m in BLOCK.finditer(text):
        cmd_lines: list[str] | None = None
        body = m.group(1).splitlines()
        i = 0
        while i < len(body):
            line = body[i]
            if line.startswith("$ "):
                cmd_lines = [line[2:]]
                while cmd_lines[-1].endswith("\\") and i + 1 < len(body):
                    i += 1
                    cmd_lines.append(body[i])
                out.append(Example(CONTINUED.sub("", "\n".join(cmd_lines)), [], cmd_lines, m.span(1)))
            elif out and cmd_lines is not None and out[-1].span == m.span(1):
                out[-1].output.append(line)
            i += 1
    return out


def workdir(path: Path) -> Path:
    """`path` with every shared trace and run linked in by its name; None when ../shared is absent."""
    path.mkdir(parents=True, exist_ok=True)
    for f in sorted((SHARED / "traces").glob("*/*")):
        if f.name.endswith((".json.gz", ".json")) and not (path / f.name).exists():
            (path / f.name).symlink_to(f)
    for d in sorted((SHARED / "runs").glob("*")):
        if d.is_dir() and not (path / d.name).exists():
            (path / d.name).symlink_to(d)
    return path


def run(command: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """One example in bash, in `cwd`, with this interpreter's `tracepipe` first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRACEPIPE_DEBUG", "FORCE_COLOR")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(COLUMNS="100", NO_COLOR="1")
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def refresh(page: Path, cwd: Path) -> None:
    """Write each example's real output (stdout, then stderr) into the page."""
    text = page.read_text()
    pieces, last = [], 0
    done: dict[tuple[int, int], list[str]] = {}
    for ex in examples(text):
        p = run(ex.command, cwd)
        if p.returncode not in (0, 1):
            raise SystemExit(f"{page}: `{ex.command}` exited {p.returncode}: {p.stderr.strip()[-300:]}")
        shown = (p.stdout + p.stderr).rstrip("\n").splitlines()
        done.setdefault(ex.span, []).extend(["$ " + ex.raw[0], *ex.raw[1:], *shown])
    for (a, b), lines in sorted(done.items()):
        pieces += [text[last:a], "\n".join(line.rstrip() for line in lines) + "\n"]
        last = b
    page.write_text("".join(pieces) + text[last:])


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "--refresh":
        raise SystemExit("usage: doc_examples.py --refresh PAGE.md...")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name in sys.argv[2:]:
            refresh(Path(name).resolve(), workdir(Path(tmp) / Path(name).stem))
            print(f"{name}: refreshed")
