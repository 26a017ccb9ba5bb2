"""The CLI's output rules: help that documents itself, tables only on a terminal, and a
closed pipe that ends a command quietly."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys

import pytest

from planner_svc.cli.console import HelpAll, show
from planner_svc.cli.main import build_parser, main
from planner_svc.cli.ops_view import Column, TextTable, plain_table

TABLE = TextTable((Column("router"), Column("behind", right=True), Column("notes")),
                  (("edge-a", "0", ""), ("edge-long-name", "12", "rejected 1.4")))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_plain_table_aligns_names_left_numbers_right_without_trailing_blanks():
    lines = plain_table(TABLE).splitlines()
    assert lines == ["router          behind  notes",
                     "edge-a               0",
                     "edge-long-name      12  rejected 1.4"]


def test_tables_are_drawn_only_on_a_terminal():
    piped, terminal = io.StringIO(), _Terminal()
    show(TABLE, piped)
    show(TABLE, terminal)
    assert piped.getvalue() == plain_table(TABLE) + "\n"
    drawn = terminal.getvalue()
    assert drawn != piped.getvalue()
    assert all(cell in drawn for cell in ("router", "behind", "edge-long-name", "rejected 1.4"))


def _help(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return out.getvalue()


@pytest.mark.parametrize(("argv", "described", "shown"), [
    (("status",), "what plan is live, and why", ["env CACHEROUTE_PLANNER", "(default: 10.0)"]),
    (("gateway",), "reference edge gateway", ["env CACHEROUTE_GATEWAY_PORT", "(default: 8000)",
                                               "env CACHEROUTE_GATEWAY_MAX_INFLIGHT"]),
    (("plan", "versions"), "retained plan versions", ["(default: 20)"]),
    (("destinations", "add"), "add a destination", ["(default: 1.0)"]),
    (("replay",), "shadow-replay", ["--scenario"]),
])
def test_every_command_help_has_a_description_defaults_and_environment_names(
        argv, described, shown):
    text = _help(*argv)
    assert described in text
    for fragment in shown:
        assert fragment in " ".join(text.split()), fragment  # help text wraps
    assert "(default: )" not in text and "(default: False)" not in text


def _options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    for action in parser._actions:  # argparse has no public walk of its tree
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _options(child, (*path, name))
        elif action.dest != "help":
            yield " ".join(path), action


def test_every_argument_of_every_command_is_explained():
    """`--help-all`'s options too: their help is theirs once revealed, never argparse's
    SUPPRESS (which hides an option from `--help`)."""
    options = list(_options(build_parser()))
    for _, action in options:
        if isinstance(action, HelpAll):
            action.advanced.reveal()
    unexplained = [(cmd, a.option_strings or a.dest) for cmd, a in options
                   if not a.help or a.help == argparse.SUPPRESS]
    assert unexplained == []


def test_a_bad_environment_value_is_one_line_not_a_traceback():
    done = subprocess.run([sys.executable, "-m", "planner_svc.cli.main", "gateway"],
                          capture_output=True, text=True, timeout=60,
                          env={"CACHEROUTE_GATEWAY_PORT": "eighty", "PATH": ""})
    assert done.returncode != 0
    assert done.stderr.strip() == "CACHEROUTE_GATEWAY_PORT='eighty': not a valid int"


def test_a_closed_pipe_ends_the_command_quietly():
    # `cacheroute --help | head -1`: the reader goes away after one line.
    proc = subprocess.Popen([sys.executable, "-m", "planner_svc.cli.main", "replay", "--help"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err and b"BrokenPipe" not in err


def test_output_larger_than_the_pipe_to_a_closed_reader_ends_quietly_with_141():
    """A command whose output outlives its reader (`cacheroute plan show | head`) gets a
    BrokenPipeError, not SIGPIPE (servers share the entry point and must survive a reset
    client): main() ends it quietly with the shell's status for a closed pipe."""
    program = ("import argparse, sys\n"
               "import planner_svc.cli.main as m\n"
               "p = argparse.ArgumentParser()\n"
               "p.set_defaults(func=lambda a: print('x' * 100 + '\\n') or [print('y' * 100) "
               "for _ in range(20000)], log_level='WARNING')\n"
               "m.build_parser = lambda: p\n"
               "sys.exit(m.main([]))\n")
    proc = subprocess.Popen([sys.executable, "-c", program],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141, err.decode()[-2000:]
    assert b"Traceback" not in err and b"BrokenPipe" not in err
