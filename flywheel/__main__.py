import sys

from flywheel.cli import main

sys.exit(main())
