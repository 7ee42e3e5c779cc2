from ftfleet.trainer.__main__ import exit_quickly
from ftfleet.trainer.inprocess.launch import main

exit_quickly(main())
