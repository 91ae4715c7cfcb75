from tfx_transformer.quickstart import main

raise SystemExit(main())
