"""Django's ASGI handler, with each HTTP request's Django work done in one hop to a thread.

Django's own ``ASGIHandler`` runs the middleware chain in async mode. Our middleware and views
are synchronous, so there each sync middleware hook, the view and the request signals cost a
round trip between the event loop and a thread, and each request gets a thread of its own.
Here the event loop reads the body and sends the answer, as Django's handler does, and one call
in a pool of DB_POOL_SIZE threads does everything in between as a WSGI server would, ending
with ``response.close()`` (``request_finished``), so the database connection goes back to the
pool in the thread that borrowed it. Requests beyond the pool wait for a thread holding no
connection. (asgiref's ``WsgiToAsgi`` never closes the response, so it would never give the
connection back.) ``GPUPLATFORM_STOCK=asgi`` serves with Django's handler instead.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers import asgi, base
from django.db import close_old_connections
from django.http import FileResponse
from django.urls import set_script_prefix

# Threads when the connection pool is off (DB_POOL_SIZE=0): the pool's default size.
THREADS_WITHOUT_POOL = 8


class ASGIHandler(asgi.ASGIHandler):
    def __init__(self) -> None:
        base.BaseHandler.__init__(self)
        self.load_middleware(is_async=False)
        self.executor = ThreadPoolExecutor(
            max_workers=settings.DB_POOL_SIZE or THREADS_WITHOUT_POOL,
            thread_name_prefix="django-http",
        )

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            call = functools.partial(contextvars.copy_context().run, self.respond, scope, body_file)
            response = await asyncio.get_running_loop().run_in_executor(self.executor, call)
            if not response.streaming:
                await self.send_response(response, send)
                return
            # A streamed answer (a file, a log) is sent as Django's own handler sends it, in a
            # thread of its own, which then closes it.
            async with ThreadSensitiveContext():
                try:
                    await self.send_response(response, send)
                finally:
                    await sync_to_async(response.close)()
        finally:
            body_file.close()

    def respond(self, scope, body_file):
        """In a pool thread: everything from ``request_started`` to the finished answer."""
        set_script_prefix(asgi.get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self.get_response(request)
        response._handler_class = self.__class__
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size  # the ASGI server chunks it again
        if response.streaming:
            # Its content is read on the event loop's side; the database connections this
            # thread borrowed go back now (what request_finished would do).
            close_old_connections()
        else:
            response.close()
        return response
