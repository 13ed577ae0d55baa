"""Adapters: each implements a port and owns every call to its library."""
