"""gpuctl: the command-line client of gpuplatform's REST API v1.

Standard library only (argparse, urllib, json), so it runs from any machine with Python 3.11+;
PyYAML is used when importable (``-o yaml``). Run it as ``gpuctl`` or ``python -m gpuctl``.

Exit codes, for scripts:

    0    ok
    1    the API refused the request (a 4xx not listed below, e.g. a bad spec; 429 after retries),
         the server failed (5xx), or a task did not succeed while waiting for it (--wait, wait)
    2    usage error (bad arguments, unreadable spec file, -o yaml without PyYAML)
    3    cannot connect to the server
    4    authentication: not logged in, token rejected (401) or role not allowed (403)
    5    not found (404): no such task, node, token or log (another tenant's task included)
    6    conflict (409): the task's state does not allow the action (cancel twice, ...)
    130  interrupted (Ctrl-C)

Where the server and token come from, first match wins: ``--url``/``--token``, the environment
(``GPUCTL_URL``, ``GPUCTL_TOKEN``), the config file written by ``gpuctl login``
(``$GPUCTL_CONFIG``, else ``~/.config/gpuctl/config.json``, mode 0600).
"""

__version__ = "0.1.0"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CONNECT = 3
EXIT_AUTH = 4
EXIT_NOT_FOUND = 5
EXIT_CONFLICT = 6
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """\
exit codes:
  0    ok
  1    the API refused the request (4xx not below; 429 after retries), the server failed
       (5xx), or a task did not succeed while waiting for it (--wait, wait)
  2    usage error (bad arguments, unreadable spec file, -o yaml without PyYAML)
  3    cannot connect to the server
  4    authentication: not logged in, token rejected (401), role not allowed (403)
  5    not found (404): no such task (another tenant's included), node, token or log
  6    conflict (409): the task's state does not allow the action
  130  interrupted (Ctrl-C)"""
