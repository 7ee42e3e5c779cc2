"""unhealthy_node: replaces nodes whose trainer stopped making progress, at a bounded rate."""
