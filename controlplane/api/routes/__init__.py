"""The API's routes, one router per thing they serve; ``api/app.py`` includes them in order.

``probes`` (liveness, readiness, metrics), ``models`` (what each model serves, Triton's
memory), ``operations`` (deploy, rollback, unload, and the operations they leave),
``fleet`` (the fleet's state and the wake its members send each other), ``alerts``
(Alertmanager's webhook, the alerts received, and the runbook's reload). Routes stay thin:
parse, call a service, render (``api/schemas``). What they share is in ``api/deps.py``.
"""
