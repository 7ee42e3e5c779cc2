import sys

from ftfleet.trainer.drill.cli import main

sys.exit(main())
