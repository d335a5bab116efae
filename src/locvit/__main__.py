import sys

from locvit.cli import main

sys.exit(main())
