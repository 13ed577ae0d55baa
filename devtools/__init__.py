"""Development tools: the bundled Triton launcher and `make run`, never shipped in the wheel.

`controlplane` (the daemon and the CLI) must not import anything here (an import-linter
contract in `.importlinter`); `[tool.setuptools.packages.find]` leaves this package out of the
wheel. The tests, the benchmarks and `make run` import it from the checkout's root.
"""
