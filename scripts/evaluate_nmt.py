from nlp.commands.evaluate import main

raise SystemExit(main())
