from patchset.cli.main import main

raise SystemExit(main())
