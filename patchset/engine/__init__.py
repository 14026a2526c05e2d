"""The apply engine on the host: `evaluate` (a dry run of one patch on a tree), `apply` (apply and
revert with outcomes and exit codes) and `transaction` (lock, journal, atomic commit, recovery).

It places hunks and sites with `patchset.kernel`, the same code the images run.
"""
