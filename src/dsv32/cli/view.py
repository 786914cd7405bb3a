"""``dsv32 view PATH --out FILE.html``: one self-contained HTML page of an episode or rollout dump, an
evaluation run or a post-training run (:mod:`dsv32.view`)."""

from __future__ import annotations

import argparse

from dsv32.cli import command


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "view",
        help="an episode, an eval run or a post-training run as one HTML page that opens from disk",
    )
    p.add_argument(
        "path",
        help="a trajectory or samples file (.json, .jsonl), an eval run dir (samples.jsonl), a post-training "
        "run dir (report.json), a dsv32 envs run or agent run dir",
    )
    p.add_argument("--out", required=True, help="the HTML file to write")

    def run(args: argparse.Namespace) -> int:
        from dsv32.view import write_view

        out = write_view(args.path, args.out)
        print(f"dsv32 view: {out}")
        return 0

    command(p, run)
