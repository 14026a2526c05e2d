"""`patchset check` (release check): filled in by the release-check work."""

from __future__ import annotations

import argparse


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    del sub
