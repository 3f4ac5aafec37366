"""fast: a clean command line of a typer command parsed by argparse, from the command's own
declaration, so that `flatten`, `analyze`, `batch`, `compact` and `query` (`cli.FAST`) do not
wait on typer's parameter handling.

typer (0.29) builds a pydantic validator for every parameter of the command it runs, importing
pydantic first: 40-55 ms of every `flatten`, `analyze` or `query` before its first line of work.
Medians of eight, alternating: `query` of a small dataset 0.32 -> 0.28 s, `flatten` of the 9 MB
hta/a100_nccl 0.675 -> 0.62 s, `analyze` of hta/cpu_only 0.59 -> 0.55 s, each 7 MB less memory;
the 209 MB trace's `analyze` 1.82 -> 1.80 s, within its noise.
argparse, in the standard library, parses the same declaration in ~1 ms. The parameters it takes
are the plain ones: a path, a string, an int, a float, a flag (`--x` or `--x/--no-x`), one of a
Literal's strings, a repeatable option or a list argument. A command line it does not parse
cleanly (a mistake, `--help`, a word it would read otherwise than click) or a command with any
other kind of parameter goes to typer, which runs it or says what is wrong, as for every other
command: only the time differs."""

from __future__ import annotations

import argparse
import inspect
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

# what typer's validators would read as these kinds, and nothing they would refuse or read otherwise
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
# an OptionInfo/ArgumentInfo attribute other than these, unless at its default, sends the command to typer
_PLAIN = {"self", "default", "param_decls", "metavar", "help", "hidden", "show_default", "show_choices"}
_PLAIN |= {"rich_help_panel", "case_sensitive", "expose_value", "min", "max"}  # bounds: checked as typer would


class Refused(Exception):
    """The command line or the command is one for typer."""


def _strict(kind: type, pattern: re.Pattern) -> Callable[[str], object]:
    def convert(text: str):
        if not pattern.fullmatch(text):
            raise ValueError(text)
        return kind(text)

    return convert


def _text(kind: type) -> Callable[[str], object]:
    def convert(text: str):
        if not text:  # typer's reading of an empty value is its own
            raise ValueError(text)
        return kind(text)

    return convert


def _bounded(convert: Callable[[str], Any], low, high) -> Callable[[str], Any]:
    """`convert`, refusing a value outside [low, high] (None: open): typer says what is wrong."""

    def check(text: str):
        value = convert(text)
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(text)
        return value

    return check


CONVERT: dict[type, Callable[[str], Any]] = {
    int: _strict(int, _INT),
    float: _strict(float, _FLOAT),
    str: _text(str),
    Path: _text(Path),
}


class Parser(argparse.ArgumentParser):
    """Refuses instead of exiting, and knows which of its options take a value."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.takes_value: dict[str, bool] = {}

    def add_argument(self, *args, **kw):
        action = super().add_argument(*args, **kw)
        self.takes_value.update(dict.fromkeys(action.option_strings, action.nargs != 0))
        return action

    def error(self, message):
        raise Refused(message)

    def check_dashes(self, argv: list[str]) -> None:
        """Refused unless every word starting with a dash is one of the options, or the value
        after one: argparse reads a word like `-- text` or `-1` as an argument, click as an
        unknown option; `-o=x` is `x` to argparse, `=x` to click; `-qj2` is left to click."""
        value_next = False
        for word in argv:
            if value_next:
                value_next = False
                continue
            if word == "--" or (word.startswith("-") and not word.startswith("--") and "=" in word):
                raise Refused(word)
            if not word.startswith("-") or word == "-":
                continue
            name = word.split("=", 1)[0] if word.startswith("--") else word[:2]
            if name not in self.takes_value:
                raise Refused(word)
            attached = "=" in word if word.startswith("--") else len(word) > 2
            if attached and not self.takes_value[name]:
                raise Refused(word)
            value_next = self.takes_value[name] and not attached


def _kind(annotation) -> tuple[type, bool, tuple | None]:
    """(the value kind, repeated, the Literal's choices) of a parameter's annotation."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise Refused(f"a union: {annotation}")
        annotation = rest[0]
    repeated = typing.get_origin(annotation) is list
    if repeated:
        annotation = typing.get_args(annotation)[0]
    choices = None
    if typing.get_origin(annotation) is typing.Literal:
        choices = typing.get_args(annotation)
        if not all(isinstance(c, str) for c in choices):
            raise Refused(f"a Literal of other than strings: {annotation}")
        annotation = str
    if annotation not in CONVERT and (annotation is not bool or repeated):
        raise Refused(f"a parameter of kind {annotation}")
    return annotation, repeated, choices


def _plain(info) -> None:
    """Refused unless every setting of the parameter but its names, default and help is typer's default."""
    for name, p in inspect.signature(type(info).__init__).parameters.items():
        if name in _PLAIN or p.default is inspect.Parameter.empty:
            continue
        if getattr(info, name, p.default) != p.default:
            raise Refused(f"{name} set")


def _flag(p: argparse.ArgumentParser, name: str, flags: tuple[str, ...], default) -> None:
    """A flag: `--x` sets True; `--x/--no-x` also declares the one that sets False."""
    on, off = [], []
    for f in flags:
        first, slash, second = (x.strip() for x in f.partition("/"))
        if not first or (slash and not second.startswith("-")):
            raise Refused(f"{name}: a flag spelt {f!r}")
        on.append(first)
        off += [second] if slash else []
    if not off and default is not False:
        raise Refused(f"{name}: a flag on by default")  # typer would add its --no- flag
    p.add_argument(*on, dest=name, action="store_true", default=default)
    if off:
        p.add_argument(*off, dest=name, action="store_false", default=default)


def parser(func: Callable, prog: str) -> Parser:
    """An argparse parser of the typer command `func` (Refused: a parameter argparse would read
    otherwise)."""
    from typer.models import ArgumentInfo, OptionInfo

    hints = typing.get_type_hints(func)
    p = Parser(prog=prog, add_help=False, allow_abbrev=False)
    for name, param in inspect.signature(func).parameters.items():
        info = param.default
        if not isinstance(info, (ArgumentInfo, OptionInfo)):
            raise Refused(f"{name}: not a typer parameter")
        _plain(info)
        kind, repeated, choices = _kind(hints[name])
        convert = CONVERT.get(kind)
        low, high = getattr(info, "min", None), getattr(info, "max", None)
        if low is not None or high is not None:
            if kind not in (int, float):
                raise Refused(f"{name}: bounds on a {kind}")
            convert = _bounded(CONVERT[kind], low, high)
        required = info.default is ...
        flags = tuple(info.param_decls or ())
        if isinstance(info, ArgumentInfo):
            if kind is bool or flags:
                raise Refused(f"{name}: an argument of its own spelling")
            nargs = ("+" if required else "*") if repeated else (None if required else "?")
            default = None if required else info.default
            p.add_argument(name, type=convert, nargs=nargs, default=default, choices=choices)
            continue
        if not flags or any(not f.startswith("-") for f in flags):
            raise Refused(f"{name}: names typer derives from the parameter's")
        if kind is bool:
            _flag(p, name, flags, info.default)
            continue
        if any("/" in f for f in flags):
            raise Refused(f"{name}: a value's option named as a flag's")
        if repeated:
            p.add_argument(*flags, dest=name, type=convert, action="append", default=None, choices=choices)
        else:
            default = None if required else info.default
            p.add_argument(*flags, dest=name, type=convert, default=default, choices=choices, required=required)
    return p


def values(func: Callable, argv: list[str], prog: str) -> dict:
    """The parameters of `func` that typer would pass for `argv` (the arguments after the
    command's name); Refused when argparse may read them otherwise."""
    return parsed(parser(func, prog), argv)


def parsed(p: Parser, argv: list[str]) -> dict:
    """What `p` makes of `argv`; Refused for help and where argparse and click may read it apart."""
    if any(a in ("--help", "-h", "--version") for a in argv):
        raise Refused("help")
    p.check_dashes(argv)
    try:
        return vars(p.parse_args(argv))
    except (SystemExit, ValueError) as e:
        raise Refused(str(e)) from e


def command_function(name: str) -> Callable:
    """The function of the command `name` registered on the app (its module imported: `register`)."""
    from pipeline.cli.app import app

    for c in app.registered_commands:
        if (c.name or getattr(c.callback, "__name__", None)) == name and c.callback is not None:
            return c.callback
    raise Refused(f"no command {name}")


def run(argv: list[str]) -> int | None:
    """Run the command line `argv` (the command's name first) if argparse parses it cleanly: its
    exit code, or None for typer to run it (`entry.run`)."""
    from pipeline.cli import register
    from pipeline.cli.guard import guarded

    register(argv)
    try:
        func = command_function(argv[0])
        given = values(func, argv[1:], f"tracepipe {argv[0]}")
    except Refused:
        return None

    def call():
        import typer

        try:
            return func(**given)
        except typer.Exit as e:
            return e.exit_code

    return guarded(call)
