from vision.commands.train import main

raise SystemExit(main())
