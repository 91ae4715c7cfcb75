from nlp.commands.translate import main

raise SystemExit(main())
