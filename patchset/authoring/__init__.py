"""Authoring patches: reading what people already have (diffs with a preamble, mails from
`git format-patch`, an edited vLLM tree, whole-file overlays) into the registry's form.

`payload` turns a request (a tree, overlays, a diff, a pull request) into a diff payload,
its origin and notes; `diff` reads a diff into the registry's form; `add` writes new patch
folders; `update` replaces an existing patch's payload.
"""
