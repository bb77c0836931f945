"""SpeedInfer settings, read from the environment (see docs/interface.md and docs/configuration.md).

Unset DATABASE_URL / REDIS_URL give the embedded default: SQLite under var/ and
in-process cache, broker and channel layer. Set, they give PostgreSQL and Redis.
"""

from __future__ import annotations

import math
import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from core.env import env_bool, env_choice, env_float, env_int, env_list, env_str, env_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("SPEEDINFER_VAR_DIR", str(BASE_DIR / "var")))

DATABASE_URL = env_url("DATABASE_URL", schemes=("postgres", "postgresql", "sqlite"))
REDIS_URL = env_url("REDIS_URL", schemes=("redis", "rediss", "unix"))
EMBEDDED = not DATABASE_URL

# The embedded default is a developer's machine, so DEBUG defaults on there and
# off in production, where SECRET_KEY must then be given.
DEBUG = env_bool("DEBUG", EMBEDDED)


def _secret_key() -> str:
    configured = env_str("SECRET_KEY")
    if configured:
        return configured
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    # API keys are HMAC'd with this secret, so a dev secret must survive restarts
    # or every demo key would stop working; keep one per checkout under var/.
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"] if DEBUG else [])
if not DEBUG and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set when DEBUG is off")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "axes",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and Redoc as static files: the reference works offline
    "core",
    "catalog",
    "accounts",
    "billing",
    "workers",
    "alerts",
    "proxy",
    "console",
    "devtools",
    "speedinfer",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a locked-out sign-in into its 429 page.
    "axes.middleware.AxesMiddleware",
]

# Sign-in throttling (django-axes), for the dashboard's and the admin's login forms:
# after SPEEDINFER_LOGIN_FAILURE_LIMIT wrong passwords for one username from one IP,
# that pair is refused (429) for SPEEDINFER_LOGIN_LOCKOUT_MINUTES, even with the right password.
AUTHENTICATION_BACKENDS = [
    "console.login_throttle.LoginThrottleBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("SPEEDINFER_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("SPEEDINFER_LOGIN_LOCKOUT_MINUTES", 15.0, minimum=0.1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False

ROOT_URLCONF = "speedinfer.urls"
ASGI_APPLICATION = "speedinfer.asgi.application"

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
            ],
        },
    },
]


# Seconds a database connection (Django's, or the gateway pool's connect and checkout) may take before
# the request gets 503 service_unavailable instead of a hang; Redis's connect and reply likewise.
SPEEDINFER_DB_TIMEOUT = env_float("SPEEDINFER_DB_TIMEOUT", 2.0, minimum=0.1)
# A burst queues for the gateway's database pool this long at most while the pool serves others (core.pgpool).
SPEEDINFER_DB_QUEUE_TIMEOUT = env_float("SPEEDINFER_DB_QUEUE_TIMEOUT", 30.0, minimum=0.1)
SPEEDINFER_REDIS_TIMEOUT = env_float("SPEEDINFER_REDIS_TIMEOUT", 1.0, minimum=0.1)
# Redis unreachable: `local` serves rate-limited keys with this process's own limiter, `fail` answers 503.
SPEEDINFER_REDIS_OUTAGE = env_choice("SPEEDINFER_REDIS_OUTAGE", "local", choices=("local", "fail"))


SPEEDINFER_SQLITE_SYNCHRONOUS = env_choice("SPEEDINFER_SQLITE_SYNCHRONOUS", "NORMAL", choices=("NORMAL", "FULL"))


def _databases() -> dict[str, Any]:
    if DATABASE_URL:
        try:
            config = dj_database_url.parse(DATABASE_URL, conn_max_age=600, conn_health_checks=True)
        except Exception as exc:  # dj_database_url raises several types for bad URLs
            raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from None
        if config["ENGINE"].endswith("postgresql"):
            # libpq counts whole seconds (and at least 2); the pool reads the same option.
            config.setdefault("OPTIONS", {}).setdefault("connect_timeout", max(2, math.ceil(SPEEDINFER_DB_TIMEOUT)))
        return {"default": config}
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    return {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "speedinfer.sqlite3",
            # Kept open: with Django's default (0) every gateway database call (core.db's check before
            # each) opened a new connection, PRAGMAs and function registration included (~2 ms each).
            "CONN_MAX_AGE": None,
            # WAL lets the probe scheduler write while the gateway reads. synchronous=NORMAL (SQLite's advice
            # for WAL) syncs at checkpoints, not at every commit: a crash of the process loses nothing, a
            # power cut can lose the last commits before it (README, Performance). FULL syncs every commit.
            "OPTIONS": {
                "init_command": f"PRAGMA journal_mode=WAL; PRAGMA synchronous={SPEEDINFER_SQLITE_SYNCHRONOUS};",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
            # A file, not shared-cache memory: the latter ignores the busy timeout across threads.
            "TEST": {"NAME": str(VAR_DIR / "test.sqlite3")},
        }
    }


DATABASES = _databases()
# The usage table's covering index (INCLUDE columns) is PostgreSQL's; SQLite just builds the plain index.
SILENCED_SYSTEM_CHECKS = ["models.W040"] if DATABASES["default"]["ENGINE"].endswith("sqlite3") else []
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if REDIS_URL:
    CACHES: dict[str, Any] = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "OPTIONS": {
                "socket_connect_timeout": SPEEDINFER_REDIS_TIMEOUT,
                "socket_timeout": SPEEDINFER_REDIS_TIMEOUT,
            },
        }
    }
    # Connect timeout only: the layer's receive is a blocking pop that waits longer than any read timeout.
    _REDIS_HOST = {"address": REDIS_URL, "socket_connect_timeout": SPEEDINFER_REDIS_TIMEOUT}
    # Namespaced by the database, as workers/fleet.py's keys are: two deployments sharing one Redis
    # database must not deliver usage to each other's dashboards (channels_redis's groups are global).
    CHANNEL_LAYERS: dict[str, Any] = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [_REDIS_HOST], "prefix": f"asgi:{DATABASES['default']['NAME']}"},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
FORMAT_MODULE_PATH = ["speedinfer.formats"]  # timestamps with seconds everywhere (speedinfer/formats/en)

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"] if (BASE_DIR / "static").is_dir() else []

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/dashboard/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

SESSION_COOKIE_HTTPONLY = True
# Production sends its cookies over HTTPS only; SPEEDINFER_SECURE_COOKIES=0 allows plain
# HTTP (a trusted network). The CSRF failure page says so instead of a bare 403.
SPEEDINFER_SECURE_COOKIES = env_bool("SPEEDINFER_SECURE_COOKIES", not DEBUG)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", SPEEDINFER_SECURE_COOKIES)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", SPEEDINFER_SECURE_COOKIES)
CSRF_FAILURE_VIEW = "console.security.csrf_failure"
# Behind a TLS-terminating proxy that sets X-Forwarded-Proto (see README, Production).
if env_bool("SPEEDINFER_TRUST_X_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)

# The live feed's WebSocket: same-origin (Origin host == Host) or one of these
# origins (scheme://host[:port]), whatever ALLOWED_HOSTS says.
SPEEDINFER_WS_ALLOWED_ORIGINS = env_list("SPEEDINFER_WS_ALLOWED_ORIGINS", [])

# Password reset by email: off unless configured, and then its links use
# SPEEDINFER_PUBLIC_URL, never the request's Host header.
SPEEDINFER_PASSWORD_RESET = env_bool("SPEEDINFER_PASSWORD_RESET", False)
SPEEDINFER_PUBLIC_URL = env_str("SPEEDINFER_PUBLIC_URL").rstrip("/")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "webmaster@localhost")
# Invitations (and alerts) go through Django's email backend: SMTP at EMAIL_HOST/EMAIL_PORT when
# EMAIL_HOST is set or in production; the embedded default prints them on the console instead.
EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.console.EmailBackend"
    if EMBEDDED and not env_str("EMAIL_HOST")
    else "django.core.mail.backends.smtp.EmailBackend",
)
if SPEEDINFER_PASSWORD_RESET and not (SPEEDINFER_PUBLIC_URL and env_str("EMAIL_HOST")):
    raise ImproperlyConfigured("SPEEDINFER_PASSWORD_RESET=1 needs SPEEDINFER_PUBLIC_URL and EMAIL_HOST")

REST_FRAMEWORK = {
    # The key authenticator comes first so that DRF answers 401 with a Bearer challenge (not 403)
    # for a missing or bad key; a staff browser session still authenticates second.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "console.api.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["console.api.auth.IsStaffOrAdminKey"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "console.api.errors.api_exception_handler",  # core.errors, plus a page for browsers
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

# The staff API's OpenAPI document (/api/schema/) and its Swagger UI (/api/docs/), staff only.
SPECTACULAR_SETTINGS = {
    "TITLE": "SpeedInfer staff API",
    "DESCRIPTION": "Workers, models, accounts, keys and credits. A staff session or an `admin`-scope key. "
    'Money is decimal strings of credits; errors are {"error": {"message", "type", "code", "param"}}.',
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["console.api.auth.IsStaffOrAdminKey"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SCHEMA_PATH_PREFIX": "/api/",
}

# Celery: Redis in production; in the embedded default the schedule is run by
# `manage.py runschedule` (see README), which calls the same task functions.
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"

# SpeedInfer's own knobs.
SPEEDINFER_PROBE_INTERVAL = env_float("SPEEDINFER_PROBE_INTERVAL", 10.0, minimum=0.5)
SPEEDINFER_PROBE_TIMEOUT = env_float("SPEEDINFER_PROBE_TIMEOUT", 5.0, minimum=0.1)
SPEEDINFER_CIRCUIT_FAILURE_THRESHOLD = env_int("SPEEDINFER_CIRCUIT_FAILURE_THRESHOLD", 3, minimum=1)
SPEEDINFER_CIRCUIT_COOLDOWN = env_float("SPEEDINFER_CIRCUIT_COOLDOWN", 30.0, minimum=0.0)
SPEEDINFER_RESERVATION_TTL = env_int("SPEEDINFER_RESERVATION_TTL", 900, minimum=1)
SPEEDINFER_SWEEP_INTERVAL = env_float("SPEEDINFER_SWEEP_INTERVAL", 60.0, minimum=1.0)
# Per-process caches follow one convention (core.cache_policy.CachePolicy): SPEEDINFER_<NAME>_CACHE_TTL
# seconds fresh, then served stale for the cache's own window while one refresh runs beside the
# request, then waited for. Keys: 5 s, no stale window (bounds a revocation made in another process).
# Models: 5 s, stale until 60 s after the load. Routing snapshot: 1 s, stale for min(TTL, 0.5 s) more
# (a worker a probe marked down stops taking traffic within TTL + that). 0 turns a cache off.
SPEEDINFER_KEY_CACHE_TTL = env_float("SPEEDINFER_KEY_CACHE_TTL", 5.0, minimum=0.0)
SPEEDINFER_MODEL_CACHE_TTL = env_float("SPEEDINFER_MODEL_CACHE_TTL", 5.0, minimum=0.0)
SPEEDINFER_ROUTING_CACHE_TTL = env_float("SPEEDINFER_ROUTING_CACHE_TTL", 1.0, minimum=0.0)
# prefix: prompt-prefix affinity with bounded load (workers.balancer, docs/scheduler.md); least-loaded:
# workers.balancer's score; random: a shuffle (a baseline for `make bench`).
SPEEDINFER_ROUTING_POLICY = env_choice(
    "SPEEDINFER_ROUTING_POLICY", "prefix", choices=("prefix", "least-loaded", "random")
)
# Seconds a request for a saturated model may wait in the gateway for a slot (workers.queue).
SPEEDINFER_QUEUE_TIMEOUT = env_float("SPEEDINFER_QUEUE_TIMEOUT", 30.0, minimum=0.0)
SPEEDINFER_DEFAULT_MAX_OUTPUT_TOKENS = env_int("SPEEDINFER_DEFAULT_MAX_OUTPUT_TOKENS", 4096, minimum=1)
SPEEDINFER_UPSTREAM_CONNECT_TIMEOUT = env_float("SPEEDINFER_UPSTREAM_CONNECT_TIMEOUT", 5.0, minimum=0.1)
SPEEDINFER_UPSTREAM_READ_TIMEOUT = env_float("SPEEDINFER_UPSTREAM_READ_TIMEOUT", 120.0, minimum=0.1)
SPEEDINFER_UPSTREAM_TOTAL_TIMEOUT = env_float("SPEEDINFER_UPSTREAM_TOTAL_TIMEOUT", 600.0, minimum=0.1)
SPEEDINFER_DB_POOL_SIZE = env_int("SPEEDINFER_DB_POOL_SIZE", 8, minimum=1)
# Money statements of one account in flight at once per gateway process (PostgreSQL; 0: no limit). The
# rest wait in the process, in arrival order, instead of on the account's row lock (docs/performance.md).
SPEEDINFER_DB_ACCOUNT_CONCURRENCY = env_int("SPEEDINFER_DB_ACCOUNT_CONCURRENCY", 2, minimum=0)
# How often the schedule checks spend alerts and delivers them (manage.py sendalerts does one run).
SPEEDINFER_ALERTS_INTERVAL = env_float("SPEEDINFER_ALERTS_INTERVAL", 30.0, minimum=1.0)
# Open upstream calls (a stream holds one for its whole length) per gateway process; past it a call waits
# SPEEDINFER_UPSTREAM_CONNECT_TIMEOUT for a free one, then 503 overloaded (docs/operations.md).
# /v1 requests in flight per gateway process; past it new ones get a prompt 503 overloaded (proxy/asgi.py).
# Below SPEEDINFER_UPSTREAM_MAX_CONNECTIONS, so the edge refuses before a call waits for the pool.
SPEEDINFER_MAX_INFLIGHT = env_int("SPEEDINFER_MAX_INFLIGHT", 4000, minimum=0)
SPEEDINFER_UPSTREAM_MAX_CONNECTIONS = env_int("SPEEDINFER_UPSTREAM_MAX_CONNECTIONS", 4096, minimum=1)
SPEEDINFER_UPSTREAM_CLIENT = env_choice("SPEEDINFER_UPSTREAM_CLIENT", "aiohttp", choices=("aiohttp", "httpx"))

CELERY_BEAT_SCHEDULE = {
    "probe-workers": {"task": "workers.tasks.probe_all_workers", "schedule": SPEEDINFER_PROBE_INTERVAL},
    "sweep-reservations": {"task": "billing.tasks.sweep_reservations", "schedule": SPEEDINFER_SWEEP_INTERVAL},
    "send-alerts": {"task": "alerts.tasks.send_alerts", "schedule": SPEEDINFER_ALERTS_INTERVAL},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "bare": {"format": "%(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
        "json_lines": {"class": "logging.StreamHandler", "formatter": "bare"},
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        # Django's default config gives `django` its own console handler as well as
        # propagating to the root's: every warning would print twice.
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.db.backends": {"level": "WARNING"},
        # httpx logs every request's URL at INFO, and worker endpoints must stay out of the logs.
        "httpx": {"level": "WARNING"},
        # core.request_log: one JSON object per line, nothing around it.
        # SPEEDINFER_REQUEST_LOG_LEVEL=WARNING turns the per-request lines off.
        "speedinfer.requests": {
            "handlers": ["json_lines"],
            "level": env_str("SPEEDINFER_REQUEST_LOG_LEVEL", "INFO"),
            "propagate": False,
        },
    },
}
