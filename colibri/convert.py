"""Alias of colibri.model.convert, kept for the documented Python path
`from colibri.convert import ColibriExporter` (docs/PYTHON.md). New code
imports colibri.model.convert."""
from colibri.model.convert import ColibriExporter  # noqa: F401

__all__ = ["ColibriExporter"]
