"""Settings for gpuplatform, read from the environment (see docs/configuration.md)."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import stat
import sys
import warnings
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from gpuplatform import connections, env
from gpuplatform.dburl import parse_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env.string("GPUPLATFORM_VAR_DIR", str(BASE_DIR / "var"))).resolve()
TESTING = "pytest" in sys.modules or env.boolean("GPUPLATFORM_TESTING", False)

DEBUG = env.boolean("DEBUG", False)
SECRET_KEY = env.string("SECRET_KEY")
if not SECRET_KEY:
    if not (DEBUG or TESTING):
        raise ImproperlyConfigured(
            "SECRET_KEY: required when DEBUG is off (set SECRET_KEY or SECRET_KEY_FILE)"
        )
    # Development only: never reaches production because DEBUG must be on to get here.
    SECRET_KEY = "dev-insecure-gpuplatform-key-do-not-use-in-production"  # noqa: S105

ALLOWED_HOSTS = env.string_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.string_list("CSRF_TRUSTED_ORIGINS", [])

# daphne serves the platform (`python -m daphne`, gpuplatform.webserve) without being an app
# here: its app only swaps `runserver` for an ASGI one, and imports Twisted, autobahn and
# OpenSSL into every process that loads the settings (about 18 MiB each: the scheduler, the
# node agent, every django-q2 cluster), which never serve HTTP (bench_idle).
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "channels_postgres",
    "tenants",
    "scheduling",
    "nodeagent",
    "replay",
    "monitoring",
    "telemetry",
    "portal",
    "live",
    # After the platform's apps: its `qcluster` command (scheduling) wraps django-q2's, and of
    # two commands of one name Django runs the one of the app listed first.
    "django_q",
]

MIDDLEWARE = [
    # First: X-Forwarded-* are believed from TRUSTED_PROXIES only.
    "gpuplatform.middleware.TrustedProxyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Counts /api/ requests for /metrics (every answer, throttled and failed ones too).
    "telemetry.middleware.count_api_requests",
    # Serves /static/ from the web process itself (daphne does not serve static files).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # After sessions, before common: the language comes from the switcher's cookie, else the
    # browser's Accept-Language (docs/user-guide.md: "Languages").
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "gpuplatform.urls"
WSGI_APPLICATION = "gpuplatform.wsgi.application"
ASGI_APPLICATION = "gpuplatform.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.context.portal",
            ],
        },
    },
]

# --- Stock parts -----------------------------------------------------------------------------
# Three parts of the platform replace a framework's own: the ASGI handler (asgi), the garbage
# collector's settings (gc) and django-q2's broker (broker). GPUPLATFORM_STOCK names those to
# run stock instead; `make bench` (stock) measures each both ways (docs/configuration.md).
STOCK_PARTS = ("asgi", "gc", "broker")
GPUPLATFORM_STOCK = frozenset(env.string_list("GPUPLATFORM_STOCK", []))
if GPUPLATFORM_STOCK - set(STOCK_PARTS):
    raise ImproperlyConfigured(
        f"GPUPLATFORM_STOCK: expected a comma-separated list of {', '.join(STOCK_PARTS)}; "
        f"got {', '.join(sorted(GPUPLATFORM_STOCK - set(STOCK_PARTS)))}"
    )

# --- Database --------------------------------------------------------------------------------
# PostgreSQL only: correctness rests on its row locks and advisory locks.
DATABASE_URL = env.string("DATABASE_URL")
if not DATABASE_URL:
    from gpuplatform.embedded_db import embedded_database_url

    # platformdirs warns when XDG_RUNTIME_DIR is unset (root shells, CI); pgserver copes.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    DATABASE_URL = embedded_database_url(VAR_DIR)
try:
    _default_db = parse_database_url(DATABASE_URL, conn_max_age=60, conn_health_checks=True)
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL: {exc}") from exc
if _default_db["ENGINE"] != "django.db.backends.postgresql":
    raise ImproperlyConfigured(
        f"DATABASE_URL: only PostgreSQL is supported, got engine {_default_db['ENGINE']}"
    )
# Each process's connections say whose they are in pg_stat_activity (gpuplatform/connections.py).
# gpuplatform.asgi and gpuplatform.wsgi are the web servers' entry points and nothing else
# imports them before settings load, so their presence in sys.modules marks a web process (no
# environment variable that children could inherit).
WEB_PROCESS = any(name in sys.modules for name in ("gpuplatform.asgi", "gpuplatform.wsgi"))
APPLICATION_NAME = connections.application_name(WEB_PROCESS)
# The hot statements the platform writes in SQL (gpuplatform.db.server_bound_cursor: a pass's
# reads and placements, a launch, the agents' start and end reports, a submission's token,
# rate step, estate read and INSERT) are prepared once they have run 5 times on a connection,
# so PostgreSQL stops parsing and planning them each time (planning was a large share of the
# server's CPU for these short statements). Django turns psycopg's preparing off by default,
# for poolers such as PgBouncer in transaction mode, which we do not use; its own queries bind
# on the client and are never prepared either way. Not for channels_postgres, which hands its
# OPTIONS to libpq (which knows no such option).
# A client that vanishes without a word (its host dead or cut off) leaves its session open on
# the server, idle or waiting for an acknowledgement, until the kernel's TCP keepalive gives
# up (hours by default), and with it the locks it holds: a scheduler cut off in the middle of a
# pass kept the pass lock, and with it every other scheduler waiting. DB_PEER_TIMEOUT bounds
# that: the server probes an idle client (keepalives) and drops one that leaves its data
# unacknowledged (tcp_user_timeout) after about that many seconds. Per session (these are
# PostgreSQL settings any client may set), so no server configuration is needed. The other way
# round too: a server whose machine vanishes (a primary lost with its host, before a standby is
# promoted) leaves each client waiting on its connections, a request or a pass on its query,
# for as long: libpq's own keepalives and tcp_user_timeout give up on it after about as many
# seconds, and the next connection goes to the server the URL names next.
DB_PEER_TIMEOUT = env.integer("DB_PEER_TIMEOUT", 3, minimum=0)
_OPTIONS = {
    **_default_db.get("OPTIONS", {}),
    "prepare_threshold": 5,
    "application_name": APPLICATION_NAME,
}
_peer_timeouts: dict[str, int] = {}
if DB_PEER_TIMEOUT:
    _idle = max(1, DB_PEER_TIMEOUT // 3)
    _peer_timeouts = {
        "keepalives": 1,
        "keepalives_idle": _idle,
        "keepalives_interval": 1,
        "keepalives_count": max(1, DB_PEER_TIMEOUT - _idle),
        "tcp_user_timeout": DB_PEER_TIMEOUT * 1000,
    }
    _OPTIONS.update(_peer_timeouts)
    _OPTIONS["options"] = " ".join(
        filter(None, [
            _OPTIONS.get("options", ""),
            f"-c tcp_keepalives_idle={_idle} -c tcp_keepalives_interval=1",
            f"-c tcp_keepalives_count={max(1, DB_PEER_TIMEOUT - _idle)}",
            f"-c tcp_user_timeout={DB_PEER_TIMEOUT * 1000}",
        ])
    )  # fmt: skip
DATABASES = {
    "default": {**_default_db, "OPTIONS": _OPTIONS},
    # channels_postgres keeps its message table in the same database.
    "channels_postgres": {**_default_db, "TEST": {"MIRROR": "default"}},
}
# Web processes borrow connections from a bounded pool (psycopg_pool), so a flood of requests
# cannot open more than DB_POOL_SIZE connections per process (under ASGI every request runs in
# a thread of its own, and persistent per-thread connections piled up: NOTES.md). Only web
# processes: a pool's background threads and open sockets must never be inherited across fork,
# and qcluster, the node agent and task supervisors fork.
DB_POOL_SIZE = env.integer("DB_POOL_SIZE", 8, minimum=0)
# Seconds a request waits for a pooled connection (also how long it takes to answer 503 while
# the database is unreachable).
DB_POOL_TIMEOUT = env.integer("DB_POOL_TIMEOUT", 5, minimum=1)
if WEB_PROCESS and DB_POOL_SIZE:
    DATABASES["default"] = {
        **_default_db,
        "CONN_MAX_AGE": 0,  # Django refuses persistent connections with a pool
        "OPTIONS": {
            **_OPTIONS,
            "pool": {
                "min_size": min(2, DB_POOL_SIZE),
                "max_size": DB_POOL_SIZE,
                "timeout": DB_POOL_TIMEOUT,
                # A failed reconnection is given up after this and retried on the next
                # request, so the pool's backoff never grows past a few seconds and the web
                # process recovers by itself soon after the database comes back.
                "reconnect_timeout": 10,
            },
        },
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CACHES = {
    # Shared by every process (throttles, coalescing flags): LocMem would be per process.
    "default": {
        "BACKEND": "django.core.cache.backends.db.DatabaseCache",
        "LOCATION": "gpuplatform_cache",
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
if TESTING:
    # The default hasher is slow on purpose; tests hash thousands of passwords.
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

LANGUAGE_CODE = "en"
# The portal, the admin and the API's error messages speak these; catalogues in locale/,
# compiled by `make setup` (compilemessages).
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = env.string("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if TESTING
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
# Tenant members and operators sign in here (portal/); `/` sends each where they work.
# Tests serve static files straight from the apps and static/ (no collectstatic run), as
# runserver would: the browser tests' daphne needs the admin's CSS and the portal's scripts.
WHITENOISE_USE_FINDERS = DEBUG or TESTING
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

# --- Security ----------------------------------------------------------------------------------
# Reverse proxies whose X-Forwarded-For / X-Forwarded-Proto are believed (addresses or
# networks). From anyone else those headers are dropped (gpuplatform.middleware), so a client
# cannot pick its own address for throttling, nor claim HTTPS.
TRUSTED_PROXIES = env.string_list("TRUSTED_PROXIES", [])
try:
    TRUSTED_PROXY_NETWORKS = [ipaddress.ip_network(p, strict=False) for p in TRUSTED_PROXIES]
except ValueError as exc:
    raise ImproperlyConfigured(f"TRUSTED_PROXIES: {exc}") from None
SESSION_COOKIE_SECURE = env.boolean("SECURE_COOKIES", not DEBUG and not TESTING)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# HTTPS in production (docs/deployment.md: "Production"): off by default because `make run`
# serves plain HTTP on loopback. HSTS tells browsers to use HTTPS only, for this long (seconds).
SECURE_HSTS_SECONDS = env.integer("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.boolean("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env.boolean("SECURE_HSTS_PRELOAD", False)
SECURE_SSL_REDIRECT = env.boolean("SECURE_SSL_REDIRECT", False)
# Probes (kubelet, load balancers) speak plain HTTP to the process: never redirect them.
SECURE_REDIRECT_EXEMPT = [r"^livez$", r"^readyz$", r"^healthz$"]
# The header a TLS-terminating proxy sets to "https" (e.g. X-Forwarded-Proto). Believed only
# from TRUSTED_PROXIES: the middleware drops it from anyone else.
_proxy_ssl_header = env.string("SECURE_PROXY_SSL_HEADER", "")
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_ssl_header.strip().upper().replace("-", "_"), "https")
    if _proxy_ssl_header.strip()
    else None
)
if SECURE_PROXY_SSL_HEADER and not TRUSTED_PROXIES:
    raise ImproperlyConfigured(
        "SECURE_PROXY_SSL_HEADER: needs TRUSTED_PROXIES (the proxies allowed to set it)"
    )

# --- REST API --------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "gpuplatform.api_defaults.Page",
    "PAGE_SIZE": 50,
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "gpuplatform.api.handle_exception",
    "DEFAULT_THROTTLE_CLASSES": ["gpuplatform.api_defaults.TenantThrottle"],
}


def _rate(name: str, default: str) -> str:
    rate = env.string(name, default)
    if not re.fullmatch(r"[1-9]\d*/(s|sec|m|min|h|hour|d|day)", rate):
        raise ImproperlyConfigured(
            f"{name}: expected requests/period such as 600/min (periods: s, min, h, day), "
            f"got {rate!r}"
        )
    return rate


# Requests per tenant (or per user for browser sessions), paced evenly and shared by every web
# process (gpuplatform/throttle.py). A tenant gets 5 a second, a small share of what one
# daphne process serves on the 2-core reference machine (bench/bench_neighbours.py prints that
# capacity), so one tenant flooding the API keeps another's p95 latency within twice its
# baseline. Raise it with the number of web processes and cores.
API_THROTTLE_RATE = _rate("API_THROTTLE_RATE", "300/min")
# Requests a key may send at once after a pause, before the even pace applies.
API_THROTTLE_BURST = env.integer("API_THROTTLE_BURST", 10, minimum=1)
# API requests one daphne process has handed to Django and not yet answered; past this, the
# next is answered 503 with Retry-After at once (gpuplatform.throttle.EarlyThrottle). daphne
# runs the views one at a time, so a long queue only makes every answer later; past it, a
# prompt 503 serves a client better than an answer that keeps getting later.
WEB_MAX_IN_FLIGHT = env.integer("WEB_MAX_IN_FLIGHT", 64, minimum=1)
# Requests without a valid token (none, bad, expired, revoked), per client address.
API_ANON_THROTTLE_RATE = _rate("API_ANON_THROTTLE_RATE", "300/min")
# Sign-in attempts at /accounts/login/, per username and per client address (each its own
# pace): password guessing gets a few tries a minute, a person mistyping never notices.
LOGIN_THROTTLE_RATE = _rate("LOGIN_THROTTLE_RATE", "10/min")
SPECTACULAR_SETTINGS = {
    "TITLE": "gpuplatform API",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "gpuplatform.api_schema.add_error_answers",
    ],
    "ENUM_NAME_OVERRIDES": {
        "TaskStateEnum": "scheduling.models.TASK_STATE_CHOICES",
        "GpuStateEnum": "scheduling.models.GpuState",
        "NodeStateEnum": "scheduling.models.NodeState",
    },
}

# --- Background work (django-q2, ORM broker in PostgreSQL) ----------------------------------
Q_TIMEOUT = env.integer("Q_TIMEOUT", 60, minimum=1)
Q_CLUSTER = {
    "name": "gpuplatform",
    "orm": "default",
    "workers": env.integer("Q_WORKERS", 2, minimum=1),
    "timeout": Q_TIMEOUT,
    # django-q2 hands a task out again after `retry` seconds even while it still runs: keep
    # retry well above timeout plus queueing time (NOTES.md), and tasks idempotent anyway.
    "retry": Q_TIMEOUT * 3,
    "max_attempts": 3,
    "ack_failures": True,
    "catch_up": False,
    # Successful jobs are not stored (-1; failures always are): the platform records what a
    # pass or a launch did in its own tables. With 1,000, each finished job made the cluster's
    # monitor lock up to 1,000 stored results (SELECT ... FOR UPDATE) to prune one, every
    # cluster contending for the same rows (NOTES.md). A positive Q_SAVE_LIMIT keeps that many
    # per function.
    "save_limit": env.integer("Q_SAVE_LIMIT", -1, minimum=-1),
    "save_limit_per": "func",
    # Queues are woken by LISTEN/NOTIFY, not polled (gpuplatform/broker.py).
    "broker_class": "gpuplatform.broker.NotifyingOrm",
    "ALT_CLUSTERS": {},
}
if "broker" in GPUPLATFORM_STOCK:
    # django-q2's own ORM broker, polling the same table every `poll` seconds (its default).
    del Q_CLUSTER["broker_class"]
if TESTING:
    # Tests run background work inline, except in processes a test starts to behave like
    # production (Q_SYNC=0: node agents and clusters exchanging work through the broker).
    Q_CLUSTER = {**Q_CLUSTER, "sync": env.boolean("Q_SYNC", True)}

# --- Channels ----------------------------------------------------------------------------------
# postgres: channels_postgres (LISTEN/NOTIFY), which carries events from the node agent and the
# scheduler to the web processes; memory: one process only, the default of in-process tests.
# Tests that start daphne and a publisher as separate processes ask for postgres (NOTES.md).
CHANNEL_LAYER = env.choice(
    "CHANNEL_LAYER", "memory" if TESTING else "postgres", ("postgres", "memory")
)
if CHANNEL_LAYER == "memory":
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
else:
    CHANNEL_LAYERS = {
        "default": {
            # channels_postgres's layer, with a listener that reconnects when its connection
            # dies (a restart, a fail-over): gpuplatform/channel_layer.py
            "BACKEND": "gpuplatform.channel_layer.PostgresChannelLayer",
            # TIME_ZONE must be present or the constructor raises KeyError (NOTES.md).
            "CONFIG": {
                **_default_db,
                "TIME_ZONE": None,
                "capacity": 1000,
                "OPTIONS": {
                    **_default_db.get("OPTIONS", {}),  # what DATABASE_URL says (sslmode...)
                    **_peer_timeouts,
                    "application_name": f"{APPLICATION_NAME} channels",
                },
                # Its library's default opens four connections per web process at once.
                "PSYCOPG_OPTIONS": {"min_size": 1, "max_size": connections.CHANNEL_POOL_SIZE},
            },
        }
    }
# Live dashboard: sample frames a websocket may have unacknowledged before newer samples replace
# older ones instead of queueing (a slow browser loses old points, never slows the sender).
LIVE_UNACKED_FRAMES = env.integer("LIVE_UNACKED_FRAMES", 2, minimum=1)

# --- The GPU estate ---------------------------------------------------------------------------
GPUPLATFORM_CONFIG = Path(
    env.string("GPUPLATFORM_CONFIG", str(BASE_DIR / "configs" / "scheduler.yaml"))
)
# auto: NVML when an NVIDIA driver answers, else the configuration's simulated GPUs.
GPU_BACKEND = env.choice("GPU_BACKEND", "auto", ("auto", "nvml", "simulated"))
NODE_NAME = env.string("NODE_NAME")
# Where the control plane reaches this node's agent for its tasks' logs (host[:port], default
# port 8470; port 0: a free one). Unset: loopback on a free port, enough when the web runs on
# this host; set it on every GPU host the web does not run on (docs/deployment.md).
NODE_ADVERTISE_ADDRESS = env.string("NODE_ADVERTISE_ADDRESS", "")

# --- Prometheus /metrics -------------------------------------------------------------------------
# A scraper presenting "Authorization: Bearer <METRICS_TOKEN>" is served from any address;
# without the token, only clients whose address is in METRICS_ALLOWED_ADDRESSES (addresses or
# networks, e.g. 10.0.0.0/8) are. Both may be used together; neither leaves loopback only.
METRICS_TOKEN = env.string("METRICS_TOKEN", "")
METRICS_ALLOWED_ADDRESSES = env.string_list("METRICS_ALLOWED_ADDRESSES", ["127.0.0.1", "::1"])
try:
    for _network in METRICS_ALLOWED_ADDRESSES:
        ipaddress.ip_network(_network, strict=False)
except ValueError as _exc:
    raise ImproperlyConfigured(f"METRICS_ALLOWED_ADDRESSES: {_exc}") from None

# --- Running tasks (the launcher) -----------------------------------------------------------
# Each tenant's work directories live under TASKS_ROOT/<tenant>; a task's workdir is relative
# to that and may not escape it. Logs: TASK_LOG_DIR/<tenant>/<task id>/attempt-<n>.log.
#
# As root, tasks run as tenant users, who must pass through every directory above their own
# and above the shipped examples. Where the checkout's parents are closed to other users (root's
# home is 0700 on Debian; so is a `mktemp -d` directory), those default to a system location
# instead, one per checkout, as Slurm keeps its spool under /var/spool.


def _crossable(path: Path) -> bool:
    """Whether other users may pass through every existing directory from / down to ``path``."""
    for directory in [*reversed(path.parents), path]:
        try:
            if not os.stat(directory).st_mode & stat.S_IXOTH:
                return False
        except FileNotFoundError:
            break  # what is missing is made by the node, crossable
    return True


SYSTEM_DIR = Path(env.string("GPUPLATFORM_SYSTEM_DIR", "/var/lib/gpuplatform")) / (
    f"{BASE_DIR.name}-{hashlib.sha256(str(BASE_DIR).encode()).hexdigest()[:8]}"
)
_IN_CHECKOUT = os.geteuid() != 0 or _crossable(VAR_DIR)
TASKS_ROOT = Path(
    env.string("GPUPLATFORM_TASKS_ROOT", str((VAR_DIR if _IN_CHECKOUT else SYSTEM_DIR) / "tasks"))
).resolve()
# What $GPUPLATFORM_EXAMPLES points tasks at: the checkout's examples/, or a copy of it that the
# node agent keeps under SYSTEM_DIR when tenant users could not reach the checkout's.
EXAMPLES_DIR = Path(
    env.string(
        "GPUPLATFORM_EXAMPLES_DIR",
        str(BASE_DIR / "examples" if _IN_CHECKOUT else SYSTEM_DIR / "examples"),
    )
).resolve()
TASK_LOG_DIR = Path(env.string("GPUPLATFORM_TASK_LOG_DIR", str(VAR_DIR / "logs"))).resolve()
# Seconds between SIGTERM and SIGKILL when a task is cancelled, preempted or times out.
TASK_STOP_GRACE = env.integer("TASK_STOP_GRACE", 30, minimum=0)
# When the node agent runs as root, each tenant's tasks run as its own Unix user: the
# tenant's unix_user, or one the platform creates named TENANT_USER_PREFIX + tenant name.
TENANT_USER_PREFIX = env.string("TENANT_USER_PREFIX", "gpu-")
if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,15}", TENANT_USER_PREFIX):
    raise ImproperlyConfigured(
        f"TENANT_USER_PREFIX: lowercase letters, digits, '_' and '-' (at most 16, not starting "
        f"with a digit or '-'), got {TENANT_USER_PREFIX!r}"
    )
# One cgroup per attempt, under <CGROUP_NAME>/<node> in each cgroup hierarchy (root only).
USE_CGROUPS = env.boolean("USE_CGROUPS", True)
CGROUP_NAME = env.string("CGROUP_NAME", "gpuplatform")
# The node agent turns on the cgroup v2 mount's favordynmods (cgroups.favor_dynmods): a task's
# first process otherwise waits for the kernel to join its new cgroup after a quiet spell.
CGROUP_FAVOR_DYNMODS = env.boolean("CGROUP_FAVOR_DYNMODS", True)
if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", CGROUP_NAME) or CGROUP_NAME in (".", ".."):
    raise ImproperlyConfigured(f"CGROUP_NAME: a plain directory name, got {CGROUP_NAME!r}")
# A task opens only the device nodes of the GPUs it holds (nodeagent/launcher/gpufence.py):
# "auto" uses an eBPF device program on the attempt's cgroup v2 where there is one, else the v1
# devices controller; "devices" and "bpf" insist on one (an attempt fails if it cannot be
# fenced that way); "off" fences nothing. Needs cgroups (root, USE_CGROUPS).
GPU_FENCE = env.choice("GPU_FENCE", "auto", ("auto", "devices", "bpf", "off"))
# Where the GPUs' device nodes (nvidia0, nvidia1, ..., nvidiactl) are: /dev on a real host; a
# directory of stand-in nodes in tests.
GPU_DEVICE_DIR = Path(env.string("GPU_DEVICE_DIR", "/dev"))
if not GPU_DEVICE_DIR.is_absolute():
    raise ImproperlyConfigured(f"GPU_DEVICE_DIR: an absolute path, got {str(GPU_DEVICE_DIR)!r}")
# Services (a task's service block): the ports "port: auto" takes from on a node, and the
# address a service is told to listen on (GPUPLATFORM_SERVICE_HOST); the node's loopback keeps
# it off the network, where only the platform's proxy reaches it.
SERVICE_PORTS = env.string("SERVICE_PORTS", "20000-29999")
_low, _, _high = (SERVICE_PORTS or "").partition("-")
if not (_low.isdigit() and _high.isdigit() and 1024 <= int(_low) <= int(_high) <= 65535):
    raise ImproperlyConfigured(
        "SERVICE_PORTS: expected a range such as 20000-29999 within 1024-65535, "
        f"got {SERVICE_PORTS!r}"
    )
SERVICE_PORT_RANGE = (int(_low), int(_high))
SERVICE_HOST = env.string("SERVICE_HOST", "127.0.0.1")
# User failures are retried after RETRY_BACKOFF * 2^(n-1) seconds (at most an hour).
RETRY_BACKOFF = env.integer("RETRY_BACKOFF", 10, minimum=0)
# Infrastructure failures (node lost, supervisor gone) requeue a task this many times, then
# hold it with the reason for a person to look at.
INFRA_REQUEUE_LIMIT = env.integer("INFRA_REQUEUE_LIMIT", 5, minimum=0)
# How the node's launch worker starts a supervisor: "fork" (fast: Django is loaded already) or
# "exec" (a fresh interpreter that imports Django first; for platforms where forking is
# unwelcome).
SUPERVISOR_START = env.choice("SUPERVISOR_START", "fork", ("fork", "exec"))
# How many attempts one supervisor process may supervise, one after another: a supervisor whose
# attempt ended plainly waits at the node's spawner for the next instead of exiting (a fork and
# an exit fewer per task). 1: every attempt gets a new process.
SUPERVISOR_REUSE = env.integer("SUPERVISOR_REUSE", 100, minimum=1)
# The small program (nodeagent/launcher/gpup_exec.c, built by make into the virtualenv) that
# takes a task's process from the supervisor's vfork to the command: cgroup, user, work
# directory. Empty, or missing on disk: the supervisor does that in Python (preexec_fn), which
# copies its whole address space for each task.
TASK_EXEC_HELPER = env.string("TASK_EXEC_HELPER", str(Path(sys.prefix) / "bin" / "gpup-exec"))
# Each task in PID and mount namespaces of its own (root, through TASK_EXEC_HELPER): ps shows
# its own processes alone, and /tmp and /dev/shm are private tmpfs, emptied when it ends.
TASK_NAMESPACES = env.boolean("TASK_NAMESPACES", True)
# The most each of those tmpfs may hold: a size ("8Gi") or a share of the host's memory ("50%",
# tmpfs's own default); never more than the task's resources.memory. Their pages count to the
# task's memory cgroup.
TASK_TMP_SIZE = env.string("TASK_TMP_SIZE", "50%")
if not re.fullmatch(r"[1-9][0-9]*(Mi|Gi|Ti)|(100|[1-9][0-9]?)%", TASK_TMP_SIZE):
    raise ImproperlyConfigured(
        f"TASK_TMP_SIZE: a size such as 8Gi or 512Mi, or a share of memory such as 50%, "
        f"got {TASK_TMP_SIZE!r}"
    )
# Start processes for placed tasks. Off in tests, which turn it on where they mean to.
LAUNCH_TASKS = env.boolean("LAUNCH_TASKS", not TESTING)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"quiet_database_outage": {"()": "gpuplatform.views.QuietDatabaseOutage"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["quiet_database_outage"],
        }
    },
    "root": {"handlers": ["console"], "level": env.string("LOG_LEVEL", "INFO")},
    "loggers": {
        "django-q": {"level": env.string("Q_LOG_LEVEL", "WARNING")},
        "pgserver": {"level": "WARNING"},
    },
}
