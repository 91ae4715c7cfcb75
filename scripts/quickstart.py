from tfx_transformer.commands.quickstart import main

raise SystemExit(main())
