"""mkdocs.yml's nav lists every page under docs/ (the benchmark runs under docs/results/ aside,
which the site builds but leaves out of the nav), every page it lists exists, and the settings
reference that docs/gen_settings.py generates at build time names every setting.

`mkdocs build --strict` (deploy/local/run.sh test) checks links; this test says, without
building, which page a new file is missing from.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GENERATED = {"settings.md"}  # written by the hook docs/gen_settings.py at build time


def _nav_pages(entry: Any) -> list[str]:
    """Every page path in a nav (strings, {title: page} and {title: [section]} entries)."""
    if isinstance(entry, str):
        return [] if "://" in entry else [entry]
    if isinstance(entry, list):
        return [p for item in entry for p in _nav_pages(item)]
    if isinstance(entry, dict):
        return [p for value in entry.values() for p in _nav_pages(value)]
    return []


def _config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    return config


def _out_of_nav(relative: str) -> bool:
    """The runs under results/ stay out of the nav; its hand-written studies do not."""
    path = Path(relative)
    if path.parts[0] != "results":
        return False
    hand_written = len(path.parts) == 2 and (path.name == "index.md" or path.name[:2] == "20")
    return not hand_written


def test_every_page_is_in_the_nav() -> None:
    listed = set(_nav_pages(_config()["nav"]))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    missing = sorted(p for p in pages - listed if not _out_of_nav(p))
    assert not missing, f"docs pages missing from mkdocs.yml's nav: {', '.join(missing)}"


def test_every_nav_entry_exists() -> None:
    absent = sorted(p for p in _nav_pages(_config()["nav"])
                    if not (DOCS / p).is_file() and p not in GENERATED)
    assert not absent, f"mkdocs.yml's nav lists pages that do not exist: {', '.join(absent)}"


def test_the_site_is_built_strict_in_ci() -> None:
    config = _config()
    assert config["docs_dir"] == "docs" and config["strict"] is True
    assert config["theme"]["name"] == "material"
    assert "mkdocs build --strict" in (ROOT / "deploy/local/run.sh").read_text()


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_settings", DOCS / "gen_settings.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def test_the_settings_reference_names_every_setting() -> None:
    from planner_svc.cli.epp_cmd import FLAGS as EPP_FLAGS
    from planner_svc.cli.gateway_cmd import FLAGS as GATEWAY_FLAGS
    from planner_svc.settings import PlannerSettings
    from streams.settings import Settings as StreamSettings

    gen = _generator()
    page = gen.render()
    assert "docs/gen_settings.py" in _config()["hooks"][0] and gen.PAGE in GENERATED
    fields = [f.name for cls in (PlannerSettings, StreamSettings)
              for f in dataclasses.fields(cls) if f.name != "extra"]
    flags = [*GATEWAY_FLAGS, *EPP_FLAGS]
    missing = ([f for f in fields if f"| `{f}` (" not in page]
               + [f for f in flags if f"| `--{f}` |" not in page])
    assert not missing, f"settings missing from the reference: {', '.join(missing)}"
    assert "| `warm_placement` (bool) | `--warm-placement` | `CACHEROUTE_WARM_PLACEMENT` |" in page
