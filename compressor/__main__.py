from compressor.cli.commands import main

raise SystemExit(main())
