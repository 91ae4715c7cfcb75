from vision.commands.detect import main

raise SystemExit(main())
