"""Use cases over ports: deploy, rollback, unload, reconcile, status."""
