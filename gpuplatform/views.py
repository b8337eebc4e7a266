from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for load balancers and `make run`: the web process answers and reaches the DB."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """The API answers unknown paths in its own error shape; the rest gets Django's page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "not found", "errors": {}}, status=404)
    return defaults.page_not_found(request, exception)
