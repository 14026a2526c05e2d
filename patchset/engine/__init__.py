"""The apply engine.

`hunks` and `sites` are standard-library only on purpose: the same code runs inside the
patched image (see `patchset.image.runtime`), where only Python's standard library exists.
"""
