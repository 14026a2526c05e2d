"""The command line: a thin layer that parses, calls the library and prints."""
