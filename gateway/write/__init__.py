"""The write path: reserved purchases batched per sku, each batch flushed to
PostgreSQL under the sku's lock and settled in Redis, and the queue strategy's
writers, which commit the sku streams the same way.

It calls the Redis and PostgreSQL adapters and the lock package only.
"""
