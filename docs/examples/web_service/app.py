"""A web service that hands work to Orbit: ``POST /signups`` submits a ``send_welcome`` task.

Two keys make a signup safe to retry, for two different reasons:

* the **Idempotency-Key** the HTTP client sends (or its retrying proxy) is passed on to
  Orbit as ``Idempotency-Key: signup:<key>``. A retried request — the client timed out, the
  connection dropped after Orbit committed — gets the *same answer* (same task, same status)
  instead of a second task; the same key with a different body is refused (422);
* the **dedup key** ``welcome:<email>`` is the identity of the work itself: even a *new*
  request (another key, another process, another day) for the same address finds the
  existing task (``deduplicated: true``) instead of sending a second welcome.

Run it (an Orbit server, a key, and a queue ``emails``)::

    export ORBIT_URL=http://127.0.0.1:8080 ORBIT_KEY=orb_... ORBIT_NAMESPACE=default
    orbit queues put emails
    uvicorn --app-dir docs/examples/web_service app:app --port 8000
    curl -s -XPOST localhost:8000/signups -H 'Idempotency-Key: 7f3a' \\
         -H 'Content-Type: application/json' -d '{"email": "ada@example.com", "name": "Ada"}'
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import AsyncIterator

from orbit_sdk import (
    IdempotencyMismatch,
    InvalidRequest,
    OrbitClient,
    OrbitConnectionError,
    QuotaExceeded,
    RateLimited,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

QUEUE = os.environ.get("SIGNUP_QUEUE", "emails")
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")
KEY = re.compile(r"^[!-~]{1,100}$")  # printable ASCII; Orbit allows 128 with our prefix


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    # One client (one connection pool) for the whole process; ORBIT_URL, ORBIT_KEY and
    # ORBIT_NAMESPACE come from the environment.
    async with OrbitClient() as orbit:
        app.state.orbit = orbit
        yield


async def signup(request: Request) -> JSONResponse:
    try:
        body = await request.json()
    except ValueError:
        return JSONResponse({"error": "body must be JSON"}, 400)
    email, name = body.get("email"), body.get("name", "")
    if not isinstance(email, str) or not EMAIL.match(email) or not isinstance(name, str):
        return JSONResponse({"error": "email (and optional name) required"}, 400)
    key = request.headers.get("idempotency-key")
    if key is not None and not KEY.match(key):
        return JSONResponse({"error": "Idempotency-Key: 1-100 printable ASCII characters"}, 400)

    orbit: OrbitClient = request.app.state.orbit
    try:
        task = await orbit.tasks.submit(
            QUEUE,
            "send_welcome",
            {"email": email.lower(), "name": name},
            dedup_key=f"welcome:{email.lower()}",
            idempotency_key=f"signup:{key}" if key else None,
        )
    except IdempotencyMismatch:
        return JSONResponse({"error": "this Idempotency-Key was used for another signup"}, 422)
    except (QuotaExceeded, RateLimited) as exc:
        retry = str(int(exc.retry_after or 1))
        return JSONResponse({"error": "busy, retry later"}, 429, {"Retry-After": retry})
    except InvalidRequest as exc:
        return JSONResponse({"error": exc.message}, 400)
    except OrbitConnectionError:
        # The outcome is unknown (maybe committed): the client retries with the same key.
        return JSONResponse({"error": "task service unavailable, retry"}, 503)
    return JSONResponse(
        {"task_id": task.id, "state": task.state, "deduplicated": task.deduplicated}, 202
    )


async def signup_status(request: Request) -> JSONResponse:
    orbit: OrbitClient = request.app.state.orbit
    task = await orbit.tasks.get(request.path_params["task_id"])
    return JSONResponse({"task_id": task.id, "state": task.state, "attempts": task.attempts})


app = Starlette(
    routes=[
        Route("/signups", signup, methods=["POST"]),
        Route("/signups/{task_id}", signup_status, methods=["GET"]),
    ],
    lifespan=lifespan,
)
