"""How the people's commands reach the service: its HTTP API only (no Ray, no database).

The base URL comes from ``--url``, ``RUNCONTROL_URL`` or the config file, the bearer token from
``--token``, ``RUNCONTROL_TOKEN`` or the config file (``RUNCONTROL_CONFIG``, default
``~/.config/runcontrol/cli.toml``, keys ``url`` and ``token``). Lists print as tables, ``--json``
prints the API's JSON for scripts, and an API refusal prints its problem+json (status, code,
detail) and exits 1; a server that does not answer exits 3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx
from platformdirs import user_config_dir

DEFAULT_URL = "http://127.0.0.1:8000"
EXIT_REFUSED = 1  # the API answered with a problem
EXIT_UNREACHABLE = 3  # no answer at all
RECONNECT_S = 2.0  # until the stream's own ``retry:`` says otherwise


class CliError(Exception):
    """What the command tells the user on stderr before exiting with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# ---------------------------------------------------------------------- configuration


def config_path() -> Path:
    configured = os.environ.get("RUNCONTROL_CONFIG")
    return Path(configured) if configured else Path(user_config_dir("runcontrol")) / "cli.toml"


def load_config(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CliError(f"cannot read the config file {path}: {exc}") from None


@dataclass(frozen=True)
class Target:
    url: str
    token: str


def target(args: argparse.Namespace) -> Target:
    """Flag, then environment, then config file."""
    file = load_config(config_path())
    url = args.url or os.environ.get("RUNCONTROL_URL") or file.get("url") or DEFAULT_URL
    token = args.token or os.environ.get("RUNCONTROL_TOKEN") or file.get("token")
    if not token:
        raise CliError(
            'no token: pass --token, set RUNCONTROL_TOKEN, or put `token = "..."` in '
            f"{config_path()} (`runcontrol token ...` mints a dev token)"
        )
    return Target(str(url).rstrip("/"), str(token))


# ---------------------------------------------------------------------- HTTP


def problem_message(response: httpx.Response) -> str:
    """One line from an API refusal: its problem+json when there is one."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or "title" not in body:
        text = response.text.strip()[:300]
        return f"{response.status_code} {response.reason_phrase}" + (f": {text}" if text else "")
    code = f" ({body['code']})" if body.get("code") else ""
    detail = f": {body['detail']}" if body.get("detail") else ""
    line = f"{body.get('status', response.status_code)} {body['title']}{code}{detail}"
    for error in body.get("errors") or ():  # request validation
        if isinstance(error, dict):
            where = ".".join(str(p) for p in error.get("loc", ()))
            line += f"\n  {where}: {error.get('msg', '')}"
    if response.headers.get("Retry-After"):
        line += f" (retry after {response.headers['Retry-After']} s)"
    return line


class Api:
    def __init__(self, t: Target, timeout_s: float = 30.0) -> None:
        self.target = t
        self.http = httpx.Client(
            base_url=t.url, headers={"Authorization": f"Bearer {t.token}"}, timeout=timeout_s
        )

    def call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            response = self.http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise CliError(f"cannot reach {self.target.url}: {exc}", EXIT_UNREACHABLE) from None
        if response.status_code >= 400:
            raise CliError(problem_message(response))
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def stream(self, path: str, after: int | None, params: dict[str, Any]) -> Iterator[Sse]:
        """The SSE stream at ``path`` from ``after``, reconnecting with ``Last-Event-ID``
        whenever the connection drops, until the server ends it (or answers 204)."""
        last = after
        delay = RECONNECT_S
        while True:
            headers = {"Last-Event-ID": str(last)} if last is not None else {}
            try:
                with self.http.stream(
                    "GET",
                    path,
                    headers=headers,
                    params=params,
                    timeout=httpx.Timeout(30.0, read=None),
                ) as response:
                    if response.status_code == 204:
                        return
                    if response.status_code >= 400:
                        response.read()
                        raise CliError(problem_message(response))
                    for item in parse_sse(response.iter_lines()):
                        if isinstance(item, int):
                            delay = item / 1000
                            continue
                        last = item.id
                        yield item
                return  # the server ended the stream
            except (httpx.TransportError, httpx.RemoteProtocolError) as exc:
                print(
                    f"runcontrol: stream interrupted ({exc}); resuming after {last} "
                    f"in {delay:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
                time.sleep(delay)

    def close(self) -> None:
        self.http.close()


@dataclass(frozen=True)
class Sse:
    id: int
    event: str
    data: dict[str, Any]


def parse_sse(lines: Iterator[str]) -> Iterator[Sse | int]:
    """Events of a text/event-stream, and each ``retry:`` (milliseconds) as an int."""
    fields: dict[str, str] = {}
    for line in lines:
        if line.startswith(":"):
            continue
        if line == "":
            if "data" in fields and "id" in fields:
                yield Sse(
                    int(fields["id"]), fields.get("event", "message"), json.loads(fields["data"])
                )
            fields = {}
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "retry" and value.isdigit():
            yield int(value)
        elif name == "data" and "data" in fields:
            fields["data"] += "\n" + value
        else:
            fields[name] = value


def pages(api: Api, path: str, params: dict[str, Any], limit: int | None) -> list[dict[str, Any]]:
    """Items of every page up to ``limit`` items (None: all)."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = api.call("GET", path, params={**params, "cursor": cursor} if cursor else params)
        items.extend(page["items"])
        cursor = page.get("nextCursor")
        if not cursor or (limit is not None and len(items) >= limit):
            return items[:limit] if limit is not None else items


def idempotency(args: argparse.Namespace) -> dict[str, str]:
    """The ``--key`` as an ``Idempotency-Key`` header (none without it)."""
    return {"Idempotency-Key": args.key} if args.key else {}


def json_arg(value: str, flag: str = "--input") -> Any:
    """A JSON argument, given inline or as ``@FILE``."""
    try:
        text = Path(value[1:]).read_text(encoding="utf-8") if value.startswith("@") else value
    except OSError as exc:
        raise CliError(f"{flag}: cannot read {value[1:]}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CliError(f"{flag} is not JSON: {exc}") from None


# ---------------------------------------------------------------------- commands


Handler = Callable[[Api, argparse.Namespace, TextIO], None]


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help=f"API base URL (RUNCONTROL_URL; {DEFAULT_URL})")
    parser.add_argument("--token", default=None, help="bearer token (RUNCONTROL_TOKEN)")
    parser.add_argument("--json", action="store_true", help="print the API's JSON")


def add_retry_key(parser: argparse.ArgumentParser) -> None:
    """``--key``: the command's ``Idempotency-Key`` (``idempotency``)."""
    parser.add_argument(
        "--key", default=None, help="Idempotency-Key: a retry gets the first answer"
    )


def command(
    group: Any, name: str, handler: Handler, help_text: str, aliases: Sequence[str] = ()
) -> argparse.ArgumentParser:
    """Add command ``name`` to ``group``: ``handler`` over the API, with the common flags."""
    parser: argparse.ArgumentParser = group.add_parser(name, help=help_text, aliases=aliases)
    _common(parser)
    parser.set_defaults(func=lambda args: run(handler, args))
    return parser


def run(handler: Handler, args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run one command; API refusals and unreachable servers become a message and an exit
    code, never a traceback."""
    try:
        api = Api(target(args))
    except CliError as exc:
        print(f"runcontrol: {exc}", file=sys.stderr)
        return exc.exit_code
    try:
        handler(api, args, out or sys.stdout)
    except CliError as exc:
        print(f"runcontrol: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    finally:
        api.close()
    return 0
