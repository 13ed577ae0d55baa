"""``python -m controlplane`` is the ``controlplane`` command."""

from controlplane.cli.main import main

main()
