"""What every gpuctl command shares: its Context (arguments, output format, API client) and
the argument types of the parser."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from gpuctl import EXIT_AUTH
from gpuctl import output as out
from gpuctl.client import Client, CliError, resolve

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out"})
STDIN = "-"  # as a file name or token: read it from standard input


class Context:
    """What a command needs: its arguments, the output format and (lazily) the API client."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.output: str = getattr(args, "output", None) or "table"
        self.debug: bool = getattr(args, "debug", False)
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            settings = resolve(getattr(self.args, "url", None), getattr(self.args, "token", None))
            if not settings.token:
                raise CliError("not logged in: run gpuctl login (or set GPUCTL_TOKEN)", EXIT_AUTH)
            if not settings.url:
                raise CliError(
                    "not logged in: no server URL; run gpuctl login --url URL (or set GPUCTL_URL)",
                    EXIT_AUTH,
                )
            self._client = Client(settings.url, settings.token, debug=self.debug)
        return self._client

    @property
    def structured(self) -> bool:
        return self.output in ("json", "yaml")

    @property
    def wide(self) -> bool:
        return self.output == "wide"

    def show(self, data: Any, human: Callable[[], str]) -> None:
        """The API's data for -o json/yaml, else the human rendering."""
        out.emit(out.dump(data, self.output) if self.structured else human())


def env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def task_id(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a task id is a positive whole number, got {text!r}")
    return int(text)


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(text)
