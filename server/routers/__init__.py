"""The routes, one module per group, each thin: parse the request, ask :class:`server.service.Service` (held on
``app.state.service``) for the work, shape the answer. ``create_app`` includes them in the order they are listed in
``ROUTERS`` of :mod:`server.app`."""
