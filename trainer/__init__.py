"""ftfleet's trainer: a checkpoint core that any PyTorch loop can use, and a reference
training program built on it (``torchrun ... -m ftfleet.trainer --config FILE``).

Importing this package imports nothing heavy: ``ftfleet ckpt`` must start fast and the
fleet code imports nothing from here. torch is imported by the modules that need it.
"""
