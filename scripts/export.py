from tfx_transformer.commands.export import main

raise SystemExit(main())
