"""One small wrapper per outside system: HTTP (`net`), git (`gitrepo`), the Docker engine
(`dockerengine`). Everything else calls these."""
