"""``dsv32 chat encode|parse|template``: the V3.2 conversation protocol."""

from __future__ import annotations

import argparse
import sys

from dsv32.cli import command


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="the V3.2 conversation protocol: encode, parse, chat template")
    csub = p.add_subparsers(dest="chat_cmd", metavar="COMMAND", required=True)
    enc = csub.add_parser("encode", help="print the V3.2 prompt of a conversation JSON file")
    enc.add_argument("file", help='a JSON list of messages, or {"messages": [...], "tools": [...]}')
    enc.add_argument("--mode", choices=["thinking", "chat"], default="thinking")
    enc.add_argument("--no-bos", action="store_true", help="leave out <｜begin▁of▁sentence｜>")
    par = csub.add_parser("parse", help="parse a completion text file into an assistant message (JSON)")
    par.add_argument("file", help="exactly the generated text, up to and including the end token")
    par.add_argument("--mode", choices=["thinking", "chat"], default="thinking")
    par.add_argument("--lenient", action="store_true", help="recover what is possible; list problems")
    tpl = csub.add_parser("template", help="print the V3.2 Jinja chat_template (for transformers / vLLM)")

    def run_encode(args: argparse.Namespace) -> int:
        import json

        from dsv32 import chat

        with open(args.file, encoding="utf-8") as f:
            messages = chat.conversation_from_json(json.load(f))
        print(chat.encode_messages(messages, args.mode, add_bos=not args.no_bos))
        return 0

    def run_parse(args: argparse.Namespace) -> int:
        import json

        from dsv32 import chat

        with open(args.file, encoding="utf-8", newline="") as f:
            text = f.read()
        message = chat.parse_completion(text, args.mode, strict=not args.lenient)
        print(json.dumps(message, ensure_ascii=False, indent=2))
        return 0

    def run_template(args: argparse.Namespace) -> int:
        from dsv32 import chat

        sys.stdout.write(chat.chat_template())
        return 0

    command(enc, run_encode)
    command(par, run_parse)
    command(tpl, run_template)
