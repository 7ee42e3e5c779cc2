import sys

from trainer.drill.cli import main

sys.exit(main())
