"""The standard-library-only kernel: exactly the code that ships into images.

Nothing here imports outside the standard library and this folder, so an image's own Python
can run it (the layering test in tests/test_layers.py holds that).
"""
