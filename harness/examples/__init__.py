"""Worked examples of the plugin API (see README, "Plugins")."""
