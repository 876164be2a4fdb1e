"""Every URI Sieve is given (tracking, registry, storage, model source) is read here, with ``urllib.parse``: what
a message, a log line, a param or a card may show of it, and the credentials it carries.

A URI's userinfo (``https://user:password@host``) is a secret: :func:`redact` shows ``user:***@host`` for a URI
or for every URI in a free text (an exception's message, a config dumped as params). :func:`without_credentials` takes the userinfo out before the URI is used, so that the host a resolver
is asked for is the host alone; :func:`check_transport` refuses to send a password over plain ``http`` to a
host that is not this machine, unless ``SIEVE_ALLOW_PLAINTEXT_CREDENTIALS=1`` says the network is trusted.
"""

from __future__ import annotations

import ipaddress
import os
import re
from urllib.parse import unquote, urlsplit, urlunsplit

from orchestrator.errors import ConfigError

ALLOW_PLAINTEXT = "SIEVE_ALLOW_PLAINTEXT_CREDENTIALS"
HIDDEN = "***"
# scheme://userinfo@ anywhere in a text: up to the last '@' before the path (a password may hold a raw '@')
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<info>[^\s/]+)@")


def _host_port(parts) -> str:
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:  # a port that is not a number: shown as written
        return parts.netloc.rsplit("@", 1)[-1]
    return f"{host}:{port}" if port is not None else host


def _hide(info: str) -> str:
    user, sep, _ = info.partition(":")
    return f"{user}:{HIDDEN}" if sep else HIDDEN  # a lone userinfo may be a token: hidden whole


def redact(text: str) -> str:
    """A URI - or every URI in a text - as it may be shown: a userinfo's password (or a lone token) as ``***``."""
    if "@" not in text:
        return text
    return _USERINFO.sub(lambda m: f"{m['scheme']}{_hide(m['info'])}@", text)


def without_credentials(uri: str) -> tuple[str, str | None, str | None]:
    """(the URI without its userinfo, the user name, the password), both unquoted; the URI unchanged without one."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri, None, None
    clean = urlunsplit(parts._replace(netloc=_host_port(parts)))
    return (
        clean,
        unquote(parts.username) if parts.username else None,
        (unquote(parts.password) if parts.password is not None else None),
    )


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_transport(uri: str, what: str) -> None:
    """Refuse credentials in a plain ``http://`` URI to another machine: they would cross the network unencrypted."""
    parts = urlsplit(uri)
    if parts.password is None or parts.scheme.lower() != "http" or is_loopback(parts.hostname):
        return
    if os.environ.get(ALLOW_PLAINTEXT) == "1":
        return
    raise ConfigError(
        f"{what} {redact(uri)}: a password over plain http to {parts.hostname} would cross the network "
        f"unencrypted; use https, or set {ALLOW_PLAINTEXT}=1 where the network is trusted"
    )
