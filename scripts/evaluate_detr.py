from vision.commands.evaluate import main

raise SystemExit(main())
