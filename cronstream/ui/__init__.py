"""`cronstream ui`: the web dashboard on the projection (docs/reference/operations.md#the-dashboard).

Server-rendered pages (Starlette, Jinja2, a little vanilla JS served from the package);
live runs over server-sent events fed by LISTEN/NOTIFY; actions published through the
SDK's `Client`, the same records the CLI publishes, only for an authenticated identity.
docs/decisions/0040-web-dashboard.md says why it is built this way.
"""

from __future__ import annotations

from cronstream.ui.app import create_app

__all__ = ["create_app"]
