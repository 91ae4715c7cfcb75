from tfx_transformer.formats import main

raise SystemExit(main())
