"""The CLI's surface: `cacheroute --help` lists the commands in their groups, `replay`
offers the user's policies (the ablations run with bench/ablations.py) and its `--help`
shows the common options, `--help-all` every one."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from planner_svc.cli.main import COMMAND_GROUPS, build_parser, main
from planner_svc.cli.replay_cmd import REPLAY_POLICIES, add_replay_arguments
from planner_svc.simulator.experiment import (
    ABLATION_POLICIES,
    PAPER_POLICIES,
    POLICY_NAMES,
    USER_POLICIES,
)

ROOT = Path(__file__).resolve().parents[2]


def _help(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main([*argv])
    assert exit_.value.code == 0
    return " ".join(out.getvalue().split())


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def test_every_command_is_in_exactly_one_group() -> None:
    grouped = [name for names in COMMAND_GROUPS.values() for name in names]
    assert len(grouped) == len(set(grouped)), "a command in two groups"
    assert set(grouped) == _commands(build_parser())


def test_the_help_lists_the_commands_under_their_headings_in_order() -> None:
    text = _help("--help")
    positions = []
    for title, names in COMMAND_GROUPS.items():
        heading = text.lower().index(f"{title} commands:")
        assert all(text.index(f" {name} ", heading) > heading for name in names)
        positions.append(heading)
    assert positions == sorted(positions)
    assert "{up,demo" not in text  # not the flat list as well


@pytest.mark.parametrize("command", sorted(_commands(build_parser())))
def test_each_commands_own_help_still_works(command: str) -> None:
    assert f"cacheroute {command}" in _help(command, "--help")


def test_replay_offers_the_users_policies_and_points_ablations_to_the_bench() -> None:
    assert set(USER_POLICIES) == {"flat", "sticky", "chwbl", "preble", "sglang",
                                  "cacheroute-gateway", "cacheroute"}
    assert set(USER_POLICIES) | set(ABLATION_POLICIES) == set(POLICY_NAMES)
    assert not set(USER_POLICIES) & set(ABLATION_POLICIES)
    # The default stays the paper's comparison, less its ablation (DualMap-like).
    assert REPLAY_POLICIES == ("flat", "sticky", "chwbl", "preble", "cacheroute")
    args = build_parser().parse_args(["replay"])
    assert args.policies == ",".join(REPLAY_POLICIES)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["replay", "--policies", "flat,cacheroute-known"])
    assert exit_.value.code == 2
    assert "cacheroute-known" in err.getvalue() and "bench/ablations.py" in err.getvalue()


def test_the_ablations_parser_takes_every_policy_and_defaults_to_the_papers_six() -> None:
    parser = argparse.ArgumentParser()
    add_replay_arguments(parser, policies=POLICY_NAMES, default=PAPER_POLICIES)
    assert parser.parse_args([]).policies == ",".join(PAPER_POLICIES)
    every = ",".join(POLICY_NAMES)
    assert parser.parse_args(["--policies", every]).policies == every


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def test_replay_help_shows_the_common_options_and_help_all_every_one() -> None:
    (replay,) = [a.choices["replay"] for a in build_parser()._actions
                 if isinstance(a, argparse._SubParsersAction)]
    every = _option_strings(replay)
    short, full = _help("replay", "--help"), _help("replay", "--help-all")
    shown = {s for s in every if f"{s} " in short}
    assert {"--scenario", "--trace", "--policies", "--loads", "--seeds", "--out"} <= shown
    assert len(shown) <= 16 < len(every)
    assert all(f"{s} " in full for s in every), sorted(s for s in every if f"{s} " not in full)
    assert "gateway and planner settings" in full.lower() and "arena check" in full.lower()


def test_the_ablations_bench_runs_an_ablation(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ablations.py"), "--policies",
         "flat,dualmap,affinity", "--loads", "40", "--seeds", "1", "--requests", "2000",
         "--keys", "200", "--destinations", "4", "--workers", "1", "--out", str(tmp_path),
         "--no-plots"], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    table = (tmp_path / "paper-like.md").read_text()
    assert "| DualMap-like |" in table and "| + affinity |" in table
