"""``manage.py qcluster``: django-q2's own command, with what start-up loaded frozen before the
cluster forks its sentinel, pusher, monitor and workers.

Each of them is a fork of this process. Pages they share stay shared only while nobody writes
to them, and the cyclic garbage collector writes to every object it walks: after a few full
collections each process held its own copy of most of Django. ``gpuplatform.gctune.settle``
moves what is loaded to the permanent generation first, which collections never walk, so the
processes keep sharing it (their proportional memory, PSS, falls: ``bench/bench_idle.py``).
``GPUPLATFORM_STOCK=gc`` starts the cluster with the interpreter's defaults instead.
"""

from __future__ import annotations

from django.conf import settings
from django_q.management.commands.qcluster import Command as DjangoQCommand

from gpuplatform import gctune


class Command(DjangoQCommand):
    def handle(self, *args, **options):
        if "gc" not in settings.GPUPLATFORM_STOCK:
            gctune.settle()
        return super().handle(*args, **options)
