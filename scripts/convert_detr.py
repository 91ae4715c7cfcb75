from vision.commands.convert import main

raise SystemExit(main())
