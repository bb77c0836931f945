"""Staff REST API for workers: the registration JSON in and out (never the upstream key)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from workers.models import Worker
from workers.selectors import worker_document, worker_get
from workers.services import worker_delete, worker_register


def _drf_error(exc: ValidationError) -> serializers.ValidationError:
    if hasattr(exc, "error_dict"):
        return serializers.ValidationError({k: [m for e in v for m in e.messages] for k, v in exc.error_dict.items()})
    return serializers.ValidationError({"__all__": exc.messages})


def _register(data: Any, actor: object) -> tuple[Worker, bool]:
    try:
        return worker_register(data=data, actor=actor, via="api")
    except ValidationError as exc:
        raise _drf_error(exc) from None


class WorkerListApi(APIView):
    """GET: every worker. POST: create or update one from its registration JSON (201 created, 200 updated)."""

    def get(self, request: Request) -> Response:
        workers = Worker.objects.order_by("worker_id")
        return Response({"data": [worker_document(worker=w) for w in workers]})

    def post(self, request: Request) -> Response:
        worker, created = _register(request.data, request.user)
        return Response(
            worker_document(worker=worker), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )


class WorkerDetailApi(APIView):
    """GET, PUT (the whole registration document) and DELETE one worker."""

    def _get(self, worker_id: str) -> Worker:
        worker = worker_get(worker_id=worker_id)
        if worker is None:
            raise NotFound(f"no worker {worker_id!r}")
        return worker

    def get(self, request: Request, worker_id: str) -> Response:
        return Response(worker_document(worker=self._get(worker_id)))

    def put(self, request: Request, worker_id: str) -> Response:
        self._get(worker_id)
        data = request.data
        if not isinstance(data, dict):
            raise serializers.ValidationError({"__all__": ["a worker registration must be a JSON object"]})
        if data.get("worker_id", worker_id) != worker_id:
            raise serializers.ValidationError({"worker_id": ["does not match the URL"]})
        worker, _ = _register({**data, "worker_id": worker_id}, request.user)
        return Response(worker_document(worker=worker))

    def delete(self, request: Request, worker_id: str) -> Response:
        worker_delete(worker=self._get(worker_id), actor=request.user, via="api")
        return Response(status=status.HTTP_204_NO_CONTENT)
