-- Rate-limit token buckets of the strategies that decide in PostgreSQL alone
-- (sql-direct, optimistic, pessimistic; issue 19), taken by sale_gate()
-- (sql/functions/sale_gate.sql). reserve-batch and queue keep theirs in Redis.
-- Idempotent: every statement may run again on a database that has it.
--
-- bucket: 'u:<user_id>' or 'c:<client address>'; tokens saved up at `at`;
-- expires_at: when a bucket left alone is full again, and so the same as no
-- row (the reconciler deletes the rows past it).
CREATE TABLE IF NOT EXISTS rate_buckets (
    sku        text             NOT NULL,
    bucket     text             NOT NULL,
    tokens     double precision NOT NULL,
    at         timestamptz      NOT NULL,
    expires_at timestamptz      NOT NULL,
    PRIMARY KEY (sku, bucket)
);
CREATE INDEX IF NOT EXISTS rate_buckets_expires_at ON rate_buckets (expires_at);
