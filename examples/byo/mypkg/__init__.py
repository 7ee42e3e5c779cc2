"""A user's model, dataset, loss and optimizer, in a package that knows nothing of
ftfleet: the trainer config names them (examples/byo/config.yaml)."""
