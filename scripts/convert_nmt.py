from nlp.commands.convert import main

raise SystemExit(main())
