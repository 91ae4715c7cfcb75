from nlp.commands.train import main

raise SystemExit(main())
