-- A waiting room's bot check (gateway/usecases/admission.py): a join needs a
-- bot token its provider vouches for. Idempotent: every statement may run again.
ALTER TABLE inventory ADD COLUMN IF NOT EXISTS room_bot_check boolean NOT NULL DEFAULT false;
