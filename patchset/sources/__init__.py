"""Release sources: the package index (default), a folder, a git clone, a Docker image."""
