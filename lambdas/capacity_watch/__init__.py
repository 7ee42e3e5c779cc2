"""Scheduled: how long the stack's groups have lacked the capacity they asked for."""
