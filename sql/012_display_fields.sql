-- What the waiting-room page shows of a sku: its display fields (issue 34).
-- Idempotent: every statement may run again on a database that has it.
--
-- A table of their own, not columns of inventory: every flush rewrites the
-- sku's inventory row, and PostgreSQL writes a whole new version of a row on
-- each UPDATE, so up to a few hundred bytes of text there would be copied
-- (and logged) with every flush of the sale's hottest row, for fields that an
-- admin change alone writes. Read once per sku by each instance's catalog
-- (a LEFT JOIN on the key), so the join costs nothing per purchase.
-- A sku without display fields has no row; a row whose fields are all NULL is
-- deleted (gateway.postgres.inventory). Bounds and characters are checked by
-- the admin API (gateway.http.payloads), the image's origin too (against
-- GATEWAY_WAITING_PAGE_IMAGE_ORIGINS, a setting the database does not know).
CREATE TABLE IF NOT EXISTS sku_display (
    sku text PRIMARY KEY REFERENCES inventory (sku) ON DELETE CASCADE,
    title text,
    image_url text,
    price_text text
);
