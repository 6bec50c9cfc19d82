"""Front ends: the command line, the pytest plugin, GPU workers, and the sanitizer cross-check.
Nothing below this layer imports from it."""
