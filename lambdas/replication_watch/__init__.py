"""replication_watch: the newest committed checkpoint in the primary bucket against the
replica; replication lag and replica completeness as metrics."""
