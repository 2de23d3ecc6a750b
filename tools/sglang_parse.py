"""Parse launch argument lists with SGLang's own parser (run with a Python that has SGLang).

Reads {"argv": [[...], ...], "extra_flags": [{"flag": ..., "type": ...}]} as JSON on stdin and
prints one {"ok": bool, "error": str} per argument list. Used by tests/unit/test_sglang_live.py.
"""

import argparse
import json
import sys

from sglang.srt.server_args import ServerArgs

TYPES = {"int": int, "float": float, "str": str}


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ValueError(message)


def main() -> None:
    request = json.load(sys.stdin)
    results = []
    for argv in request["argv"]:
        parser = Parser(prog="sglang.launch_server")
        ServerArgs.add_cli_args(parser)
        for extra in request.get("extra_flags", []):
            kind = extra.get("type", "str")
            if kind == "bool":
                parser.add_argument(extra["flag"], action="store_true")
            else:
                parser.add_argument(extra["flag"], type=TYPES[kind])
        try:
            parser.parse_args(argv)
            results.append({"ok": True, "error": ""})
        except (ValueError, SystemExit) as exc:
            results.append({"ok": False, "error": str(exc)})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
