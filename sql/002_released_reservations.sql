-- Reservations the reconciler gave back, so a flush still on its way cannot
-- commit them afterwards (flush_batch answers them "X").
--
-- A reservation is named by its request id and the moment Redis reserved it:
-- the client's retry of the same request id is a new reservation and buys.
CREATE TABLE IF NOT EXISTS released_reservations (
    request_id      text NOT NULL,
    reserved_at_ms  bigint NOT NULL,
    released_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (request_id, reserved_at_ms)
);
