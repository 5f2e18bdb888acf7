-- What bounds the tables that traffic writes (issue 33): the reconciler's pass
-- deletes releases older than GATEWAY_RELEASE_RETENTION_S
-- (gateway/postgres/retention.py), by this index rather than a scan.
-- Idempotent: every statement may run again on a database that has it.
CREATE INDEX IF NOT EXISTS released_reservations_released_at
    ON released_reservations (released_at);
