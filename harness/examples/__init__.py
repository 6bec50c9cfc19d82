"""Worked examples of the plugin API (docs/plugins.md) and of harness.sanitizer (docs/sanitizer.md)."""
