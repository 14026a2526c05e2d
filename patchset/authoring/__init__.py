"""Authoring patches: reading what people already have (diffs with a preamble, mails from
`git format-patch`, an edited vLLM tree, whole-file overlays) into the registry's form.

`patchset.add` writes new patch folders; the modules here turn each kind of input into a
diff payload and its description, and `update` replaces an existing patch's payload.
"""
