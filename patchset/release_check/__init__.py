"""The release check: which patches a vLLM release still needs, from the release's own code.

`verdicts` decides one verdict per (release, patch); the package-level `patchset.check` is the
function `verdicts.check`. `moves` finds where a missing target file went (check and refresh).
"""
