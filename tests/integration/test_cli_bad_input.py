"""Every `cacheroute` command, given a user's mistake, answers with one line and a non-zero
exit: no traceback, no page of usage.

The commands are enumerated from the parser itself, so a command added later is walked
too. Each gets an unknown flag, a number that is not one, an unreachable planner (the
commands that talk to one) and a file that does not exist (its options that name one).
A command line argparse refuses is one line too (planner_svc.cli.console.Parser): the
error and where the help is, not the usage first.
The cases run in one child process (`DRIVER`) that calls `main()` once per case, since a
process per case would cost a second of imports each.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner_svc.cli.main import build_parser

pytestmark = pytest.mark.integration

# A closed port on loopback: connections are refused at once.
UNREACHABLE = "127.0.0.1:1"
MISSING = "/nonexistent/cacheroute-test/missing-file"
# Option names that take a file to read.
FILE_OPTIONS = ("--rates", "--trace", "--pools-file", "--file", "--public-key",
                "--arena-csv", "--tls-ca")
# Values for positionals that are not under test (the mistake is elsewhere).
POSITIONAL = {"version": "1.1", "key": "k", "id": "e9", "weight": "2", "a": "1.1", "b": "1.2",
              "assignments": "q_cap=5"}

# Runs each case's argv through main() with stderr captured; a case that raises (a
# traceback a user would see) or outlives its alarm is reported as such.
DRIVER = r"""
import contextlib, io, json, logging, signal, sys, traceback
from planner_svc.cli.main import main

class Hung(BaseException):
    pass

def alarm(signum, frame):
    raise Hung()

results = []
for argv in json.load(sys.stdin):
    signal.signal(signal.SIGALRM, alarm)
    for h in list(logging.root.handlers):
        logging.root.removeHandler(h)
    err = io.StringIO()
    code = None
    signal.alarm(30)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, int) and exc.code is not None:
            err.write(str(exc.code) + "\n")
    except Hung:
        code = "hung"
    except BaseException:
        err.write(traceback.format_exc())
        code = "raised"
    finally:
        signal.alarm(0)
    results.append({"argv": argv, "code": code, "stderr": err.getvalue()})
json.dump(results, sys.stdout)
"""


def leaves(parser: argparse.ArgumentParser, path: list[str]) -> Iterator[
        tuple[list[str], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from leaves(child, [*path, name])


def positionals(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for a in parser._actions:
        if a.option_strings or a.nargs in ("?", "*"):
            continue
        out.append(str(next(iter(a.choices))) if a.choices else POSITIONAL.get(a.dest, "x"))
    return out


def filler(action: argparse.Action) -> list[str]:
    """A value for a required option that is not under test: nothing it names exists."""
    if action.choices:
        value = str(next(iter(action.choices)))
    elif action.type in (int, float):
        value = "2"
    else:
        value = MISSING
    return [action.option_strings[-1], value]


def required(parser: argparse.ArgumentParser, tested: str) -> list[str]:
    """What the command line needs besides the mistake, so the mistake is what is met."""
    out: list[str] = []
    for a in parser._actions:
        if a.required and a.option_strings and tested not in a.option_strings:
            out += filler(a)
    for group in parser._mutually_exclusive_groups:
        members = group._group_actions
        if group.required and not any(tested in a.option_strings for a in members):
            out += filler(members[0])
    return out


def cases(path: list[str], parser: argparse.ArgumentParser) -> Iterator[tuple[str, list[str]]]:
    options = {s: a for a in parser._actions for s in a.option_strings}
    # A watcher retries a source it cannot read, by design: its one round shows the error.
    base = [*path, *positionals(parser), *(["--once"] if "--once" in options else [])]
    planner = ["--planner", UNREACHABLE, "--timeout", "2"] if "--planner" in options else []
    # An edge reads the planner's key only when it follows plans from Redis.
    redis = ["--redis-url", f"redis://{UNREACHABLE}/0"] if "--redis-url" in options else []
    yield "an unknown flag", [*base, *required(parser, ""), "--no-such-flag"]
    numeric = [s for s, a in options.items() if a.type in (int, float) and s.startswith("--")]
    if numeric:
        yield (f"{numeric[0]} not a number",
               [*base, *required(parser, numeric[0]), numeric[0], "not-a-number"])
    if planner:
        yield "an unreachable planner", [*base, *required(parser, ""), *planner]
    for flag in (f for f in FILE_OPTIONS if f in options and not options[f].choices):
        yield f"{flag} missing", [*base, *required(parser, flag), *planner, *redis, flag, MISSING]


ALL = [(" ".join(path), label, argv)
       for path, parser in leaves(build_parser(), []) for label, argv in cases(path, parser)]
# Mistakes of `up` itself: what it is given to start, before it starts anything.
ALL += [("up", "an engine that is not an http URL", ["up", "--engines", "ftp://e0:8000"]),
        ("up", "the same engine twice", ["up", "--engines", "http://e0:1,http://e0:1"]),
        ("up", "a port out of range", ["up", "--ports-from", "70000"])]


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, ...], dict[str, object]]:
    done = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps([c[2] for c in ALL]),
                          capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    return {tuple(r["argv"]): r for r in json.loads(done.stdout)}


def test_every_command_is_walked() -> None:
    walked = {c[0] for c in ALL}
    assert {"up", "gateway", "plan show", "status", "replay", "discover"} <= walked
    assert len(walked) == sum(1 for _ in leaves(build_parser(), []))


@pytest.mark.parametrize(("command", "label", "argv"), ALL,
                         ids=[f"{c}: {label}" for c, label, _ in ALL])
def test_a_mistake_is_one_line_and_a_failure(
        results: dict[tuple[str, ...], dict[str, object]], command: str, label: str,
        argv: list[str]) -> None:
    got = results[tuple(argv)]
    stderr = str(got["stderr"])
    assert got["code"] not in (0, None, "hung", "raised"), f"{argv}: exit {got['code']}\n{stderr}"
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"{argv}:\n{stderr}"


def run_without(modules: list[str], argv: list[str], env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:
    """`cacheroute ARGV` in a process where `modules` cannot be imported (as if their extra
    were not installed)."""
    code = (f"import sys\nfor m in {modules!r}: sys.modules[m] = None\n"
            "from planner_svc.cli.main import main\nsys.exit(main(sys.argv[1:]))")
    base = {k: v for k, v in os.environ.items() if k != "CACHEROUTE_TANSU_BIN"}
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          timeout=60, env={**base, **(env or {})},
                          cwd=Path(__file__).resolve().parents[2])


@pytest.mark.parametrize(("modules", "argv", "extra"), [
    (["faust"], ["up"], "stack"),
    (["confluent_kafka"], ["demo"], "stack"),
    (["httptools"], ["up", "--engines", "http://127.0.0.1:1"], "gateway"),
    # Imported where the command needs it: the top level names its extra.
    (["confluent_kafka"], ["gateway", "--destinations", "e0=http://127.0.0.1:1", "--port", "0",
                           "--bootstrap", UNREACHABLE], "gateway"),
])
def test_a_missing_extra_is_named_with_its_install_command(
        modules: list[str], argv: list[str], extra: str) -> None:
    done = run_without(modules, argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"cacheroute {argv[0]} needs the {extra} extra: "
                           f"pip install 'cacheroute[{extra}]'\n")


def test_up_without_redis_server_says_how_to_install_it(tmp_path: Path) -> None:
    done = run_without([], ["up"], env={"PATH": str(tmp_path)})  # nothing on PATH
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("cacheroute up needs redis-server on PATH: apt-get install "
                                  "redis-server"), done.stderr
    assert len(done.stderr.splitlines()) == 1


@pytest.mark.parametrize("flag", ["--port", "--redis-port", "--planner-port"])
def test_up_refuses_a_taken_port_before_it_starts_anything(flag: str) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = run_without([], ["up", "--engines", "http://127.0.0.1:1", flag, str(port)])
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"cacheroute up: 127.0.0.1:{port} ({flag}) is not free: "
                           "Address already in use; give another port\n")
