"""Talking to the API: where the server and token come from, HTTP with urllib, and turning every
failure into a one-line message with the exit code scripts rely on (see gpuctl/__init__.py)."""

from __future__ import annotations

import email.utils
import http.client
import json
import os
import platform
import socket
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from gpuctl import (
    EXIT_AUTH,
    EXIT_CONFLICT,
    EXIT_CONNECT,
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    __version__,
)

API_PREFIX = "/api/v1/"
DEFAULT_TIMEOUT = 30.0  # seconds for one HTTP request
MAX_THROTTLE_RETRIES = 5  # 429s waited out (Retry-After) before giving up
MAX_RETRY_AFTER = 60.0
# Seconds a safe request (a GET, or a submission with its Idempotency-Key) keeps retrying
# the server's 503s (the database unreachable, or load shed; _server_unavailable): a database
# fail-over, which Patroni or pg_auto_failover finish in 20-40 s (docs/deployment.md), delays
# a command instead of failing it.
OUTAGE_WAIT = 90.0
PAGE_MAX = 500  # the API's max_limit


class Listed(NamedTuple):
    """A list's items, and how many there are in all: at least ``count`` when not ``exact``
    (the task list stops counting 10,000 tasks past the page it answers)."""

    items: list[Any]
    count: int
    exact: bool = True


class CliError(Exception):
    """A failure to report as ``error: <line>`` lines on stderr, exiting with ``code``."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class ApiError(CliError):
    """The API answered 4xx/5xx; ``errors`` is the body's {field path: [reasons]}."""

    def __init__(
        self, message: str, code: int, status: int, detail: str, errors: dict[str, list[str]]
    ) -> None:
        super().__init__(message, code)
        self.status = status
        self.detail = detail
        self.errors = errors


# --- Configuration -----------------------------------------------------------------------------


def config_path() -> Path:
    explicit = os.environ.get("GPUCTL_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpuctl" / "config.json"


def load_config() -> dict[str, Any]:
    path = config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CliError(f"cannot read config {path}: {exc.strerror or exc}", EXIT_USAGE) from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CliError(
            f"config {path} is not valid JSON ({exc}); run gpuctl login again", EXIT_USAGE
        ) from exc
    if not isinstance(data, dict):
        raise CliError(f"config {path} must hold a JSON object; run gpuctl login again", EXIT_USAGE)
    return data


def save_config(data: dict[str, Any]) -> Path:
    """Write the config atomically, readable by its owner only (it holds a secret)."""
    path = config_path()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".tmp", dir=path.parent)
        try:
            if hasattr(os, "fchmod"):  # not on Windows before Python 3.13
                os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle, indent=2)
                handle.write("\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        os.chmod(path, 0o600)
    except OSError as exc:
        raise CliError(f"cannot write config {path}: {exc.strerror or exc}", EXIT_USAGE) from exc
    return path


def normalize_url(url: str) -> str:
    """``host:8000`` -> ``http://host:8000``; a pasted ``.../api/v1/`` is cut back to the base."""
    url = url.strip()
    if "://" not in url:
        url = f"http://{url}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CliError(f"bad server URL {url!r}: expected http(s)://host[:port]", EXIT_USAGE)
    path = parts.path.rstrip("/")
    if path.endswith(API_PREFIX.rstrip("/")):
        path = path[: -len(API_PREFIX.rstrip("/"))]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


@dataclass
class Settings:
    url: str | None
    token: str | None
    source: dict[str, str] = field(default_factory=dict)  # where each came from, for messages


def resolve(url: str | None = None, token: str | None = None) -> Settings:
    """Flags, then GPUCTL_URL / GPUCTL_TOKEN, then the config file."""
    source: dict[str, str] = {}
    config: dict[str, Any] | None = None

    def pick(name: str, flag: str | None, env: str) -> str | None:
        nonlocal config
        if flag:
            source[name] = f"--{name}"
            return flag
        if os.environ.get(env):
            source[name] = env
            return os.environ[env]
        if config is None:
            config = load_config()
        value = config.get(name)
        if isinstance(value, str) and value:
            source[name] = str(config_path())
            return value
        return None

    return Settings(pick("url", url, "GPUCTL_URL"), pick("token", token, "GPUCTL_TOKEN"), source)


# --- HTTP --------------------------------------------------------------------------------------


@dataclass
class Response:
    status: int
    headers: Any
    body: bytes

    def json(self) -> Any:
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except ValueError as exc:
            kind = self.headers.get("Content-Type", "unknown type") if self.headers else "?"
            raise CliError(
                f"the server answered {self.status} with {kind}, not JSON: "
                "is the URL a gpuplatform server?"
            ) from exc


class Client:
    def __init__(
        self, url: str, token: str, *, timeout: float = DEFAULT_TIMEOUT, debug: bool = False
    ) -> None:
        self.base = normalize_url(url)
        self.token = token
        self.timeout = timeout
        self.debug = debug

    def url_for(self, path: str, params: dict[str, Any] | None = None) -> str:
        url = f"{self.base}{API_PREFIX}{path.lstrip('/')}"
        query = {k: v for k, v in (params or {}).items() if v is not None and v != ""}
        return f"{url}?{urllib.parse.urlencode(query)}" if query else url

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json_body: Any = None,
        data: bytes | None = None,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
        what: str = "",
    ) -> Response:
        """Send one request, waiting out 429s; raise CliError/ApiError for anything but 2xx.

        ``what`` names the object for messages: "task 12: not found".
        """
        url = self.url_for(path, params)
        sent = {
            "Accept": "application/json",
            **({"Accept-Language": language} if (language := accept_language()) else {}),
            "Authorization": f"Bearer {self.token}",
            "User-Agent": f"gpuctl/{__version__} Python/{platform.python_version()}",
            **(headers or {}),
        }
        if json_body is not None:
            data = json.dumps(json_body).encode()
            content_type = "application/json"
        if content_type:
            sent["Content-Type"] = content_type
        # Retrying cannot do anything twice: a read, or a write the server recognises again.
        safe = method in ("GET", "HEAD") or "Idempotency-Key" in sent
        outage_ends = time.monotonic() + OUTAGE_WAIT
        attempt = 0
        while attempt <= MAX_THROTTLE_RETRIES:
            # S310: the URL's scheme was checked to be http(s) by normalize_url().
            req = urllib.request.Request(url, data=data, method=method, headers=sent)  # noqa: S310
            began = time.monotonic()
            self._trace(f"> {method} {url}")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as answer:  # noqa: S310
                    body = answer.read()
                    self._trace(f"< {answer.status} ({_ms(began)})")
                    return Response(answer.status, answer.headers, body)
            except urllib.error.HTTPError as exc:
                body = _read_quietly(exc)
                self._trace(f"< {exc.code} ({_ms(began)}) {body[:500]!r}")
                if exc.code == 429 and attempt < MAX_THROTTLE_RETRIES:
                    wait = retry_after(exc.headers)
                    self._trace(f"  throttled: retrying in {wait:g} s")
                    time.sleep(wait)
                    attempt += 1
                    continue
                if (
                    exc.code == 503
                    and safe
                    and _server_unavailable(exc.headers, body)
                    and time.monotonic() < outage_ends
                ):
                    wait = min(retry_after(exc.headers), max(outage_ends - time.monotonic(), 0.1))
                    self._trace(f"  unavailable: retrying in {wait:g} s")
                    time.sleep(wait)
                    continue
                raise self._api_error(exc.code, exc.headers, body, what) from exc
            except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                raise CliError(
                    f"cannot connect to {self.base}: {connect_reason(exc, self.timeout)} "
                    "(is the server running? set --url or GPUCTL_URL)",
                    EXIT_CONNECT,
                ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def get(self, path: str, params: dict[str, Any] | None = None, *, what: str = "") -> Any:
        return self.request("GET", path, params=params, what=what).json()

    def post(self, path: str, body: Any = None, *, what: str = "", **kwargs: Any) -> Any:
        return self.request("POST", path, json_body=body, what=what, **kwargs).json()

    def delete(self, path: str, *, what: str = "") -> Any:
        return self.request("DELETE", path, what=what).json()

    def list(
        self, path: str, params: dict[str, Any] | None = None, *, limit: int | None = None
    ) -> Listed:
        """A paginated list: the first ``limit`` items, or every page when limit is None."""
        items: list[Any] = []
        offset = 0
        while True:
            want = PAGE_MAX if limit is None else min(PAGE_MAX, limit - len(items))
            page = self.get(path, {**(params or {}), "limit": want, "offset": offset})
            if not isinstance(page, dict) or "results" not in page:  # not paginated
                return Listed(page, len(page)) if isinstance(page, list) else Listed([page], 1)
            results = page["results"]
            items.extend(results)
            count = int(page.get("count", len(items)))
            offset += len(results)
            done = not results or not page.get("next")
            if done or (limit is not None and len(items) >= limit):
                return Listed(items, count, exact=page.get("count_exact", True) is not False)

    def _api_error(self, status: int, headers: Any, body: bytes, what: str) -> ApiError:
        detail, errors = "", {}
        try:
            payload = json.loads(body) if body else {}
        except ValueError:
            payload = None
        if isinstance(payload, dict):
            detail = str(payload.get("detail") or "")
            raw = payload.get("errors")
            if isinstance(raw, dict):
                errors = {
                    str(k): [str(r) for r in (v if isinstance(v, list) else [v])]
                    for k, v in raw.items()
                }
        reason = http.client.responses.get(status, "")
        prefix = f"{what}: " if what else ""
        if status == 401:
            message, code = f"token rejected (401): {detail or 'unauthorized'}", EXIT_AUTH
        elif status == 403:
            message, code = f"{prefix}forbidden (403): {detail or 'not allowed'}", EXIT_AUTH
        elif status == 404:
            lines = _field_lines(errors) if errors else [detail or "not found"]
            message, code = "\n".join(f"{prefix}{line}" for line in lines), EXIT_NOT_FOUND
        elif status == 409:
            lines = _field_lines(errors) if errors else [detail or "conflict"]
            message, code = "\n".join(f"{prefix}{line}" for line in lines), EXIT_CONFLICT
        elif status == 429:
            wait = retry_after(headers)
            message = f"rate limited (429): still refused after {MAX_THROTTLE_RETRIES} retries"
            message, code = f"{message}; try again in {wait:g} s", EXIT_FAILED
        elif status >= 500:
            message = f"server error ({status} {reason})" + (f": {detail}" if detail else "")
            code = EXIT_FAILED
        else:
            lines = _field_lines(errors) if errors else [detail or f"refused ({status} {reason})"]
            message, code = "\n".join(f"{prefix}{line}" for line in lines), EXIT_FAILED
        return ApiError(message, code, status, detail, errors)

    def _trace(self, line: str) -> None:
        if self.debug:
            print(f"[gpuctl] {line}", file=sys.stderr)


def _field_lines(errors: dict[str, list[str]]) -> list[str]:
    return [f"{name}: {reason}" for name, reasons in errors.items() for reason in reasons]


def _ms(began: float) -> str:
    return f"{(time.monotonic() - began) * 1000:.0f} ms"


def _read_quietly(exc: urllib.error.HTTPError) -> bytes:
    try:
        return exc.read()
    except (OSError, http.client.HTTPException):
        return b""


def accept_language(environ: Any = None) -> str:
    """The Accept-Language for the user's locale, so the server writes reasons and messages in
    it: the first of LC_ALL, LC_MESSAGES and LANG that is set, as POSIX reads them
    ("zh_CN.UTF-8" asks for zh-CN, which the server serves as Simplified Chinese); none for
    the C and POSIX locales (the server's default, English)."""
    environ = os.environ if environ is None else environ
    for name in ("LC_ALL", "LC_MESSAGES", "LANG"):
        value = environ.get(name, "")
        if value:
            locale = value.split(".")[0].split("@")[0]
            if locale in ("C", "POSIX") or not locale.replace("_", "").isalpha():
                return ""
            return locale.replace("_", "-")
    return ""


def _server_unavailable(headers: Any, body: bytes) -> bool:
    """A 503 about the whole server (the database unreachable, load shed: Retry-After and no
    field named), not about one object (a log whose node is out of reach names ``attempt``,
    and its caller decides whether to keep trying)."""
    if not (headers and headers.get("Retry-After")):
        return False
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    return isinstance(answer, dict) and not answer.get("errors")


def retry_after(headers: Any) -> float:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date), 1 s by default."""
    raw = (headers.get("Retry-After") if headers else None) or ""
    try:
        seconds = float(raw)
    except ValueError:
        moment = email.utils.parsedate_to_datetime(raw) if raw else None
        seconds = moment.timestamp() - time.time() if moment else 1.0
    return min(max(seconds, 0.1), MAX_RETRY_AFTER)


def connect_reason(exc: BaseException, timeout: float) -> str:
    reason: Any = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return "unknown host"
    if isinstance(reason, TimeoutError | socket.timeout):
        return f"timed out after {timeout:g} s"
    if isinstance(reason, ssl.SSLCertVerificationError):
        return f"TLS certificate not trusted ({reason.verify_message})"
    if isinstance(reason, ssl.SSLError):
        return f"TLS error ({reason.reason or reason})"
    if isinstance(reason, http.client.RemoteDisconnected | ConnectionResetError):
        return "the server closed the connection"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return str(reason) or type(reason).__name__
