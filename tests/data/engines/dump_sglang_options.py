"""How sglang-0.5.23-options.json was made: build SGLang's own `launch_server` parser and print its option table.

Run with the sglang 0.5.23 wheel unpacked on PYTHONPATH (`pip download sglang==0.5.23 --no-deps`, unzip) and a
Python that has msgspec and psutil (the vLLM venv has them). Modules only the running server needs are replaced
by empty stand-ins, so the parser is built offline without GPUs; the options come from SGLang's code unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys
from unittest import mock


def _stand_in(name: str) -> None:
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        module = ".".join(parts[:i])
        if module not in sys.modules:
            stub = mock.MagicMock(name=module)
            stub.__path__ = []
            stub.__spec__ = None
            sys.modules[module] = stub


def server_args_class():
    for _ in range(200):
        try:
            for name in [n for n in sys.modules if n.startswith("sglang")]:
                del sys.modules[name]
            from sglang.srt.server_args import ServerArgs

            return ServerArgs
        except ModuleNotFoundError as error:
            _stand_in(error.name or "")
    raise SystemExit("too many missing modules")


def main() -> None:
    parser = argparse.ArgumentParser()
    server_args_class().add_cli_args(parser)
    table = {}
    for action in parser._actions:
        kind = action.type.__name__ if action.type in (int, float) else None
        for option in action.option_strings:
            table[option] = {"dest": action.dest, "nargs": action.nargs, "type": kind}
    print(json.dumps(table, sort_keys=True))


if __name__ == "__main__":
    main()
