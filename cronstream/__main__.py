import sys

from cronstream.cli import main

sys.exit(main())
