from patchset.cli.main import entry

entry()
