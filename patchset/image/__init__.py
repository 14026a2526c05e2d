"""Patched image builds: definitions (`builds/*.toml`), the build itself, the in-image runtime."""
