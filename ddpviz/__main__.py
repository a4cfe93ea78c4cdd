from ddpviz.cli import main

raise SystemExit(main())
