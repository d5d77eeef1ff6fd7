from compressor.cli import main  # a light module: a Ctrl-C while the command imports is caught in main

raise SystemExit(main())
