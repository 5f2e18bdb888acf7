-- A sku's optional waiting room (see gateway/usecases/admission.py): NULL admit_per_s
-- means none. Idempotent: every statement may run again.
ALTER TABLE inventory ADD COLUMN IF NOT EXISTS room_admit_per_s integer
    CHECK (room_admit_per_s IS NULL OR room_admit_per_s >= 1);
ALTER TABLE inventory ADD COLUMN IF NOT EXISTS room_token_ttl_s integer
    CHECK (room_token_ttl_s IS NULL OR room_token_ttl_s >= 1);
ALTER TABLE inventory ADD COLUMN IF NOT EXISTS room_shuffle_at_start boolean NOT NULL DEFAULT false;
-- When the sale starts (the sale-window work reads it too, under the same
-- name): a room admits nobody before, and shuffles its early arrivals once at
-- that moment when asked to.
ALTER TABLE inventory ADD COLUMN IF NOT EXISTS starts_at timestamptz;
