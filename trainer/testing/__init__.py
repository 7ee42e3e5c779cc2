"""Test doubles that ship with the package because drills use them at run time."""
