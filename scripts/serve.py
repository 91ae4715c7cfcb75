from tfx_transformer.commands.serve import main

raise SystemExit(main())
