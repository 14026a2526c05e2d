"""The in-image runtime: standard library only, copied into every patched image."""
