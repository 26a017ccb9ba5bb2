"""`python -m planner_svc [flags]`: run the planner service (flags mirror PlannerSettings)."""

from __future__ import annotations

import argparse
import logging

from planner_svc import settings as settings_mod
from planner_svc.server import run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m planner_svc", description=__doc__)
    settings_mod.add_arguments(parser)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    run(settings_mod.from_args(args))


if __name__ == "__main__":
    main()
