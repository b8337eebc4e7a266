#!/usr/bin/env python3
"""Ask the deepseek-7b server of examples/deepseek-7b.yaml a question; print the answer and speed.

The server is vLLM's OpenAI-compatible API server, started by gpuplatform as a service (the
spec's service block): the client asks the platform's API for the task's ``service_url`` and
calls the server through it with the tenant's token (``GPUCTL_URL`` and ``GPUCTL_TOKEN``, as
gpuctl reads them, or ``--platform`` and ``--token``):

    python3 examples/deepseek_client.py --task 42 --prompt "What is a GPU scheduler?"
    python3 examples/deepseek_client.py --url http://127.0.0.1:20417 --stream --max-tokens 256

A platform whose API has no ``service_url`` yet: the client falls back to the port the service
was given on its node (``service.service_port``), reachable from that node only. ``--url``
calls a server directly.

It calls ``POST /v1/chat/completions`` and prints the answer, then the completion tokens, the
time and tokens/s (with ``--stream`` also the time to the first token). Standard library only.
Exit status: 0 on an answer, 2 when the server cannot be reached or refuses the request.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

DEFAULT_MODEL = "deepseek-ai/deepseek-llm-7b-chat"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Chat with the vLLM server of examples/deepseek-7b.yaml."
    )
    parser.add_argument("--task", type=int, help="the service's task id (its service_url)")
    parser.add_argument("--url", default="", help="the server itself, instead of --task")
    parser.add_argument(
        "--platform",
        default=os.environ.get("GPUCTL_URL", "http://127.0.0.1:8000"),
        help="the platform (default $GPUCTL_URL, else http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--token", default=os.environ.get("GPUCTL_TOKEN", ""), help="default $GPUCTL_TOKEN"
    )
    parser.add_argument("--prompt", default="用一句话介绍一下你自己。Then say it in English.")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"default {DEFAULT_MODEL}")
    parser.add_argument("--system", default="", help="an optional system message")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY", ""),
        help="only if the server was started with --api-key (default $OPENAI_API_KEY)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
    return parser.parse_args(argv)


def service_url(args: argparse.Namespace) -> str:
    """The task's ``service_url`` from the platform's API; without one (an API before the
    proxy), the port its service was given on its node. ValueError when it has neither."""
    request = urllib.request.Request(  # noqa: S310 (the user's own platform)
        f"{args.platform.rstrip('/')}/api/v1/tasks/{args.task}/"
    )
    request.add_header("Authorization", f"Bearer {args.token}")
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
        task = json.load(answer)
    if task.get("service_url"):
        return urllib.parse.urljoin(args.platform.rstrip("/") + "/", task["service_url"])
    port = (task.get("service") or {}).get("service_port")
    if port is None:
        raise ValueError(f"task {args.task} has no service running (state {task.get('state')})")
    return f"http://127.0.0.1:{port}"


def build_request(args: argparse.Namespace) -> urllib.request.Request:
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.prompt})
    body: dict[str, object] = {
        "model": args.model,
        "messages": messages,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
    }
    if args.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    request = urllib.request.Request(  # noqa: S310 (the URL is the user's own server)
        args.url.rstrip("/") + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
    )
    request.add_header("Content-Type", "application/json")
    if args.api_key:
        request.add_header("Authorization", f"Bearer {args.api_key}")
    elif args.task is not None and args.token:  # through the platform: its token
        request.add_header("Authorization", f"Bearer {args.token}")
    return request


def complete(response) -> tuple[str, int | None]:
    data = json.load(response)
    answer = data["choices"][0]["message"]["content"] or ""
    return answer, (data.get("usage") or {}).get("completion_tokens")


def stream(response, started: float) -> tuple[str, int | None, float | None]:
    """Read server-sent events, printing content as it arrives."""
    parts, tokens, first = [], None, None
    for raw in response:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            break
        event = json.loads(payload)
        if event.get("usage"):
            tokens = event["usage"].get("completion_tokens", tokens)
        for choice in event.get("choices") or []:
            text = (choice.get("delta") or {}).get("content") or ""
            if text:
                if first is None:
                    first = time.monotonic() - started
                parts.append(text)
                print(text, end="", flush=True)
    print()
    return "".join(parts), tokens, first


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.url:
        if args.task is None:
            print("error: give --task (the service's task id) or --url", file=sys.stderr)
            return 2
        try:
            args.url = service_url(args)
        except urllib.error.HTTPError as exc:
            print(f"error: the platform answered {exc.code} for task {args.task}", file=sys.stderr)
            return 2
        except (urllib.error.URLError, OSError, ValueError) as exc:
            print(f"error: cannot find task {args.task}'s service: {exc}", file=sys.stderr)
            return 2
    request = build_request(args)
    started = time.monotonic()
    first = None
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:  # noqa: S310
            if args.stream:
                answer, tokens, first = stream(response, started)
            else:
                answer, tokens = complete(response)
                print(answer)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace").strip()
        print(
            f"error: {args.url} answered {exc.code} {exc.reason}: {detail[:500]}", file=sys.stderr
        )
        return 2
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        hint = (
            " Is the deepseek-7b task running? Loading the model takes a minute or two."
            if isinstance(reason, ConnectionRefusedError)
            else ""
        )
        print(f"error: cannot reach {args.url}: {reason}.{hint}", file=sys.stderr)
        return 2
    except (KeyError, IndexError, ValueError) as exc:
        print(f"error: unexpected answer from {args.url}: {exc!r}", file=sys.stderr)
        return 2
    elapsed = time.monotonic() - started
    if tokens is None:  # a server that reports no usage: count words, roughly
        tokens = len(answer.split())
        kind = "words (no usage reported)"
    else:
        kind = "tokens"
    ttft = f", first token after {first:.2f} s" if first is not None else ""
    rate = tokens / max(elapsed, 1e-9)
    print(f"--- {tokens} {kind} in {elapsed:.2f} s: {rate:.1f} {kind.split()[0]}/s{ttft}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
