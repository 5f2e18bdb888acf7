-- Per-sku deduction strategy and the optimistic strategy's row version.
-- Idempotent: every statement may run again on a database that has it.

-- The sku's own strategy (gateway.domain.model.Strategy); NULL sells it under the
-- gateway's GATEWAY_STRATEGY. The gateway checks the value before writing it.
ALTER TABLE inventory ADD COLUMN IF NOT EXISTS strategy text;

-- Bumped by every optimistic deduction; one whose version no longer matches
-- lost a race and retries. Other writers serialize on the row lock instead,
-- and every writer keeps the stock >= guard, so a stale version can never
-- oversell, only retry.
ALTER TABLE inventory ADD COLUMN IF NOT EXISTS version bigint NOT NULL DEFAULT 0;
