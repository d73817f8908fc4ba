"""Secrets in a plug-in's config: named by an environment variable, never written in it.

A loop config is recorded whole in every run's `run.started`, which `show --json`, `tail`, the
view and a resume read back, so a credential must never be one of its values. The store's
password is `[store] password_env`; a backend's API key is `api_key_env`; headers follow the
same rule, one place for every plug-in that sends them (the `openai` backend, the `otel` hook):

- `headers` holds plain headers only: a name that says it carries a secret (`secret_header`:
  Authorization, Cookie, or a name holding "auth", "key", "token", "secret", "passw",
  "credential" or "session") is refused, naming the header and the key to use instead;
- `headers_env` maps a header to the NAME of the environment variable holding its value,
  read when the plug-in is built (`headers_from_env`), checked as an API key is
  (`read_secret`), never recorded.

A run's recorded config is read back under `reading_a_record()`, where a header named as a
secret is let through: a log written before the name was known to be one stays readable (logs
are never deprecated); every config a user gives is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from lanefold.primitives._errors import ConfigError
from lanefold.primitives._since import in_a_record

__all__ = (
    "check_headers",
    "check_headers_env",
    "headers_from_env",
    "read_secret",
    "secret_header",
)

_SECRET_WORDS = ("auth", "key", "token", "secret", "passw", "credential", "cookie", "session")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 field name
_HEADER_VALUE = re.compile(r"(?:[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?)?")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def secret_header(name: str) -> bool:
    """Whether a header of this name carries a credential by what it is called (so its value
    may not be written in a config): Authorization, Proxy-Authorization, Cookie, X-API-Key,
    X-Auth-Token, api-key, ..."""
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def check_headers(headers: Mapping[str, str], *, instead: str = "headers_env") -> dict[str, str]:
    """`headers` as a config may hold them (a pydantic validator's body): valid names and
    printable values, and no header whose name says it carries a secret (ValueError naming
    it, and `instead`, the key that takes its environment variable)."""
    for name, text in headers.items():
        if secret_header(name) and not in_a_record():
            raise ValueError(
                f"header {name!r} carries a secret: a config is recorded with every run, so name "
                f"the environment variable that holds it in {instead} instead"
            )
        if not _TOKEN.fullmatch(name):  # refused here, not by the HTTP client with a traceback
            raise ValueError(f"header {name!r} is not a valid header name")
        if not _HEADER_VALUE.fullmatch(text):
            raise ValueError(
                f"header {name!r}: the value must be printable ASCII, with no whitespace at either end"
            )
    return dict(headers)


def check_headers_env(headers_env: Mapping[str, str]) -> dict[str, str]:
    """`headers_env` (header name -> environment variable name) as a config may hold it."""
    for name, variable in headers_env.items():
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"header {name!r} is not a valid header name")
        if not _VARIABLE.fullmatch(variable):
            raise ValueError(f"header {name!r}: {variable!r} is not an environment variable's name")
    return dict(headers_env)


def headers_from_env(
    headers_env: Mapping[str, str], environ: Mapping[str, str], *, where: str = "headers_env"
) -> dict[str, str]:
    """Each header of `headers_env` with its value read from `environ` (`read_secret`'s
    checks); ConfigError naming `where.<header>` and the variable, never the value."""
    found: dict[str, str] = {}
    for name, variable in headers_env.items():
        try:
            found[name] = read_secret(environ, variable)
        except ConfigError as exc:
            raise ConfigError(f"{where}.{name}: {exc}") from None
    return found


def read_secret(environ: Mapping[str, str], name: str) -> str:
    """The secret in the environment variable `name`, refused (ConfigError) where it could not
    go in an HTTP header as it is: unset, empty, whitespace at either end (a CRLF from a .env
    file), a control or a non-ASCII character. The messages name the variable, never the value."""
    key = environ.get(name)
    if key is None:
        raise ConfigError(f"environment variable {name} is not set")
    if not key:
        raise ConfigError(f"environment variable {name} is empty")
    if key != key.strip():
        raise ConfigError(
            f"environment variable {name}: the key begins or ends with whitespace (a CRLF "
            "line ending from a .env file?); strip it"
        )
    if any(c < " " or c == "\x7f" for c in key):
        raise ConfigError(f"environment variable {name}: the key holds a control character")
    if not key.isascii():
        raise ConfigError(f"environment variable {name}: the key holds a non-ASCII character")
    return key
