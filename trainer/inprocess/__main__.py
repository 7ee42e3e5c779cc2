import sys

from ftfleet.trainer.inprocess.launch import main

sys.exit(main())
