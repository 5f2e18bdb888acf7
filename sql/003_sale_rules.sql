-- A sku's sale window and its own rate limits (issue 13).
-- Idempotent: every statement may run again on a database that has it.
--
-- starts_at/ends_at: the window (NULL: open on that side); the gateway refuses
-- ends_at <= starts_at before writing. user_rate/client_rate: "N/s:burst" or
-- "off"; NULL keeps the instance's GATEWAY_USER_RATE / GATEWAY_CLIENT_RATE.
ALTER TABLE inventory ADD COLUMN IF NOT EXISTS starts_at timestamptz;
ALTER TABLE inventory ADD COLUMN IF NOT EXISTS ends_at timestamptz;
ALTER TABLE inventory ADD COLUMN IF NOT EXISTS user_rate text;
ALTER TABLE inventory ADD COLUMN IF NOT EXISTS client_rate text;
