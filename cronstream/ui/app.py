"""The dashboard's Starlette application: routes, security headers, rendering.

Pages are read-only views of the projection (`views.py` builds what they show; the
Schedulers page, of the scheduler group on Kafka: `schedulers.py`);
state-changing requests are POSTs that need an identity and, for ambient credentials,
a CSRF token (`auth.py`), and publish through `actions.py`.

Why one module of this size: the route table of every page, each a few lines over
views.py (queries), present.py (formatting) and the templates.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit
from uuid import UUID

import jinja2
from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from cronstream.cli.schedulers_cmd import scheduler_rows
from cronstream.shared.settings import Settings
from cronstream.shared.statuses import Status
from cronstream.ui import views
from cronstream.ui.actions import ActionFailed, ActionRefused, Actions
from cronstream.ui.auth import CSRF_COOKIE, CSRF_FIELD, SESSION_COOKIE, SESSION_SECONDS, Auth, Identity
from cronstream.ui.hosts import AllowedHosts, HostGuard
from cronstream.ui.live import CHANNELS, LiveHub, LiveResponse
from cronstream.ui.pools import PoolSizes
from cronstream.ui.present import FILTERS
from cronstream.ui.schedulers import SchedulerRoles, SchedulersUnavailable
from cronstream.ui.store import DatabaseUnavailable, Store

HERE = Path(__file__).resolve().parent
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
# Counted on the body as it arrives, however it is framed (a chunked body announces no
# length): a form is never read, let alone parsed, much beyond its limit (_form).
MAX_FORM_BYTES = 16 * 1024
# A trigger's form carries a run's params (at most 64 KiB of JSON, up to three times that
# URL-encoded): the limit they are held to is the params' own (records.run_params).
PARAMS_FORM_BYTES = 256 * 1024
# Sent over HTTPS only (behind a trusted proxy that terminates TLS: create_app): a year.
HSTS = b"max-age=31536000"


class BadInput(ValueError):
    """A query parameter or form field is invalid; the message names it."""


class FormTooLarge(Exception):
    """A form's body is longer than its limit (413, from any route: create_app)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a form here is at most {limit // 1024} KiB")
        self.limit = limit


def template_env() -> jinja2.Environment:
    """The pages' templates. Autoescaping everywhere: job names, params, results and
    errors come from records, scheduler names from Kafka clients."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE / "templates")), autoescape=True)
    env.filters.update(FILTERS)
    return env


class UI:
    """Everything a request handler needs; one per application."""

    def __init__(self, settings: Settings, store: Store, actions: Actions | None) -> None:
        self.settings = settings
        self.store = store
        self.actions = actions
        self.auth = Auth(
            settings.ui_token.get_secret_value() if settings.ui_token else None,
            settings.ui_identity_header, settings.ui_protect_reads,
            settings.ui_session_key.get_secret_value() if settings.ui_session_key else None,
            token_login=settings.ui_token_login,
            metrics_token=settings.ui_metrics_token.get_secret_value() if settings.ui_metrics_token else None)
        self.templates = Jinja2Templates(env=template_env())
        self.hub = LiveHub(settings.database_url, self.render_live,
                           max_streams=settings.ui_live_streams,
                           max_streams_per_client=settings.ui_live_streams_per_client)
        # The Schedulers page reads Kafka, as `cronstream schedulers` does.
        self.schedulers = SchedulerRoles(partial(scheduler_rows, settings))
        # The Pools page reads the pools' sizes from Kafka, as `cronstream pools` does.
        self.pool_sizes = PoolSizes(settings)

    async def render_log(self, execution_id: UUID) -> str:
        """The live log of one execution: its last lines, where it stands, its traceback
        (HTML rendered and escaped here, as the page renders it)."""
        data = await views.execution_log(self.store, execution_id)
        macros = self.templates.env.get_template("_log.html").module
        return json.dumps({
            "lines": str(macros.lines(data["log"])),  # type: ignore[attr-defined]
            "count": data["log_count"], "cut": data["log_cut"], "ended": data["log_ended"],
            "live": data["log_live"], "traceback": data["traceback"] or "",
            "status": data["status"],
        })

    async def render_live(self) -> str:
        data = await views.runs(self.store)
        rows = self.templates.env.get_template("_runs.html").module.rows  # type: ignore[attr-defined]
        return json.dumps({
            "counts": data["counts"],
            **{section: str(rows(data[section], section))
               for section in ("running", "queued", "waiting", "awaiting", "recent")},
        })

    # -- rendering ------------------------------------------------------------------

    def page(self, request: Request, template: str, context: dict[str, Any],
             status_code: int = 200) -> Response:
        identity = self.auth.identify(request)
        csrf_cookie = request.cookies.get(CSRF_COOKIE)
        new_cookie = None
        if not csrf_cookie:
            csrf_cookie = new_cookie = self.auth.new_csrf_cookie()
        response = self.templates.TemplateResponse(request, template, {
            **context,
            "identity": identity,
            "actions_enabled": self.auth.actions_enabled,
            "can_act": identity is not None,
            "csrf_field": CSRF_FIELD,
            "csrf_token": self.auth.csrf_token(request, csrf_cookie),
            "login_possible": self.auth.token is not None,
            "notice": request.query_params.get("notice", "")[:300],
            "path": request.url.path,
            "here": _here(request),
        }, status_code=status_code)
        if new_cookie is not None:
            _set_cookie(response, request, CSRF_COOKIE, new_cookie)
        return response

    def error(self, request: Request, status: int, title: str, detail: str) -> Response:
        if _wants_json(request):
            return JSONResponse({"error": title, "detail": detail}, status_code=status)
        return self.page(request, "error.html", {"title": title, "detail": detail}, status)


def _set_cookie(response: Response, request: Request, name: str, value: str,
                max_age: int | None = None) -> None:
    response.set_cookie(name, value, max_age=max_age, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")


def _here(request: Request) -> str:
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


def _wants_json(request: Request) -> bool:
    return "application/json" in request.headers.get("accept", "") or \
        request.headers.get("authorization", "").lower().startswith("bearer ")


def _throttled(ui: UI, request: Request, wait: float | None = None) -> Response | None:
    """429 for a token tried by a client that had sent too many wrong ones (throttle.py)
    when its request came (`wait`, taken before this token was tried), else None."""
    wait = ui.auth.throttled(request) if wait is None else wait
    tried = request.url.path == "/login" or \
        request.headers.get("authorization", "").lower().startswith("bearer ")
    if wait <= 0 or not tried:
        return None
    response = ui.error(request, 429, "Too many wrong tokens",
                        f"Try again in {int(wait) + 1} seconds.")
    response.headers["Retry-After"] = str(int(wait) + 1)
    return response


def _safe_next(target: str | None, default: str = "/") -> str:
    """Only a local path: never an open redirect."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    parts = urlsplit(target)
    return target if not parts.scheme and not parts.netloc else default


Handler = Callable[[UI, Request], Awaitable[Response]]


def page(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A read-only page: optional protection, 400 for bad input, 503 without a database."""

    async def endpoint(request: Request) -> Response:
        ui: UI = request.app.state.ui
        wait = ui.auth.throttled(request)
        if ui.auth.protect_reads and ui.auth.identify(request) is None:
            refused = _throttled(ui, request, wait)
            if refused is not None:
                return refused
            if _wants_json(request):
                return JSONResponse({"error": "authentication required"}, status_code=401)
            return RedirectResponse("/login?" + urlencode({"next": _here(request)}), 303)
        try:
            return await handler(ui, request)
        except BadInput as exc:
            return ui.error(request, 400, "Bad request", str(exc))
        except views.NotFound as exc:
            return ui.error(request, 404, "Not found", str(exc))
        except DatabaseUnavailable as exc:
            return ui.error(request, 503, "PostgreSQL is unavailable",
                            f"The projection cannot be read right now: {exc}")

    return endpoint


def action(handler: Callable[[UI, Request, Identity, dict[str, str]], Awaitable[str]]
           ) -> Callable[[Request], Awaitable[Response]]:
    """A state-changing POST: refused without an identity (401), with actions off or a
    missing / wrong CSRF token or an origin not of this site (403), a form too large
    (413). Publishes nothing unless all checks pass; answers with a redirect back
    (browsers) or JSON (scripts)."""

    async def endpoint(request: Request) -> Response:
        ui: UI = request.app.state.ui
        allowed = await _allowed_to_act(ui, request)
        if isinstance(allowed, Response):
            return allowed
        identity, form = allowed
        try:
            notice = await handler(ui, request, identity, form)
        except BadInput as exc:
            return ui.error(request, 400, "Bad request", str(exc))
        except views.NotFound as exc:
            return ui.error(request, 404, "Not found", str(exc))
        except views.Conflict as exc:
            return ui.error(request, 409, "Not possible now", str(exc))
        except ActionRefused as exc:
            return ui.error(request, 400, "Bad request", str(exc))
        except ActionFailed as exc:
            return ui.error(request, 502, "The action failed", str(exc))
        except DatabaseUnavailable as exc:
            return ui.error(request, 503, "PostgreSQL is unavailable", str(exc))
        if identity.via == "bearer" or _wants_json(request):
            return JSONResponse({"ok": True, "notice": notice, "by": identity.name})
        # Without `next`, back to the page the form was on, checked like `next` (a
        # Referer path of `//evil.example` would otherwise leave the site).
        referer = request.headers.get("referer")
        back = _safe_next(form.get("next"), _safe_next(urlsplit(referer).path if referer else None))
        separator = "&" if "?" in back else "?"
        return RedirectResponse(f"{back}{separator}notice={quote(notice)}", 303)

    return endpoint


async def _allowed_to_act(ui: UI, request: Request) -> Response | tuple[Identity, dict[str, str]]:
    """Who acts and their form, or the refusal: actions off, no identity (throttled after
    failures), not from this site (auth.cross_site), a missing or wrong CSRF token."""
    if not ui.auth.actions_enabled:
        return ui.error(request, 403, "Actions are off",
                        "Set CRONSTREAM_UI_TOKEN or CRONSTREAM_UI_IDENTITY_HEADER to enable them.")
    wait = ui.auth.throttled(request)
    identity = ui.auth.identify(request)
    if identity is None:
        refused = _throttled(ui, request, wait)
        if refused is not None:
            return refused
        response = ui.error(request, 401, "Authentication required",
                            "Log in (or send Authorization: Bearer <token>) to act.")
        response.headers["WWW-Authenticate"] = 'Bearer realm="cronstream"'
        return response
    refusal = Auth.cross_site(request, ambient=identity.via != "bearer")
    if refusal is not None:
        return ui.error(request, 403, "Forbidden", refusal)
    form = await _form(request, PARAMS_FORM_BYTES if request.url.path.endswith("/trigger")
                       else MAX_FORM_BYTES)
    if identity.via != "bearer" and not ui.auth.csrf_ok(request, form.get(CSRF_FIELD)):
        return ui.error(request, 403, "Forbidden",
                        "missing or invalid CSRF token: reload the page and try again")
    return identity, form


async def _form(request: Request, limit: int = MAX_FORM_BYTES) -> dict[str, str]:
    """The form's text fields; FormTooLarge past `limit` bytes, announced or not.

    The body is read with a running count that stops at the limit: `Content-Length` is
    only a shortcut (a chunked body has none, and Starlette's parser would read it whole).
    What was read is then parsed, from memory."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise FormTooLarge(limit)
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        return {}
    body = bytearray()
    async with contextlib.aclosing(request.stream()) as stream:
        async for chunk in stream:
            body += chunk
            if len(body) > limit:
                raise FormTooLarge(limit)

    async def replay() -> Message:
        return {"type": "http.request", "body": bytes(body), "more_body": False}

    form = await Request(request.scope, replay).form(max_files=0, max_fields=20)
    return {k: v for k, v in form.items() if isinstance(v, str)}


async def form_too_large(request: Request, exc: Exception) -> Response:
    """413 for FormTooLarge, wherever the form was read (actions, login, logout)."""
    ui: UI = request.app.state.ui
    return ui.error(request, 413, "Form too large", str(exc))


def _uuid(value: str, name: str) -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise BadInput(f"{name}: not a UUID: {value[:64]!r}") from None


def _reason(form: dict[str, str]) -> str | None:
    reason = form.get("reason", "").strip()
    if len(reason) > 1000:
        raise BadInput("reason: at most 1000 characters")
    return reason or None


# -- pages ------------------------------------------------------------------------------

@page
async def jobs_page(ui: UI, request: Request) -> Response:
    try:
        context = await views.jobs(ui.store, request.query_params)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return ui.page(request, "jobs.html", context)


@page
async def job_page(ui: UI, request: Request) -> Response:
    try:
        context = await views.job(ui.store, request.path_params["job_id"], request.query_params)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return ui.page(request, "job.html", context)


@page
async def version_page(ui: UI, request: Request) -> Response:
    try:
        context = await views.version(ui.store, request.path_params["job_id"],
                                      request.path_params["version"], request.query_params)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return ui.page(request, "version.html", context)


@page
async def runs_page(ui: UI, request: Request) -> Response:
    return ui.page(request, "runs.html", await views.runs(ui.store))


@page
async def runs_live(ui: UI, request: Request) -> Response:
    return LiveResponse(ui.hub, Auth.client(request))


@page
async def execution_log_live(ui: UI, request: Request) -> Response:
    execution_id = _uuid(request.path_params["execution_id"], "execution_id")
    return LiveResponse(ui.hub, Auth.client(request), partial(
        ui.hub.stream, key=f"log:{execution_id}", render=partial(ui.render_log, execution_id),
        channels=CHANNELS, event="log"))


@page
async def dag_page(ui: UI, request: Request) -> Response:
    run_id = _uuid(request.path_params["run_id"], "run_id")
    return ui.page(request, "dag.html", await views.dag_run(ui.store, run_id))


@page
async def execution_page(ui: UI, request: Request) -> Response:
    execution_id = _uuid(request.path_params["execution_id"], "execution_id")
    return ui.page(request, "execution.html", await views.execution(ui.store, execution_id))


@page
async def timeline_page(ui: UI, request: Request) -> Response:
    try:
        context = await views.timeline(ui.store, request.query_params)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return ui.page(request, "timeline.html", context)


@page
async def workers_page(ui: UI, request: Request) -> Response:
    return ui.page(request, "workers.html", await views.workers(ui.store))


@page
async def pools_page(ui: UI, request: Request) -> Response:
    return ui.page(request, "pools.html", await views.pools(ui.store, await ui.pool_sizes.get()))


@page
async def schedulers_page(ui: UI, request: Request) -> Response:
    try:
        context = await views.schedulers(ui.schedulers, ui.settings.scheduler_standbys)
    except SchedulersUnavailable as exc:
        return ui.error(request, 503, "Kafka is unavailable",
                        f"The scheduler group cannot be read right now: {exc}")
    return ui.page(request, "schedulers.html", context)


@page
async def alerts_page(ui: UI, request: Request) -> Response:
    try:
        context = await views.alerts(ui.store, request.query_params)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return ui.page(request, "alerts.html", context)


async def home(request: Request) -> Response:
    return RedirectResponse("/jobs", 303)


async def favicon(request: Request) -> Response:
    return Response(status_code=204)


# -- login ------------------------------------------------------------------------------

async def login_page(request: Request) -> Response:
    ui: UI = request.app.state.ui
    return ui.page(request, "login.html", {"next": _safe_next(request.query_params.get("next")),
                                           "error": ""})


async def login(request: Request) -> Response:
    ui: UI = request.app.state.ui
    if ui.auth.token is None:
        return ui.error(request, 403, "No login", "CRONSTREAM_UI_TOKEN is not set." if
                        not ui.auth.token_ignored else "Sign in through the proxy: token logins are "
                        "off beside CRONSTREAM_UI_IDENTITY_HEADER (CRONSTREAM_UI_TOKEN_LOGIN).")
    # A login carries no credential yet, but a forged one would log the victim in as the
    # attacker (whose session then records what the victim does): a browser's request.
    refusal = Auth.cross_site(request, ambient=True)
    if refusal is not None:
        return ui.error(request, 403, "Forbidden", refusal)
    form = await _form(request)
    target = _safe_next(form.get("next"))
    if not ui.auth.csrf_ok(request, form.get(CSRF_FIELD)):
        return ui.error(request, 403, "Forbidden", "missing or invalid CSRF token: reload the page")
    name = form.get("name", "").strip()
    if not Auth.valid_name(name):
        return ui.page(request, "login.html", {"next": target, "error":
                       "name: 1 to 64 letters, digits, spaces or . @ + - _"}, 400)
    refused = _throttled(ui, request)
    if refused is not None:
        return refused
    if not ui.auth.check_token(form.get("token", ""), request):
        return ui.page(request, "login.html", {"next": target, "error": "wrong token"}, 401)
    response = RedirectResponse(target, 303)
    # A new session (its own CSRF tokens) and a new pre-session cookie: the login form's
    # token fits nothing any more, not even once this session ends.
    _set_cookie(response, request, SESSION_COOKIE, ui.auth.session_value(name), SESSION_SECONDS)
    _set_cookie(response, request, CSRF_COOKIE, ui.auth.new_csrf_cookie())
    return response


async def logout(request: Request) -> Response:
    ui: UI = request.app.state.ui
    refusal = Auth.cross_site(request, ambient=True)
    if refusal is not None:
        return ui.error(request, 403, "Forbidden", refusal)
    form = await _form(request)
    if not ui.auth.csrf_ok(request, form.get(CSRF_FIELD)):
        return ui.error(request, 403, "Forbidden", "missing or invalid CSRF token")
    response = RedirectResponse("/jobs", 303)
    response.delete_cookie(SESSION_COOKIE)
    _set_cookie(response, request, CSRF_COOKIE, ui.auth.new_csrf_cookie())
    return response


# -- actions ----------------------------------------------------------------------------

async def _known_job(ui: UI, job_id: str) -> None:
    row = await ui.store.fetchrow("job", job_id)
    if row is None or row["deleted_at"] is not None:
        raise views.NotFound(f"no job {job_id!r}")


def _actions(ui: UI) -> Actions:
    if ui.actions is None:
        raise ActionFailed("actions are not available in this process")
    return ui.actions


def _json_object(form: dict[str, str], name: str) -> dict[str, Any] | None:
    text = form.get(name, "").strip()
    if not text:
        return None
    try:
        given = json.loads(text, parse_constant=_not_json)
    except ValueError as exc:
        raise BadInput(f"{name}: not valid JSON: {exc}") from None
    if not isinstance(given, dict):
        raise BadInput(f"{name}: must be a JSON object, not {type(given).__name__}")
    return given


def _params(form: dict[str, str]) -> dict[str, Any] | None:
    """The trigger's params: the keys of the `params` field (a JSON object, starting from
    the job's params as the page showed them, `params_base`) that differ from the base.
    Only those overlay the job's params: a change of the job since the page was read is
    kept for every key left as it was."""
    given, base = _json_object(form, "params"), _json_object(form, "params_base") or {}
    if given is None:
        return None
    changed = {k: v for k, v in given.items() if k not in base or _canonical(base[k]) != _canonical(v)}
    return changed or None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)  # 1 and true differ; key order does not


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@action
async def trigger(ui: UI, request: Request, who: Identity, form: dict[str, str]) -> str:
    job_id = request.path_params["job_id"]
    params = _params(form)
    await _known_job(ui, job_id)
    execution = await _actions(ui).trigger(job_id, who.name, params)
    shown = f" with {', '.join(sorted(params))[:200]} changed" if params else ""
    return f"triggered {job_id}: execution {execution}{shown}"


@action
async def pause(ui: UI, request: Request, who: Identity, form: dict[str, str]) -> str:
    job_id = request.path_params["job_id"]
    await _known_job(ui, job_id)
    await _actions(ui).pause(job_id, who.name)
    return f"paused {job_id}"


@action
async def resume(ui: UI, request: Request, who: Identity, form: dict[str, str]) -> str:
    job_id = request.path_params["job_id"]
    await _known_job(ui, job_id)
    await _actions(ui).resume(job_id, who.name)
    return f"resumed {job_id}"


async def _execution_in(ui: UI, request: Request, states: tuple[str, ...]) -> Any:
    execution_id = _uuid(request.path_params["execution_id"], "execution_id")
    row = await ui.store.fetchrow("execution", execution_id, 0)
    if row is None:
        raise views.NotFound(f"no execution {execution_id}")
    if row["status"] not in states:
        raise views.Conflict(f"execution {execution_id} is {row['status']}, not "
                             + " or ".join(states))
    return row


@action
async def cancel(ui: UI, request: Request, who: Identity, form: dict[str, str]) -> str:
    row = await _execution_in(ui, request, (Status.QUEUED, Status.RUNNING))
    await _actions(ui).cancel(row["execution_id"], _reason(form) or f"cancelled by {who.name}", who.name)
    return f"cancel sent for {row['job_id']} (execution {row['execution_id']}, was {row['status']})"


@action
async def approve(ui: UI, request: Request, who: Identity, form: dict[str, str]) -> str:
    row = await _execution_in(ui, request, ("AWAITING_APPROVAL",))
    await _actions(ui).approve(row["execution_id"], row["job_id"], _reason(form), who.name)
    return f"approved {row['job_id']} (execution {row['execution_id']})"


@action
async def reject(ui: UI, request: Request, who: Identity, form: dict[str, str]) -> str:
    row = await _execution_in(ui, request, ("AWAITING_APPROVAL",))
    reason = _reason(form)
    if reason is None:
        raise BadInput("reason: say why the step is rejected")
    await _actions(ui).reject(row["execution_id"], row["job_id"], reason, who.name)
    return f"rejected {row['job_id']} (execution {row['execution_id']})"


# -- probes -----------------------------------------------------------------------------

async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok\n")


async def readyz(request: Request) -> Response:
    ui: UI = request.app.state.ui
    ok = await ui.store.ping()
    body = {"ready": ok, "service": "ui",
            "components": {"postgres": "ready" if ok else "cannot reach PostgreSQL"}}
    return JSONResponse(body, status_code=200 if ok else 503)


async def metrics_endpoint(request: Request) -> Response:
    ui: UI = request.app.state.ui
    wait = ui.auth.throttled(request)
    if not ui.auth.may_scrape(request):
        refused = _throttled(ui, request, wait)
        if refused is not None:
            return refused
        return PlainTextResponse("authentication required\n", 401,
                                 headers={"WWW-Authenticate": 'Bearer realm="cronstream"'})
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(encoder(REGISTRY), media_type=content_type)


# -- application ------------------------------------------------------------------------

class SecurityHeaders:
    """CSP (no inline script or style anywhere), no framing, no sniffing, HSTS over
    HTTPS, and the server's own time per response (`Server-Timing`, read by bench/ui.py)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                elapsed = (time.perf_counter() - started) * 1000
                headers += [
                    (b"content-security-policy", CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY"),
                    (b"referrer-policy", b"same-origin"),
                    (b"server-timing", f"app;dur={elapsed:.2f}".encode()),
                ]
                if scope.get("scheme") == "https":
                    headers.append((b"strict-transport-security", HSTS))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, wrapped)


def create_app(settings: Settings, *, with_actions: bool = True) -> Starlette:
    store = Store(settings.database_url)
    actions = Actions(settings) if with_actions else None
    ui = UI(settings, store, actions)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        ui.hub.start()
        try:
            yield
        finally:
            ui.hub.close()
            ui.schedulers.close()
            ui.pool_sizes.close()
            await store.close()
            if actions is not None:
                actions.close()

    routes = [
        Route("/", home),
        Route("/favicon.ico", favicon),
        Route("/jobs", jobs_page),
        Route("/jobs/{job_id}", job_page),
        Route("/jobs/{job_id}/trigger", trigger, methods=["POST"]),
        Route("/jobs/{job_id}/pause", pause, methods=["POST"]),
        Route("/jobs/{job_id}/resume", resume, methods=["POST"]),
        Route("/jobs/{job_id}/versions/{version}", version_page),
        Route("/runs", runs_page),
        Route("/runs/live", runs_live),
        Route("/runs/{run_id}", dag_page),
        Route("/executions/{execution_id}", execution_page),
        Route("/executions/{execution_id}/log/live", execution_log_live),
        Route("/executions/{execution_id}/cancel", cancel, methods=["POST"]),
        Route("/executions/{execution_id}/approve", approve, methods=["POST"]),
        Route("/executions/{execution_id}/reject", reject, methods=["POST"]),
        Route("/timeline", timeline_page),
        Route("/workers", workers_page),
        Route("/pools", pools_page),
        Route("/schedulers", schedulers_page),
        Route("/alerts", alerts_page),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics_endpoint),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={FormTooLarge: form_too_large})
    app.state.ui = ui
    # Outermost last: the proxy's headers are read first (the scheme for Secure cookies
    # and HSTS, the client's address for throttling and stream caps), and a refused Host
    # still gets the security headers.
    app.add_middleware(HostGuard, allowed=AllowedHosts(settings.ui_allowed_hosts, settings.ui_bind))
    app.add_middleware(SecurityHeaders)
    if settings.ui_trusted_proxies:
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.ui_trusted_proxies)
    return app
