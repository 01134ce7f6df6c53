"""No secret reaches a log line, whatever form of database URL the settings were given.

`Settings.redacted()` (what every service logs at start) and `redact_url` (every "cannot
reach PostgreSQL at ..." message) are fed thousands of generated DSNs: URLs with
passwords in the userinfo (raw `@`, `:` and `/` in them, percent-encoded or not) and in
query parameters whose names are spelt in any encoding libpq undoes (`p%61ssword`),
IPv6 and multi-host lists, and libpq keyword/value strings with quoted and escaped
values. The secret never shows, in any spelling; the parts that are not secret (hosts,
database names, `sslmode`) still do, so the log line stays useful.
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from urllib.parse import quote

from cronstream.shared.redaction import redact_url
from cronstream.shared.settings import Settings

CASES = 3000
SPECIALS = "@:/?#&=%' \\"


@dataclass
class Shape:
    dsn: str
    secrets: list[str]  # alphanumeric cores: any leak of a password shows one of them
    visible: list[str]  # what must stay readable


def _core(rng: random.Random) -> str:
    return "Sx" + "".join(rng.choices(string.ascii_letters + string.digits, k=14))


def _spellings(core: str) -> list[str]:
    """The ways a secret's core can appear in a URL: raw, or every character encoded."""
    return [core, "".join(f"%{ord(c):02X}" for c in core), "".join(f"%{ord(c):02x}" for c in core)]


def _password(rng: random.Random, core: str, in_url: bool) -> str:
    """A password around `core`, with characters that break naive parsers; in a URL
    either percent-encoded (as libpq wants), left raw where a parser may cope (`@`, `:`),
    or with its core encoded too."""
    raw = "".join(rng.choices(SPECIALS, k=rng.randint(0, 3))) + core + \
        "".join(rng.choices(SPECIALS, k=rng.randint(0, 3)))
    if not in_url:
        return raw
    style = rng.choice(["encoded", "raw-safe", "all-encoded"])
    if style == "encoded":
        return quote(raw, safe="")
    if style == "raw-safe":
        return quote(raw, safe="@:")
    return "".join(f"%{ord(c):02X}" for c in raw)


def _secret_name(rng: random.Random) -> str:
    name = rng.choice(["password", "sslpassword", "PASSWORD", "Password", "passfile_secret"])
    spelt = []
    for c in name:  # percent-encode some letters: libpq decodes the name before matching
        spelt.append(f"%{ord(c):02{rng.choice('Xx')}}" if c.isalpha() and rng.random() < 0.3 else c)
    return "".join(spelt)


def url_shape(rng: random.Random) -> Shape:
    secrets: list[str] = []
    visible: list[str] = []
    host_marker = "h" + "".join(rng.choices(string.ascii_lowercase, k=8))
    hosts = rng.choice([
        [f"{host_marker}.example"], ["10.1.2.3"], ["[::1]"], ["[2001:db8::7]"],
        [f"{host_marker}.example", "[2001:db8::8]", "10.9.8.7"], [""],
    ])
    hostspec = ",".join(h + (f":{rng.randint(1, 65535)}" if h and rng.random() < 0.6 else "")
                        for h in hosts)
    visible += [h for h in hosts if h]
    user = rng.choice(["", "app", "cronstream_writer", "svc.account"])
    userinfo = ""
    kind = rng.choice(["none", "user", "user-pw", "pw-only"])
    if kind == "user" and user:
        userinfo = f"{user}@"
    elif kind in ("user-pw", "pw-only"):
        core = _core(rng)
        secrets.append(core)
        userinfo = f"{user if kind == 'user-pw' else ''}:{_password(rng, core, in_url=True)}@"
    database = rng.choice(["", "/", "/cronstream", f"/db_{host_marker}"])
    if database.startswith("/db_"):
        visible.append(database[1:])
    params = []
    for _ in range(rng.randint(0, 4)):
        if rng.random() < 0.5:
            core = _core(rng)
            secrets.append(core)
            params.append(f"{_secret_name(rng)}={_password(rng, core, in_url=True)}")
        else:
            plain = rng.choice(["sslmode=require", "application_name=cronstream-ui",
                                "connect_timeout=5", "target_session_attrs=read-write"])
            params.append(plain)
            visible.append(plain)
    query = ("?" + "&".join(params)) if params else ""
    scheme = rng.choice(["postgresql", "postgres"])
    return Shape(f"{scheme}://{userinfo}{hostspec}{database}{query}", secrets, visible)


def _kv_value(rng: random.Random, value: str) -> str:
    if value and all(c not in value for c in " '\\\t\n") and rng.random() < 0.5:
        return value
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def keyword_shape(rng: random.Random) -> Shape:
    secrets: list[str] = []
    visible: list[str] = []
    host_marker = "h" + "".join(rng.choices(string.ascii_lowercase, k=8))
    pairs = [("host", f"{host_marker}.example"), ("port", "5432"), ("dbname", f"db_{host_marker}"),
             ("user", "cronstream_reader")]
    visible += [f"{host_marker}.example", f"db_{host_marker}"]
    for name in rng.sample(["password", "sslpassword", "sslkey"], rng.randint(1, 3)):
        core = _core(rng)
        secrets.append(core)
        pairs.append((name, _password(rng, core, in_url=False)))
    rng.shuffle(pairs)
    separators = [" ", "  ", "\t", "\n "]
    equals = ["=", " = ", " =", "= "]
    text = rng.choice(separators).join(f"{k}{rng.choice(equals)}{_kv_value(rng, v)}" for k, v in pairs)
    return Shape(text, secrets, visible)


def ambiguous(dsn: str) -> bool:
    """A URL with an unencoded '@' past its authority (in a query value) and a ':' before
    it: a raw '?' in a password could have made it, so it is hidden whole."""
    if "://" not in dsn:
        return False
    rest = dsn.split("://", 1)[1]
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    later = rest.find("@", cut)
    return later >= 0 and ":" in rest[:later]


def _leaks(shown: str, shape: Shape) -> list[str]:
    return [spelling for core in shape.secrets for spelling in _spellings(core) if spelling in shown]


def test_generated_database_urls_and_dsns_never_show_their_secrets() -> None:
    rng = random.Random(20491)
    leaked, blinded = [], []
    for i in range(CASES):
        shape = url_shape(rng) if i % 3 else keyword_shape(rng)
        for shown in (redact_url(shape.dsn), Settings(database_url=shape.dsn).redacted()["database_url"]):
            if _leaks(shown, shape):
                leaked.append((shape.dsn, shown))
            missing = [v for v in shape.visible if v not in shown]
            if missing and not ambiguous(shape.dsn):
                blinded.append((shape.dsn, shown, missing))
    assert not leaked, f"{len({dsn for dsn, _ in leaked})} of {CASES} shapes show a secret, e.g. {leaked[:3]}"
    assert not blinded, f"{len(blinded)} shapes lost their non-secret parts, e.g. {blinded[:3]}"


def test_the_reported_gaps_are_closed() -> None:
    cases = {
        # a parameter name libpq percent-decodes before it matches it
        "postgresql://app@db.example/cronstream?p%61ssword=hunter2-secret&sslmode=require":
            ("hunter2", "sslmode=require"),
        # keyword/value DSNs, quoted and not
        "host=db.example password=hunter2-secret dbname=cronstream": ("hunter2", "db.example"),
        "host=db.example password = 'hunter2 \\' secret' dbname=cronstream": ("hunter2", "dbname=cronstream"),
        # IPv6 hosts keep their brackets (an address that reads as one)
        "postgresql://app:hunter2-secret@[2001:db8::1]:5432/cronstream": ("hunter2", "[2001:db8::1]:5432"),
        # an unencoded '@' in the password
        "postgresql://app:hun@ter2-secret@db.example/cronstream": ("ter2", "app:***@db.example/cronstream"),
        # and a '/' too: libpq and urllib would split it differently, so nothing shows
        "postgresql://app:hun@ter2/secret@db.example/cronstream": ("ter2", "postgresql://***"),
    }
    for dsn, (secret, kept) in cases.items():
        shown = redact_url(dsn)
        assert secret not in shown and kept in shown, (dsn, shown)


def test_what_does_not_parse_is_hidden_whole() -> None:
    for dsn in ("host=db password='never closed hunter2", "not a dsn hunter2", "password"):
        assert "hunter2" not in redact_url(dsn)
        assert redact_url(dsn) == "***"


def test_secret_kafka_properties_and_ui_secrets_never_show() -> None:
    settings = Settings(
        database_url="host=db password=pg-Secret-1", ui_token="ui-Secret-2-long-enough",
        ui_session_key="key-Secret-3",
        kafka_config={"sasl.password": "k-Secret-4", "ssl.key.pem": "k-Secret-5",
                      "sasl.oauthbearer.client.secret": "k-Secret-6", "sasl.username": "me"})
    text = json.dumps(settings.redacted(), default=str)
    for n in range(1, 7):
        assert f"Secret-{n}" not in text
    assert '"me"' in text
