from compressor.cli import main

raise SystemExit(main())
