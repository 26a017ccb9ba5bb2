"""`cacheroute plan build` / `plan diff` through their argparse wiring, on real files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from planner_svc.cli.ops import connection_options
from planner_svc.cli.plan_cmd import add_offline_commands, read_rates
from planner_svc.simulator.rates import paper_like_keys, paper_like_rates
from router_client.plan import decode_plan


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cacheroute plan")
    add_offline_commands(parser.add_subparsers(dest="command", required=True),
                         connection_options())
    args = parser.parse_args(argv)
    return int(args.func(args))


@pytest.fixture
def rates_csv(tmp_path: Path) -> Path:
    keys = paper_like_keys(500)
    rates = paper_like_rates(500, 40.0, seed=3, max_share=0.02)
    path = tmp_path / "rates.csv"
    lines = (f"{k},{r!r}\n" for k, r in zip(keys, rates.tolist(), strict=True))
    path.write_text("key,rate\n" + "".join(lines))
    return path


def test_build_writes_a_plan_and_prints_a_json_summary(
    rates_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "a.plan"
    argv = ["build", "--rates", str(rates_csv), "--destinations", "4", "--q-cap", "5",
            "--warm-slots-per-destination", "10", "--out", str(out), "--json"]
    assert run(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    plan = decode_plan(out.read_bytes())
    assert summary["stats"]["admitted_keys"] == len(plan.table) == 40
    assert summary["config"]["built_by"] == "build" and summary["config"]["warm_slots"] == 40
    assert set(summary["stats"]["expected_load_per_s"]) == {"d000", "d001", "d002", "d003"}


def test_build_with_previous_repacks_and_reports_the_diff(
    rates_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "a.plan"
    common = ["--rates", str(rates_csv), "--q-cap", "5", "--warm-slots-per-destination", "10"]
    assert run(["build", *common, "--destinations", "4", "--out", str(first)]) == 0
    second = tmp_path / "b.plan"
    argv = ["build", *common, "--destination", "d000", "--destination", "d001=2",
            "--destination", "d002", "--destination", "d003", "--draining", "d002",
            "--previous", str(first), "--out", str(second)]
    capsys.readouterr()
    assert run(argv) == 0
    text = capsys.readouterr().out
    assert "plan (repack)" in text and "d002" in text and "draining" in text
    plan = decode_plan(second.read_bytes())
    assert all(2 not in s for s in plan.table.as_dict().values())
    assert plan.destinations[1].capacity_weight == 2.0
    assert run(["diff", str(first), str(second), "--json"]) == 0
    change = json.loads(capsys.readouterr().out)
    assert change["moved_keys"] > 0 and change["load_change_per_s"]["d002"] < 0


def test_byte_aware_build_reads_token_sizes_from_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rates.json"
    rows = [{"key": "big", "rate": 9.0, "tokens": 4000}, {"key": "small", "rate": 8.0,
            "tokens": 500}, {"key": "mid", "rate": 7.0, "tokens": 1000}]
    path.write_text(json.dumps(rows))
    argv = ["build", "--rates", str(path), "--destinations", "2", "--q-cap", "10",
            "--byte-aware", "--token-budget", "1600", "--json"]
    assert run(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["stats"]["admitted_keys"] == 2 and summary["config"]["byte_aware"]


def test_rates_file_layouts(tmp_path: Path) -> None:
    layouts = {
        "a.json": json.dumps({"x": 2.0, "y": 1.0}),
        "b.json": json.dumps({"keys": ["x", "y"], "rates": [2.0, 1.0]}),
        "c.csv": "# comment\nx,2.0\ny,1,300\n",
    }
    for name, text in layouts.items():
        (tmp_path / name).write_text(text)
        got = read_rates(tmp_path / name)
        assert got.keys == ["x", "y"] and got.rates.tolist() == [2.0, 1.0]
    assert np.array_equal(read_rates(tmp_path / "c.csv").tokens, [0.0, 300.0])


@pytest.mark.parametrize(
    ("content", "flags", "message"),
    [
        ("k,1\nk,2\n", [], "appears twice"),
        ("k,1\nj,oops\n", [], "must be numbers"),
        ("{not json", [], "not valid JSON"),
        ("k,1\n", ["--q-cap", "0"], "q_cap"),
        ("k,1\n", ["--draining", "zz"], "unknown destinations"),
    ],
)
def test_build_refuses_unusable_input_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, flags: list[str],
    message: str,
) -> None:
    path = tmp_path / "rates.csv"
    path.write_text(content)
    argv = ["build", "--rates", str(path), "--destinations", "2", "--q-cap", "3", *flags]
    assert run(argv) == 2
    assert message in capsys.readouterr().err


def test_diff_refuses_a_file_that_is_not_a_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bogus = tmp_path / "x.plan"
    bogus.write_bytes(b"\xff\xff not a plan")
    assert run(["diff", str(bogus), str(bogus)]) == 2
    assert "error" in capsys.readouterr().err
