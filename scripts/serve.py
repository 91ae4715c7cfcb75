from tfx_transformer.serving.command import main

raise SystemExit(main())
