"""What a user writes: scenario files (TOML loading and validation) and plugin names resolved to
callables (`package.module:callable`)."""
