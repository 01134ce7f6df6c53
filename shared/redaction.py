"""What a log line may show of a secret-bearing setting: nothing of the secret.

A database URL reaches the logs at every start (`Settings.redacted()`) and in every
"cannot reach PostgreSQL at ..." message, in whatever form the operator wrote it. So the
redaction reads each form libpq and asyncpg accept, and when it cannot tell what a part
is, hides the whole thing rather than guess:

- URLs (`postgresql://user:pw@host:5432,[::1]:5433/db?sslpassword=...`): the password in
  the userinfo, up to the authority's *last* `@` (an unencoded `@` in a password is
  common), and the value of every query parameter whose name, percent-decoded
  (`p%61ssword`), names a secret; a URL that libpq and urllib would split differently
  (a raw `/`, `?` or `#` in a password) is hidden whole past its scheme;
- keyword/value DSNs (`host=db password='it''s' sslkey=...`): the value of every secret
  keyword, quoted or not; one that does not parse is hidden whole;
- anything else: hidden whole.

`is_secret_name` is the one list of words that make a name secret, for query parameters,
DSN keywords and librdkafka properties alike (`sasl.password`, `ssl.key.pem`,
`sasl.oauthbearer.client.secret`...): masking a harmless one (`sslkey`, a path) costs
nothing, missing a secret one costs the secret.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

MASK = "***"
_SECRET_WORDS = ("pass", "pwd", "secret", "token", "key", "credential", "oauthbearer", "jaas",
                 "pem", "auth")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_KEYWORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
# One host of a URL's host list: a name, an IPv4 address or a bracketed IPv6 address, and
# an optional port.
_HOST = re.compile(r"^(\[[0-9A-Za-z:.%]*\]|[^:\[\]@/?#]*)(:\d*)?$")


def is_secret_name(name: str) -> bool:
    """Whether a parameter, keyword or property of this name holds a secret."""
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def redact_url(dsn: str) -> str:
    """`dsn` with every secret in it replaced by `***` (module docstring: which forms)."""
    stripped = dsn.strip()
    if not stripped:
        return dsn
    if _SCHEME.match(stripped):
        return _redact_uri(stripped)
    redacted = _redact_keywords(stripped)
    return MASK if redacted is None else redacted


def _redact_uri(uri: str) -> str:
    scheme, rest = uri.split("://", 1)
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    # An '@' past the authority belongs to a query value, or to a password with a raw
    # '/', '?' or '#' that ended the authority early (libpq reads `u:12?34@h` as user u,
    # password 12?34; urllib as host u, port 12). When a ':' precedes it, the two cannot
    # be told apart: hide everything.
    later = rest.find("@", cut)
    if later >= 0 and ":" in rest[:later]:
        return f"{scheme}://{MASK}"
    userinfo, at, hostspec = authority.rpartition("@")
    if not at:
        hostspec = authority
    if not all(_HOST.match(host) for host in hostspec.split(",")):
        return f"{scheme}://{MASK}"  # not hosts and ports: a password's remains, maybe
    if at:
        user, colon, _password = userinfo.partition(":")
        userinfo = f"{user}:{MASK}@" if colon else f"{user}@"
    path, question, query = tail.partition("?")
    shown = f"{scheme}://{userinfo}{hostspec}{path}"
    return f"{shown}?{_redact_query(query)}" if question else shown


def _redact_query(query: str) -> str:
    items = []
    for item in query.split("&"):
        name, equals, _value = item.partition("=")
        try:
            decoded = unquote_plus(name, errors="strict")
        except UnicodeDecodeError:
            decoded = name
        # A name that percent-decodes to something else may hide a secret's name behind
        # an encoding libpq would undo, however it is spelt: decide on the decoded name.
        if not equals:
            items.append(MASK)  # not a parameter: a piece of a value with a raw '&' in it
        else:
            items.append(f"{name}={MASK}" if is_secret_name(decoded) or is_secret_name(name)
                         else item)
    return "&".join(items)


def _redact_keywords(dsn: str) -> str | None:
    """libpq's `keyword = value` form, values bare or in single quotes (backslash escapes
    in both); None when it does not parse as that."""
    out: list[str] = []
    i, n = 0, len(dsn)
    while i < n:
        if dsn[i].isspace():
            out.append(dsn[i])
            i += 1
            continue
        match = _KEYWORD.match(dsn, i)
        if match is None:
            return None
        keyword, i = match.group(), match.end()
        j = i
        while j < n and dsn[j].isspace():
            j += 1
        if j >= n or dsn[j] != "=":
            return None
        j += 1
        while j < n and dsn[j].isspace():
            j += 1
        start = j
        if j < n and dsn[j] == "'":
            j += 1
            while j < n and dsn[j] != "'":
                j += 2 if dsn[j] == "\\" else 1
            if j >= n:
                return None  # an unterminated quote: the rest may be the secret
            j += 1
        else:
            while j < n and not dsn[j].isspace():
                j += 2 if dsn[j] == "\\" else 1
            j = min(j, n)
        value = dsn[start:j]
        out.append(f"{dsn[match.start():start]}{MASK if is_secret_name(keyword) else value}")
        i = j
    return "".join(out)
