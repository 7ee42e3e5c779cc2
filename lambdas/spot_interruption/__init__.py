"""spot_interruption: counts EC2 spot interruption warnings and rebalance recommendations
of the stack's nodes, tags the node, and keeps the interruption-rate prior."""
