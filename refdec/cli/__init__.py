"""The ``refdec`` command line: ``refdec index|generate|edit`` (one module per command group)."""

from refdec.cli.main import main

__all__ = ["main"]
