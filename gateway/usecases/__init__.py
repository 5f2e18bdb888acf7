"""The use cases: a purchase, admin changes, waiting-room admission, tracking,
reconciliation, and the in-process knowledge they share (catalog, sold-out marks).

Each is handed the adapters it works with by ``gateway.app``; they call the
write path, the strategies and the Redis and PostgreSQL adapters, never the
HTTP edge, and report to the metrics through observer protocols of their own.
"""
