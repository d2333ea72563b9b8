"""Log records about one-time work (an ONNX export, a model conversion, a model load) carry ``extra=STATUS``, so a
front end can show them while hiding other INFO records: the ``routerag`` CLI prints them without ``-v``, so a
command that spends seconds on such work the first time says what it is doing instead of staying silent."""

from __future__ import annotations

#: The record attribute a front end filters on, and the ``extra`` that sets it.
STATUS_ATTR = "status"
STATUS = {STATUS_ATTR: True}
