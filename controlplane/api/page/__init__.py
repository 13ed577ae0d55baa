"""The status page at ``/``: HTML rendered here from :mod:`controlplane.services.overview`,
refreshed in place by one script the daemon serves itself; nothing is loaded from elsewhere."""
