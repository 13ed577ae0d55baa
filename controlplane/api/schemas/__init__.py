"""What crosses the API, one module per thing it describes.

Bodies in: ``requests`` (deploy, rollback, unload, and what they say about waiting) and
``alerts`` (Alertmanager's webhook). JSON out, rendered from domain values by ``*_json``
functions: ``operation``, ``model`` (a model's view, its slots, rollbacks and overload
verdict), ``alerts`` (an alert received), ``memory`` (the swap audit) and ``health`` (the
background jobs and the store's notifications, as ``/healthz`` shows them). ``envelopes``
holds the pydantic models that only document the answers in the OpenAPI document (the routes
render with the ``*_json`` functions; the API fuzzer checks that the two agree). ``names`` is
the documented rule for model and release names; ``timestamps`` how a moment is written.
"""
