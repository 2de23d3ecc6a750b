"""Record SGLang's launch_server option table (and --help text) from an installed SGLang.

    python tools/record_sglang_options.py OUT.json [HELP.txt]

Run it with a Python that has SGLang installed (see tools/sglang-parser.sh).
specsweep checks every launch command against the recorded table in CI
(specsweep/sglang_options.py) and against the live parser on demand.
"""

import argparse
import importlib.metadata
import json
import subprocess
import sys

from sglang.srt.server_args import ServerArgs


def type_name(action) -> str:
    t = action.type
    if t in (int, float, str):
        return t.__name__
    if t is None:
        return "str"
    return "any"


def main() -> None:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    options = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        takes_value = action.nargs != 0
        options.append(
            {
                "flags": list(action.option_strings),
                "dest": action.dest,
                "nargs": action.nargs if takes_value else 0,
                "type": type_name(action) if takes_value else None,
                "choices": [str(c) for c in action.choices] if action.choices else None,
                "required": bool(action.required),
            }
        )
    table = {"sglang": importlib.metadata.version("sglang"), "options": options}
    with open(sys.argv[1], "w") as out:
        json.dump(table, out, indent=1, sort_keys=True)
        out.write("\n")
    if len(sys.argv) > 2:
        help_text = subprocess.run(
            [sys.executable, "-m", "sglang.launch_server", "--help"], capture_output=True, text=True, check=True
        ).stdout
        with open(sys.argv[2], "w") as out:
            out.write(help_text)


if __name__ == "__main__":
    main()
