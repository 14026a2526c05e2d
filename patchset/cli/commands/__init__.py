"""One module per `patchset` command; each exposes `add_parser(subparsers)` and `run(args)`."""
